"""A run's files for download: one file confined to the output folder, or a set of them as one
archive written while it streams (no temporary copy of a multi-gigabyte adapter or checkpoint)."""

from __future__ import annotations

import os
import re
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from tunedeck.services.errors import NotFound
from tunedeck.store.tables import Job

CHUNK = 1 << 20
# The files of a saved adapter (PEFT) and its tokenizer, as the Trainer writes them to the output root.
ADAPTER = re.compile(
    r"^(adapter_config\.json|adapter_model\.(safetensors|bin)|tokenizer.*|special_tokens_map\.json|"
    r"added_tokens\.json|vocab\.json|merges\.txt|chat_template\.jinja|README\.md)$"
)


def _root(job: Job) -> Path | None:
    """The job's output folder, resolved, where it is a folder that resolves inside its run folder:
    an output folder that is a link to elsewhere (another job's, /etc) is none."""
    if not job.output_dir or not job.run_dir:
        return None
    try:
        root, run = Path(job.output_dir).resolve(), Path(job.run_dir).resolve()
    except (OSError, RuntimeError):  # a loop of links
        return None
    return root if root.is_relative_to(run) and root.is_dir() else None


def output_root(job: Job) -> Path:
    if (root := _root(job)) is None:
        raise NotFound(f"job {job.id} has no output folder")
    return root


def _inside(root: Path, path: Path) -> Path | None:
    """The real file `path` names where it is one inside `root` (resolved), whatever links lead there."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError):  # a loop of links, a NUL byte
        return None
    return real if real.is_relative_to(root) and real.is_file() else None


def _walk(root: Path, folder: Path) -> Iterator[tuple[Path, Path]]:
    """(path under `folder`, its real file) for each file inside `root`; links to folders are not
    followed and links that leave `root` are left out."""
    for at, dirs, names in os.walk(folder):
        dirs.sort()
        for n in sorted(names):
            if (real := _inside(root, Path(at) / n)) is not None:
                yield Path(at, n).relative_to(folder), real


def listing(job: Job, *, limit: int) -> list[dict]:
    """The files of the job's output folder, at most `limit`, sorted: only what resolves inside it."""
    root = _root(job)
    files: list[dict] = []
    for rel, real in _walk(root, root) if root is not None else ():
        try:
            files.append({"path": str(rel), "bytes": real.stat().st_size})
        except OSError:  # gone meanwhile
            continue
        if len(files) >= limit:  # a folder of shards must not become a megabyte answer
            break
    return sorted(files, key=lambda f: f["path"])


def one_file(job: Job, path: str) -> Path:
    """The file at `path` inside the job's output folder; nothing outside it, whatever the path or links say."""
    root = output_root(job)
    if "\x00" in path or (target := _inside(root, root / path)) is None:
        raise NotFound(f"job {job.id} has no file {path!r}")
    return target


def members(job: Job, what: str) -> tuple[str, list[tuple[str, Path]]]:
    """(archive base name, [(name inside, real file)]) for `adapter`, `output` or one `checkpoint-N`."""
    root = output_root(job)
    if what == "adapter":
        found = [
            (Path(p.name), real) for p in sorted(root.iterdir()) if (real := _inside(root, p)) is not None
        ]
        files = [(rel, real) for rel, real in found if ADAPTER.match(rel.name)]
        if not any(rel.name.startswith("adapter_model.") for rel, _ in files):
            raise NotFound(f"job {job.id} has saved no adapter (yet)")
    else:
        folder = root if what == "output" else (root / what).resolve()
        if not folder.is_relative_to(root) or not folder.is_dir():
            raise NotFound(f"job {job.id} has no {what}")
        files = list(_walk(root, folder))
    base = f"job{job.id}-{what}"
    return base, [(f"{base}/{rel}", real) for rel, real in sorted(files)]


class _Sink:
    """A write-only file object whose bytes the generator takes as they come."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.n = 0

    def write(self, b: bytes) -> int:
        self.parts.append(bytes(b))
        self.n += len(b)
        return len(b)

    def tell(self) -> int:
        return self.n

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass  # nothing to let go: the generator has taken the bytes

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def zip_stream(files: list[tuple[str, Path]]) -> Iterator[bytes]:
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, path in files:
            info = zipfile.ZipInfo.from_file(path, name)
            with zf.open(info, "w", force_zip64=True) as dest:
                for chunk in _chunks(path):
                    dest.write(chunk)
                    yield sink.take()
            yield sink.take()
    yield sink.take()


def tar_stream(files: list[tuple[str, Path]]) -> Iterator[bytes]:
    """A POSIX tar written by hand: header, the file's bytes as read, padding (tarfile would buffer)."""
    for name, path in files:
        st = path.stat()
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode)
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        sent = 0
        for chunk in _chunks(path):
            chunk = chunk[: max(0, st.st_size - sent)]  # a file growing meanwhile keeps its header's size
            sent += len(chunk)
            yield chunk
        if sent < st.st_size:  # it shrank: the header's size still holds the archive together
            yield bytes(st.st_size - sent)
        if st.st_size % tarfile.BLOCKSIZE:
            yield bytes(tarfile.BLOCKSIZE - st.st_size % tarfile.BLOCKSIZE)
    yield bytes(tarfile.BLOCKSIZE * 2)
