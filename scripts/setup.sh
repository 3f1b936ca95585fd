#!/usr/bin/env bash
# Creates the project's virtual environment with the server and the training stack.
#
#   scripts/setup.sh          server + training stack (what `make demo` needs)
#   scripts/setup.sh dev      the same plus the test tools and a browser for the UI tests
#
# The one rule: a torch that is already installed (a ROCm or CUDA build) is kept. The venv then
# sees it through --system-site-packages and every pip call is pinned to its version, so pip can
# never swap a ROCm torch for a CUDA wheel. With no torch, a lean CPU stack is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TUNEDECK_VENV:-.venv}
WANT=${1:-}
stamp="$VENV/.tunedeck-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)${WANT:+-$WANT}"
if [ -f "$stamp" ]; then exit 0; fi
start=$(date +%s)

host_torch=$($PY - <<'PYEOF' 2>/dev/null || true
import torch
kind = "rocm" if getattr(torch.version, "hip", None) else ("cuda" if torch.version.cuda else "cpu")
print(torch.__version__, kind)
PYEOF
)
if [ ! -x "$VENV/bin/python" ]; then
  if [ -n "$host_torch" ]; then $PY -m venv --system-site-packages "$VENV"; else $PY -m venv "$VENV"; fi
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null
constraints="$VENV/constraints.txt"
# Predict jobs score generations with BLEU/ROUGE: LLaMA-Factory imports these for it (its `metrics` extra).
metrics=("jieba>=0.42" "nltk>=3.8" "rouge-chinese>=1.0.3")

if [ -n "$host_torch" ]; then
  read -r version kind <<<"$host_torch"
  echo "keeping the installed torch $version ($kind)"
  echo "torch==$version" >"$constraints"
  "${pip[@]}" install -c "$constraints" "llamafactory==0.9.5"
  DS_BUILD_OPS=0 "${pip[@]}" install -c "$constraints" "deepspeed==0.19.8"
  "${pip[@]}" install -c "$constraints" "${metrics[@]}"
  case "$kind" in
    rocm) "${pip[@]}" install -c "$constraints" -e ".[rocm]" ;;
    cuda) "${pip[@]}" install -c "$constraints" -e ".[nvidia]" ;;
    *) "${pip[@]}" install -c "$constraints" -e . ;;
  esac
else
  echo "no torch on this machine: installing the CPU stack"
  echo "torch==2.13.0" >"$constraints"
  "${pip[@]}" install torch==2.13.0
  "${pip[@]}" install -c "$constraints" transformers==5.6.0 datasets==4.0.0 accelerate==1.11.0 \
    peft==0.18.1 trl==0.24.0 omegaconf==2.4.0 matplotlib==3.11.2
  # llamafactory's own requirements would pull torchvision and a CUDA torch: take it alone.
  "${pip[@]}" install --no-deps llamafactory==0.9.5
  # Its mm_plugin imports torchaudio at module level; PyPI has no CPU torchaudio for torch 2.13.
  if ! "$VENV/bin/python" -c "import torchaudio" 2>/dev/null; then
    "${pip[@]}" install ./packaging/torchaudio-placeholder
  fi
  DS_BUILD_OPS=0 "${pip[@]}" install -c "$constraints" deepspeed==0.19.8
  "${pip[@]}" install -c "$constraints" "${metrics[@]}"
  "${pip[@]}" install -c "$constraints" -e .
fi

if [ "$WANT" = "dev" ]; then
  # The tests run a two-node Ray cluster on this machine: the ray extra comes with the test tools.
  "${pip[@]}" install -c "$constraints" -e ".[dev,ray]"
  if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
    echo "installing Debian's chromium for the browser tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: chromium could not be installed; browser tests will be skipped"
  fi
  # tests/slurm run a two-node Slurm cluster on this machine (tests/slurm/conftest.py): Debian's
  # slurm-wlm and munge, installed only as root (the daemons run as root there).
  if ! command -v slurmctld >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's slurm-wlm and munge for the Slurm tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurm-wlm munge >/dev/null) || echo "warning: Slurm could not be installed; Slurm tests will be skipped"
  fi
fi
# The pages' chart library: plotly.js's basic bundle, a quarter of the full one to download and compile.
# Offline the server serves the plotly package's full bundle instead, and setup goes on.
"$VENV/bin/python" scripts/fetch_js.py \
  || echo "warning: plotly.js's basic bundle not fetched; the pages load plotly's full bundle (4.8 MB)"
"$VENV/bin/python" - <<'PYEOF'
import sys, torch
print(f"torch {torch.__version__} (hip={torch.version.hip}, cuda={torch.version.cuda}) in {sys.prefix}")
PYEOF
rm -f "$VENV"/.tunedeck-setup-*
touch "$stamp"
echo "setup done in $(( $(date +%s) - start ))s; venv size $(du -sh "$VENV" | cut -f1)"
