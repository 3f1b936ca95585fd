"""The nodes page over the stand-in `amdsmi` (an MI300X in CPX/NPS4 and an MI250X card's two GCDs): each
GPU's power, or whose power covers it, its temperatures, ECC, throttling and the processes on it."""

from __future__ import annotations

import json
import os

from tests.telemetry.test_backends import FAKES
from tests.telemetry.test_generations import GCD0, GCD1, MI300X
from tests.ui.conftest import shot
from tests.utils.servers import ROOT


def test_the_nodes_page_says_who_is_on_each_gpu_and_how_it_runs(server_factory, strict_page, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"devices": [MI300X, GCD0, GCD1]}))
    server = server_factory(
        PYTHONPATH=os.pathsep.join([str(FAKES), str(ROOT / "backend")]),
        TUNEDECK_FAKE_SMI_TRACE=str(trace),
        TUNEDECK_NODES_CACHE_S="0",
    )
    page = strict_page
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/nodes")
    rows = page.locator("tr[data-gpu]")
    rows.first.wait_for(timeout=60_000)
    shot(page, "nodes-gpus")
    mi300x, gcd0, gcd1 = (rows.nth(i) for i in range(3))
    assert "junction 84°C" in mi300x.locator(".temps").inner_text()
    assert "edge" not in mi300x.locator(".temps").inner_text()  # MI300X: no edge sensor
    assert mi300x.locator(".power").inner_text() == "655 W"
    assert "CPX/NPS4" in mi300x.inner_text()
    assert "pt_main_thread (pid 4242, 30.0 GiB)" in mi300x.locator(".procs").inner_text()
    assert gcd0.locator(".power").inner_text() == "412 W"
    assert gcd1.locator(".power").inner_text() == "shared with GPU 1"  # never summed, never dropped
    assert "edge 45°C" in gcd0.locator(".temps").inner_text()
    assert errors == []
