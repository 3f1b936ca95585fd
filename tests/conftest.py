"""Shared fixtures: one tiny model for the whole run, real servers on free ports (the harness they
build on is tests/utils/servers.py, which the benchmarks share)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.utils.servers import PYTHON, Server

pytest_plugins = ["tests.utils.browser"]  # one Playwright session for every module that drives pages


@pytest.fixture(scope="session", autouse=True)
def torch_extensions(tmp_path_factory) -> Path:
    """The folder where DeepSpeed's JIT ops (the CPU comm op of every DeepSpeed run here) are built
    for this run, not the user's ~/.cache: a lock a killed build left there must not decide the
    run. Beside the shared assets where those are kept (built once), else new. Set before any
    server, runner or cluster starts, so every one of them inherits it."""
    kept = os.environ.get("TUNEDECK_TEST_ASSETS")
    folder = Path(kept) / "torch_extensions" if kept else tmp_path_factory.mktemp("torch_extensions")
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """The demo model, tokenizer and datasets, built once (no hub) and shared by every test."""
    cache = Path(os.environ.get("TUNEDECK_TEST_ASSETS", tmp_path_factory.mktemp("assets")))
    subprocess.run(
        [PYTHON, "-m", "tunedeck_train.demo", "build", "--workspace", str(cache)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return cache


@pytest.fixture
def app_factory(tmp_path, assets):
    """Like server_factory, with the app in this process (tests/utils/app.py): for API behaviour."""
    from tests.utils.app import App

    apps: list[App] = []

    def make(**env: str) -> App:
        apps.append(App(tmp_path / "ws", assets, **env).start())
        return apps[-1]

    yield make
    for a in apps:
        a.stop()


@pytest.fixture
def server_factory(tmp_path, assets):
    servers: list[Server] = []

    def make(**env: str) -> Server:
        s = Server(tmp_path / "ws", assets, **env)
        servers.append(s)
        return s.start()

    yield make
    for s in servers:
        s.stop()
    # Whatever a failed test left behind must not keep running into the next one.
    runs = tmp_path / "ws" / "runs"
    if runs.exists():
        from tunedeck.procs import kill_job

        for run_dir in runs.iterdir():
            kill_job(str(run_dir))
