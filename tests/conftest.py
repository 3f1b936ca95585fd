"""Shared fixtures: one tiny model for the whole run, real servers on free ports (the harness they
build on is tests/utils/servers.py, which the benchmarks share), and how the run is split over
pytest-xdist's workers (DEVELOPERS.md, "The parallel run")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.utils.servers import PYTHON, Server

pytest_plugins = ["tests.utils.browser"]  # one Playwright session for every module that drives pages


# The parallel run (`-n 2`, DEVELOPERS.md "The parallel run"). Each test module is a group, sent
# whole to one worker: its tests run in file order and its module-scoped fixtures (a server, a run)
# are built once. tests/ray and tests/slurm are one group together: each session cluster is started
# once, by one worker, the test that removes a node stays last in its folder, and the two clusters'
# multi-node jobs never train at the same time (their waits were sized for a run of their own).
CLUSTERS = ("tests/ray/", "tests/slurm/")


def _group(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return "clusters" if module.startswith(CLUSTERS) else module


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; a hook of xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's per-module scheduling, with the cluster folders as one group. (Its `loadgroup` marks do
    not reach the scheduler under pytest 9.2, whose test ids xdist 3.8 cannot rename.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    config.option.loadscopereorder = False  # the order pytest_collection_modifyitems gives
    return Groups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a parallel run, the longest work first: the clusters, then the modules that hold a real
    fine-tune (`slow`), then the rest in file order, so that the run ends on short modules and both
    workers finish together (xdist hands out the groups in this order)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process (`-n 0`): file order
    rank: dict[str, int] = {}
    for item in items:
        group = _group(item.nodeid)
        first = 0 if group == "clusters" else 1 if item.get_closest_marker("slow") else 2
        rank[group] = min(rank.get(group, first), first)
    items.sort(key=lambda item: rank[_group(item.nodeid)])  # stable: file order within a rank


def _run_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this run that every xdist worker shares (beside the workers' own base folders),
    else this session's own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / name
        folder.mkdir(exist_ok=True)
        return folder
    return tmp_path_factory.mktemp(name)


# DeepSpeed's CPU comm op, which every DeepSpeed run on the CPU loads (torch builds it on first use).
BUILD_OP = "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()"


def _claim(marker: Path) -> bool:
    try:
        marker.mkdir()
    except FileExistsError:
        return False
    return True


@pytest.fixture(scope="session", autouse=True)
def torch_extensions(tmp_path_factory):
    """The folder where DeepSpeed's JIT ops (the CPU comm op of every DeepSpeed run here) are built
    for this run, not the user's ~/.cache: a lock a killed build left there must not decide the
    run. Beside the shared assets where those are kept (built once), else new, shared by the run's
    workers: an op is built once, under torch's lock in its folder, and the others wait and load it.
    Set before any server, runner or cluster starts, so every one of them inherits it.

    In a parallel run, the comm op's build starts here, in the background, once (the first worker): it
    takes a minute of both cores, and minutes on a loaded machine, which the first DeepSpeed test
    would otherwise spend inside its own wait for a first step. A job that comes before the build
    ends waits on the build's lock, as it would on another job's build."""
    kept = os.environ.get("TUNEDECK_TEST_ASSETS")
    folder = Path(kept) / "torch_extensions" if kept else _run_folder(tmp_path_factory, "torch_extensions")
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    build = None
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # in one process the first DeepSpeed test builds it
    if run and _claim(folder / f".build-{run}"):  # the first worker of this run to come
        build = subprocess.Popen(
            [PYTHON, "-c", BUILD_OP],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    yield folder
    if build is not None and build.poll() is None:
        build.kill()  # only when the run ended before the build did
    if build is not None:
        build.wait()


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """The demo model, tokenizer and datasets, built once (no hub) and shared by every test: by every
    worker of a parallel run too (the build takes a lock in the folder, and the others find it built)."""
    kept = os.environ.get("TUNEDECK_TEST_ASSETS")
    cache = Path(kept) if kept else _run_folder(tmp_path_factory, "assets")
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
