"""The collective check a multi-node job runs before training (tunedeck_train/lf_train.py), under a
real torchrun with two gloo ranks: both meet and the all-reduce's bus bandwidth is logged; a rank
that does not come within the timeout fails the job at once, naming it, instead of waiting out
`ddp_timeout`."""

from __future__ import annotations

import re
import subprocess
import textwrap

from tests.utils.servers import ROOT
from tests.utils.torchrun import two_ranks

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from tunedeck_train.lf_train import collective_check
    if os.environ["RANK"] == "1" and os.environ.get("LATE_S"):
        time.sleep(float(os.environ["LATE_S"]))  # a rank stuck before the collective (loading, a bad node)
    print(collective_check(None), flush=True)
""")


def torchrun(tmp_path, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    return two_ranks(script, {"PYTHONPATH": str(ROOT / "trainer"), "TUNEDECK_COLLECTIVE_MB": "4", **env})


def test_two_ranks_meet_and_the_bus_bandwidth_is_logged(tmp_path):
    r = torchrun(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("tunedeck collective check")][:1]
    assert re.fullmatch(
        r"tunedeck collective check: all-reduce over 2 ranks on 1 node\(s\) \(gloo, 4 MiB\): "
        r"\d+\.\d\d GB/s bus bandwidth, \d+\.\d ms per round",
        line,
    ), line


def test_a_rank_that_never_comes_fails_the_job_naming_it(tmp_path):
    r = torchrun(tmp_path, LATE_S="600", TUNEDECK_COLLECTIVE_TIMEOUT_S="5")
    assert r.returncode != 0
    # Both ranks are torchrun's on this one node (LOCAL_WORLD_SIZE 2): node_rank 0.
    assert "tunedeck collective check: rank(s) 1 (node_rank 0) did not join within 5 s" in r.stderr, r.stderr[
        -3000:
    ]
