#!/usr/bin/env bash
# One check of tunedeck on a real GPU, in under 10 minutes: install, then the tiny demo model on one
# GPU at 1 Hz and 10 Hz memory sampling, printing the memory curve against LLaMA-Factory's
# RECORD_VRAM peaks, the estimate against the measured peak, and the sampler's CPU cost.
#
#   scripts/gpu_check.sh [--steps N] [--rates 1,0.1] [--workspace DIR]   on an NVIDIA or AMD machine
#   scripts/gpu_check.sh --cpu                                           the same plumbing on the CPU
#
# It installs with scripts/setup.sh into $TUNEDECK_VENV (default .venv), which keeps the machine's
# torch. GPU_CHECK_PYTHON=/path/to/python skips the install and uses that environment as it is (it
# needs tunedeck and llamafactory). Offline machines: PIP_NO_INDEX=1 PIP_FIND_LINKS=<wheel folder>
# reach setup.sh's pip. Exits 2 when there is no GPU, 1 when a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cpu=""
for arg in "$@"; do [ "$arg" = "--cpu" ] && cpu=1; done

die() { echo "gpu_check: $*" >&2; exit 2; }

if [ -z "$cpu" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "NVIDIA: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
  elif [ -e /dev/kfd ] && { command -v amd-smi >/dev/null || command -v rocm-smi >/dev/null; }; then
    echo "AMD: $( (amd-smi static --asic 2>/dev/null || rocm-smi --showproductname 2>/dev/null) | grep -m1 -iE 'market|card series' || echo 'ROCm device')"
  else
    die "no GPU here: nvidia-smi lists none and there is no /dev/kfd with amd-smi or rocm-smi. Use --cpu to check the plumbing on the CPU."
  fi
fi

py=${GPU_CHECK_PYTHON:-}
if [ -z "$py" ]; then
  venv=${TUNEDECK_VENV:-.venv}
  TUNEDECK_VENV="$venv" scripts/setup.sh || die "scripts/setup.sh failed (offline? see the header of this script)"
  py="$venv/bin/python"
fi
"$py" -c "import tunedeck, llamafactory" 2>/dev/null \
  || die "$py lacks tunedeck or llamafactory: run scripts/setup.sh, or point GPU_CHECK_PYTHON at a complete environment"

if [ -z "$cpu" ]; then
  "$py" - <<'PYEOF' || die "the torch of $py cannot use the GPU (a CPU or wrong-vendor build?); setup.sh keeps the machine's torch only when the python that runs it has one"
import torch
print(f"torch {torch.__version__} (hip={torch.version.hip}, cuda={torch.version.cuda})")
assert torch.cuda.is_available() and torch.cuda.device_count() > 0
print(f"device 0: {torch.cuda.get_device_name(0)}")
PYEOF
fi

# The report runs the server and trainers from this environment; the whole script must end in 10 minutes.
export PYTHONUNBUFFERED=1
exec timeout --kill-after=10 540 "$py" scripts/gpu_check.py "$@"
