"""Concurrent preflight refreshes share one probe (each probe imports torch: seconds of CPU).

The training python is a stand-in at the hardware boundary: a script that notes each start in a
file, holds until the test releases it, then answers as a ROCm node would."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.preflight.test_preflight import ROCM_BOX
from tests.utils.standin import release_fifo
from tests.utils.wait import until
from tunedeck.checks.preflight import MARK


def counting_python(tmp_path):
    # The stand-in probe blocks reading the FIFO `release` until the test writes to it (120 s at most).
    starts, release, path = tmp_path / "starts", tmp_path / "release", tmp_path / "counting-python"
    os.mkfifo(release)
    path.write_text(f"""#!/bin/sh
echo "$$" >> {starts}
timeout 120 head -c 1 {release} > /dev/null
cat <<'EOF'
{MARK}{json.dumps(ROCM_BOX)}
EOF
""")
    path.chmod(0o755)
    return path, starts, release


def test_concurrent_refreshes_share_one_probe(server_factory, tmp_path):
    python, starts, release = counting_python(tmp_path)
    server = server_factory(
        TUNEDECK_TRAIN_PYTHON=str(python), TUNEDECK_GPU_SLOTS="0", TUNEDECK_PREFLIGHT_REFRESH_MIN_S="600"
    )

    def refresh() -> dict:
        with httpx.Client(base_url=server.url, timeout=180) as c:
            r = c.get("/api/nodes/local/preflight", params={"refresh": "true"})
            assert r.status_code == 200, r.text
            return r.json()

    with ThreadPoolExecutor(4) as pool:
        asked = [pool.submit(refresh) for _ in range(4)]
        until(starts.exists, "a probe started", interval=0.05)
        release_fifo(release)
        results = [f.result() for f in asked]
    assert len(starts.read_text().splitlines()) == 1
    assert (
        len({r["checked_at"] for r in results}) == 1 and results[0]["summary"] == "ROCm 6.2.41133: 2× gfx942"
    )
    # A refresh right after it (a page reloaded in a loop) gets the same probe's answer.
    assert refresh()["checked_at"] == results[0]["checked_at"]
    assert len(starts.read_text().splitlines()) == 1
