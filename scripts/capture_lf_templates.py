#!/usr/bin/env python
"""Capture the chat template names LLaMA-Factory defines, for the form's choices and the lint.

Run with the *training* environment's python (the one LLaMA-Factory is installed in)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/capture_lf_templates.py [--output PATH]

It reads the keys of ``llamafactory.data.template.TEMPLATES`` (filled by ``register_template`` at
import) and rewrites ``templates`` and ``llamafactory_version`` in
``backend/tunedeck/data/llamafactory_templates.json``. The file's ``model_types`` and
``architectures`` maps (config.json → the template a model needs) are kept by hand: LLaMA-Factory
keys its own map by hub model name, which a local folder does not carry.
"""

from __future__ import annotations

import argparse
import json
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "backend" / "tunedeck" / "data" / "llamafactory_templates.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    from llamafactory.data.template import TEMPLATES

    data = json.loads(args.output.read_text()) if args.output.exists() else {}
    data["llamafactory_version"] = metadata.version("llamafactory")
    data["templates"] = sorted(TEMPLATES)
    data.setdefault("model_types", {})
    data.setdefault("architectures", {})
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(TEMPLATES)} templates from LLaMA-Factory {data['llamafactory_version']} -> {args.output}")


if __name__ == "__main__":
    main()
