"""Project-level promises: documented settings, the compose file, a light server."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.conftest import ROOT
from tunedeck.config import Settings


def test_every_setting_is_documented():
    readme = (ROOT / "README.md").read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, name
        assert f"TUNEDECK_{name.upper()}" in readme, f"README does not document TUNEDECK_{name.upper()}"


def test_compose_runs_the_service_with_rocm_devices():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    svc = compose["services"]["tunedeck"]
    assert {"/dev/kfd", "/dev/dri"} <= set(svc["devices"])
    assert {"video", "render"} <= set(svc["group_add"])
    assert any(v.endswith(":/workspace") for v in svc["volumes"])
    assert svc["environment"]["TUNEDECK_WORKSPACE"] == "/workspace"
    assert "tunedeck-workspace" in compose["volumes"]


def test_server_never_imports_training_packages():
    code = ("import sys, tunedeck.main, tunedeck.cli, tunedeck.scheduler;"
            "from tunedeck.main import create_app; create_app();"
            "bad = [m for m in ('torch', 'transformers', 'llamafactory', 'deepspeed') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
