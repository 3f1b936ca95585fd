"""A build lock left by a killed op build (torch's FileBaton, `<build folder>/lock`) would hang every
later DeepSpeed job before its first step; the trainer's launcher removes the stale ones, and only
those (tunedeck_train/lf_train.py, clear_stale_build_locks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.utils.wait import until
from tunedeck_train.lf_train import clear_stale_build_locks


def lock_in(folder: Path, old: bool) -> Path:
    """A lock as a build takes it; `old`: dated 1970, far beyond STALE_BUILD_LOCK_S."""
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.touch()
    if old:
        os.utime(lock, (0, 0))
    return lock


def test_only_old_locks_with_no_build_working_in_their_folder_are_removed(tmp_path):
    old = True
    stale = lock_in(tmp_path / "deepspeed_shm_comm", old)  # the TORCH_EXTENSIONS_DIR layout
    stale_default = lock_in(tmp_path / "py311_cpu" / "cpu_adam", old)  # the default root's layout
    fresh = lock_in(tmp_path / "fused_adam", old=False)  # a build that has just begun
    building = lock_in(tmp_path / "py311_cpu" / "transformer_inference", old)
    # A long build: its compiler works in the build folder (torch runs ninja there).
    compiler = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=building.parent, stdin=subprocess.PIPE
    )
    try:
        until(
            lambda: Path(f"/proc/{compiler.pid}/cwd").resolve() == building.parent.resolve(),
            "the build's cwd",
        )
        removed = clear_stale_build_locks(str(tmp_path))
    finally:
        compiler.communicate(b"")
    assert sorted(removed) == sorted([str(stale), str(stale_default)])
    assert not stale.exists() and not stale_default.exists()
    assert fresh.exists() and building.exists()
    # Once that build is gone too, its lock is stale like the others.
    assert clear_stale_build_locks(str(tmp_path)) == [str(building)]


def test_an_empty_or_missing_root_is_nothing_to_do(tmp_path):
    assert clear_stale_build_locks(str(tmp_path)) == []
    assert clear_stale_build_locks(str(tmp_path / "absent")) == []
