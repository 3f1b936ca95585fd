"""The app in the test process behind a TestClient: API behaviour without starting a server process."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tests.utils.servers import Server
from tunedeck.checks import preflight
from tunedeck.config import Settings
from tunedeck.main import create_app

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork and warns when it falls back to httpx, which it still supports.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


class App:
    """`create_app` on its own workspace and SQLite file, lifespan included (migrations, writer, scheduler).

    It takes the same `TUNEDECK_*` variables as `Server` and offers the same helpers, so a test that is
    about the API swaps `server_factory` for `app_factory` and nothing else. Launches are held: no
    runner could reach an app that listens on no port.
    """

    submit, wait, all, explain = Server.submit, Server.wait, Server.all, Server.explain

    def __init__(self, workspace: Path, assets: Path, **env: str):
        self.workspace = workspace
        values = {
            "TUNEDECK_WORKSPACE": str(workspace),
            "TUNEDECK_ALLOWED_ROOTS": json.dumps([str(assets)]),
            "TUNEDECK_SCHEDULER_INTERVAL_S": "0.3",
            "TUNEDECK_LAUNCH_PAUSED": "true",
            **env,
        }
        with pytest.MonkeyPatch.context() as mp:  # read exactly as `tunedeck serve` reads its environment
            for key, value in values.items():
                mp.setenv(key, value)
            self.settings = Settings()
        if not self.settings.launch_paused:
            raise ValueError("an App cannot run jobs (runners talk HTTP to a port): use server_factory")
        self.app = create_app(self.settings)
        # The address and header every client of ours uses (the network guard refuses others).
        self.api = TestClient(self.app, base_url="http://127.0.0.1", headers={"X-Tunedeck": "1"})

    def start(self) -> App:
        # A fresh server process has no preflight cached; this process may have one from an earlier test.
        preflight._cache.clear()
        self.api.__enter__()
        return self

    def stop(self) -> None:
        self.api.__exit__(None, None, None)

    @property
    def engine(self):
        return self.app.state.engine
