"""A plain (non-editable) install works: the wheel carries the pages, presets and migrations, and a
server started from it, with this checkout off its path, serves them and migrates its database."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sysconfig
from pathlib import Path

import pytest
from sqlalchemy import inspect

from tests.utils.servers import PYTHON, ROOT, Server
from tunedeck.store.db import make_engine, upgrade

PACKAGE = ROOT / "backend" / "tunedeck"
TRAINER = ROOT / "trainer" / "tunedeck_train"
SHIPPED = ("frontend", "configs", "migrations")


def test_pyproject_lists_every_package_of_the_tree():
    """The wheel's packages are listed by hand (the shipped folders map onto tunedeck.*): the list
    must name each folder of Python or shipped files, and nothing that is not there."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        "tunedeck_train": TRAINER,
        **{name: ROOT / path for name, path in tool["package-dir"].items()},
    }
    found = set()
    for name, path in folders.items():
        found |= {
            ".".join((name, *d.relative_to(path).parts))
            for d in [path, *path.rglob("*")]
            if d.is_dir() and "__pycache__" not in d.parts and any(f.is_file() for f in d.iterdir())
        }
    assert set(tool["packages"]) == found


def _run(cmd: list, env: dict) -> str:
    r = subprocess.run(
        [str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel built from this checkout, installed into a fresh venv; its python and package folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # Built from a copy: the checkout gets no build/ or egg-info, and stray caches stay out.
    src = tmp / "src"
    for package in (PACKAGE, TRAINER):
        shutil.copytree(
            package, src / package.parent.name / package.name, ignore=shutil.ignore_patterns("__pycache__")
        )
    for folder in SHIPPED:  # top-level folders that pyproject maps into the package
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    _run(
        [
            PYTHON,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            tmp / "dist",
            src,
        ],
        env,
    )
    (wheel,) = (tmp / "dist").glob("tunedeck-*.whl")
    venv = tmp / "venv"
    _run([PYTHON, "-m", "venv", "--without-pip", venv], env)
    python = venv / "bin" / "python"
    _run([PYTHON, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel], env)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-c", purelib], env).strip())
    # The server's dependencies come from this environment, added after the install so pip never
    # sees the editable tunedeck. A plain path line does not run that folder's own .pth files, so
    # the editable install's pointer to the checkout stays off the new venv's path.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return {"venv": venv, "python": python, "package": site / "tunedeck", "site": site, "env": env}


def test_wheel_ships_every_page_preset_and_migration(installed):
    for folder in SHIPPED:
        assert _files(ROOT / folder), folder
        assert _files(installed["package"] / folder) == _files(ROOT / folder), folder


def test_wheel_ships_the_trainer_script_and_the_runner_finds_it_without_importing_it(installed):
    assert _files(installed["site"] / TRAINER.name) == _files(TRAINER)
    code = (
        "import sys; from tunedeck.runner.main import TRAIN_SCRIPT; print(TRAIN_SCRIPT);"
        "print([m for m in ('tunedeck_train.lf_train', 'transformers', 'llamafactory') if m in sys.modules])"
    )
    script, loaded = _run([installed["python"], "-c", code], installed["env"]).splitlines()
    assert Path(script) == installed["site"] / TRAINER.name / "lf_train.py"
    assert loaded == "[]"


def test_server_from_the_wheel_serves_pages_presets_and_migrates(installed, tmp_path):
    where = _run([installed["python"], "-c", "import tunedeck; print(tunedeck.__file__)"], installed["env"])
    assert Path(where.strip()).parent == installed["package"]
    server = Server(tmp_path / "ws", tmp_path)
    server.env = {**{k: v for k, v in server.env.items() if k != "PYTHONPATH"}, "TUNEDECK_HOST": "127.0.0.1"}
    # The installed console script, with its own python: nothing from the checkout is imported.
    server.command = [str(installed["venv"] / "bin" / "tunedeck"), "serve"]
    server.start()
    try:
        r = server.api.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
        assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', r.text)
        assert any(a.endswith(".js") for a in assets), r.text
        for path in assets:
            got = server.api.get(path)
            assert got.status_code == 200, path
            assert got.content == (ROOT / "frontend" / path.removeprefix("/static/")).read_bytes(), path

        presets = {p["name"] for p in server.api.get("/api/presets").json()}
        assert presets == {
            p.stem for p in (ROOT / "configs").iterdir() if p.suffix in (".yaml", ".yml", ".json")
        }
        demo = server.api.get("/api/presets/demo_cpu").json()["text"]
        assert demo == (ROOT / "configs" / "demo_cpu.yaml").read_text()

        reference = make_engine(tmp_path / "reference.db")
        upgrade(reference)
        want = set(inspect(reference).get_table_names())
        with sqlite3.connect(tmp_path / "ws" / "tunedeck.db") as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            (version,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
        assert want <= tables, want - tables
        with reference.connect() as c:
            assert version == c.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    finally:
        server.stop()
