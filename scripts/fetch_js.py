"""Fetches plotly.js's basic bundle (scatter and bar traces: every chart the pages draw) for the server.

    python scripts/fetch_js.py [--dest FILE] [--tarball FILE]

The pages then evaluate 1.2 MB of JavaScript instead of the 4.8 MB full bundle that the `plotly`
package ships (the server's fallback when this file is missing). The npm tarball is checked against
a pinned sha512 before anything is read from it, and only its one regular file is written: no other
member, link or path from the archive reaches the disk. Standard library only: setup runs it before
anything else could be trusted. Exits 1 with a message when offline or on any mismatch.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import io
import os
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

URL = "https://registry.npmjs.org/plotly.js-basic-dist-min/-/plotly.js-basic-dist-min-4.1.1.tgz"
# The registry's `dist.integrity` for that version: the same plotly.js as the Python package's.
INTEGRITY = "sha512-1oNF8PeQx2hv/y7tqEVWKD3JGwn/MGEMQ8mL9HUwsaqG9FGy/OU5FHUHvzqbqxN4mnwZGI9abTiE775C4kkjMQ=="
MEMBER = "package/plotly-basic.min.js"
MAX_BYTES = 50 * 2**20  # the tarball is 0.4 MB; a bigger answer is not it


class Refused(Exception):
    pass


def default_dest() -> Path:
    """Inside the pages' folder the server imports (a checkout's top-level frontend/, or an installed
    wheel's tunedeck/frontend)."""
    spec = importlib.util.find_spec("tunedeck.frontend") if importlib.util.find_spec("tunedeck") else None
    if spec and spec.submodule_search_locations:
        pages = Path(next(iter(spec.submodule_search_locations)))
    else:
        pages = Path(__file__).resolve().parents[1] / "frontend"
    return pages / "vendor" / "plotly-basic.min.js"


def check(data: bytes, integrity: str) -> None:
    algo, _, want = integrity.partition("-")
    if algo != "sha512":
        raise Refused(f"integrity {integrity!r}: only sha512 is accepted")
    got = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != want:
        raise Refused(f"integrity mismatch: expected sha512-{want}, got sha512-{got}")


def extract(data: bytes, dest: Path) -> int:
    """Writes MEMBER's bytes to dest (atomically); returns their size."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            info = tar.getmember(MEMBER)
        except KeyError:
            raise Refused(f"{MEMBER} is not in the tarball") from None
        if not info.isreg():
            raise Refused(f"{MEMBER} is not a regular file in the tarball")
        member = tar.extractfile(info)
        if member is None:
            raise Refused(f"{MEMBER} cannot be read from the tarball")
        body = member.read()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".fetch-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
    return len(body)


def download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        data = r.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise Refused(f"{url} answered more than {MAX_BYTES} bytes")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=None, help="where to write the bundle")
    ap.add_argument("--url", default=URL)
    ap.add_argument("--tarball", type=Path, help="a local copy of the tarball instead of downloading it")
    ap.add_argument("--integrity", default=INTEGRITY, help="the tarball's expected sha512 (npm's format)")
    args = ap.parse_args(argv)
    dest = args.dest or default_dest()
    try:
        data = args.tarball.read_bytes() if args.tarball else download(args.url)
        check(data, args.integrity)
        size = extract(data, dest)
    except (Refused, OSError, tarfile.TarError) as e:
        print(f"fetch_js: not installed: {e}", file=sys.stderr)
        return 1
    print(f"fetch_js: plotly.js basic bundle ({size:,} bytes) -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
