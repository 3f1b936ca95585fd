"""Project-level promises: documented settings, the compose file, a light server."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.utils.servers import ROOT, free_port
from tests.utils.wait import until
from tunedeck.config import Settings


def test_every_setting_is_documented_once_and_nothing_else_is():
    page = (ROOT / "docs" / "settings.md").read_text()
    rows = re.findall(r"^\| `(TUNEDECK_[A-Z_]+)` \|", page, re.M)
    for name, field in Settings.model_fields.items():
        assert field.description, name
        assert f"TUNEDECK_{name.upper()}" in rows, (
            f"docs/settings.md does not document TUNEDECK_{name.upper()}"
        )
    assert len(rows) == len(set(rows)), "a setting is listed twice"
    assert set(rows) - {f"TUNEDECK_{n.upper()}" for n in Settings.model_fields} == set(), "no such setting"


def compose_env(value: str) -> str:
    """Compose's `${NAME:-default}` with nothing set in the environment: the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_file_is_pinned_and_private():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    svc = compose["services"]["tunedeck"]
    assert {"/dev/kfd", "/dev/dri"} <= set(svc["devices"])
    assert {"video", "render"} <= set(svc["group_add"])
    assert "tunedeck-workspace" in compose["volumes"]
    base = re.search(r"^FROM (\S+)", svc["build"]["dockerfile_inline"], re.MULTILINE).group(1)
    for image in (base, svc["image"]):
        _, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{image} is not pinned to a version"
    env = svc["environment"]
    mounts = dict(v.split(":")[::-1] for v in (compose_env(v) for v in svc["volumes"]))
    assert mounts["/workspace"] == "tunedeck-workspace" and env["TUNEDECK_WORKSPACE"] == "/workspace"
    assert (
        env["HF_HOME"].startswith("/models/") and "/models" in mounts
    )  # the model cache outlives the container
    assert "/models" in json.loads(env["TUNEDECK_ALLOWED_ROOTS"])
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tunedeck-workspace", "test-output", "models"} <= set(ignored)
    assert "/api/health" in " ".join(svc["healthcheck"]["test"])


def test_compose_command_starts_a_closed_server(tmp_path):
    """No Docker engine here: the service's command line runs with its environment, its volumes
    mapped to folders of the test."""
    svc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["tunedeck"]
    mounts = {}
    for i, v in enumerate(svc["volumes"]):
        target = compose_env(v).split(":")[1]
        mounts[target] = str(tmp_path / f"volume-{i}")
    port = str(free_port())

    def local(value: str) -> str:
        value = compose_env(str(value))
        for target in sorted(mounts, key=len, reverse=True):
            value = value.replace(target, mounts[target])
        return value

    env = {k: local(v) for k, v in svc["environment"].items()}
    env["TUNEDECK_PORT"] = port
    command = [local(a) for a in svc["command"]]
    command[command.index("--port") + 1] = port
    assert command[0] == "tunedeck"
    argv = [sys.executable, "-m", "tunedeck.cli.main", *command[1:]]
    token_file = Path(env["TUNEDECK_ADMIN_TOKEN_FILE"])
    url = f"http://127.0.0.1:{port}"

    def start(log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/api/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            until(healthy, "/api/health from the compose command")
        except AssertionError:
            proc.kill()
            raise
        return proc

    def stop(proc: subprocess.Popen) -> None:
        proc.terminate()
        proc.wait(timeout=30)

    proc = start(tmp_path / "first.log")
    try:
        api = httpx.Client(base_url=url, timeout=30, headers={"X-Tunedeck": "1"})
        assert api.get("/api/jobs").status_code == 401
        assert api.post("/api/jobs", json={"name": "x", "config": {}}).status_code == 401
        admin = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert api.get("/api/jobs", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    finally:
        stop(proc)
    first = (tmp_path / "first.log").read_text()
    assert str(token_file) in first and admin not in first  # where to read it, never the token itself

    proc = start(tmp_path / "second.log")  # a restart keeps the same admin token and says nothing new
    try:
        assert httpx.get(f"{url}/api/jobs", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    finally:
        stop(proc)
    assert token_file.read_text().strip() == admin
    assert str(token_file) not in (tmp_path / "second.log").read_text()


def test_server_never_imports_training_packages():
    code = (
        "import sys, tunedeck.main, tunedeck.cli.main, tunedeck.scheduling.scheduler;"
        "from tunedeck.main import create_app; create_app();"
        # ray too: the default (local) executor must run without the `.[ray]` extra
        "bad = [m for m in ('torch', 'transformers', 'llamafactory', 'deepspeed', 'ray') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def lint_paths() -> list[str]:
    """The tree ruff checks: the Makefile's LINT_PATHS (`make lint` and the pre-commit hooks use it)."""
    return re.search(r"^LINT_PATHS = (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()


def test_the_tree_is_linted_and_formatted():
    """The lint step: one formatter over the whole tree, and the checks of pyproject's [tool.ruff.lint]."""
    paths = lint_paths()
    assert {"backend", "trainer", "tests"} <= set(paths)
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", *paths], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout[-3000:]


def test_the_listed_packages_type_check():
    """The lint step's type check: mypy over pyproject's [tool.mypy] `files`, the one list of what is
    checked (widened as packages come clean, never narrowed). Its cache sits in test-output/, so a
    run after the first checks only what changed."""
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert mypy.returncode == 0, (mypy.stdout + mypy.stderr)[-6000:]


def test_the_type_checked_list_is_never_narrowed():
    """Issue 24: the list only grows. Today it holds all the Python but the tests."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"backend/tunedeck", "trainer/tunedeck_train", "scripts", "bench"} <= set(files)
    assert all((ROOT / f).exists() for f in files), files


def test_make_lint_and_pre_commit_run_the_lint_step():
    """`make lint` and the pre-commit hooks run what the two tests above run, from the venv."""
    paths = " ".join(lint_paths())
    want = [f"-m ruff check {paths}", f"-m ruff format --check {paths}", "-m mypy"]
    make = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert [line.split("/bin/python ", 1)[1] for line in make.split("\n") if line] == [
        w.replace(paths, "$(LINT_PATHS)") for w in want
    ]
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert [h["entry"] for h in hooks] == [f".venv/bin/python {w}" for w in want]
    assert all(h["language"] == "system" and h["pass_filenames"] is False for h in hooks)
