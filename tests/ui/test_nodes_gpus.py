"""The nodes page over the stand-in `amdsmi` (an MI300X in CPX/NPS4 and an MI250X card's two GCDs): each
GPU's power, or whose power covers it, its temperatures, ECC, throttling, xGMI traffic and the processes
on it."""

from __future__ import annotations

import json
import os

import pytest

from tests.telemetry.test_backends import FAKES
from tests.telemetry.test_generations import GCD0, GCD1, MI300X
from tests.ui.conftest import shot
from tests.utils.servers import ROOT
from tunedeck.telemetry import NO_LIBRARY, NONE_FOUND


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
    server.api.get("/api/nodes")  # a first reading: the page's then has an xGMI rate
    page.goto(server.url + "/nodes")
    rows = page.locator("tr[data-gpu]")
    rows.first.wait_for()
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
    # xGMI read / write rates in human units (the stand-in's table clock: 1 s a reading), totals beside;
    # an MI250X's metrics table has no xGMI counters: "–".
    assert mi300x.locator(".xgmi").inner_text().startswith("7.0 MiB/s / 3.5 MiB/s (")
    assert gcd0.locator(".xgmi").inner_text() == "–"
    assert errors == []


@pytest.mark.parametrize("devices", [None, []], ids=["no-library", "no-gpus"])
def test_a_node_without_gpus_says_so_in_a_sentence(server_factory, strict_page, tmp_path, devices):
    # A CPU host: the libraries' exceptions (pyrsmi's ROCMLError, pynvml's) are its normal state, not
    # an error to show; the API keeps them for scripts.
    env = {"TUNEDECK_NODES_CACHE_S": "0"}
    if devices is not None:  # the stand-in pynvml: the library loads and reports no device
        trace = tmp_path / "trace.json"
        trace.write_text(json.dumps({"devices": devices}))
        env |= {"PYTHONPATH": os.pathsep.join([str(FAKES / "nvml"), str(ROOT / "backend")])}
        env |= {"TUNEDECK_FAKE_SMI_TRACE": str(trace)}
    server = server_factory(**env)
    (node,) = server.api.get("/api/nodes").json()
    assert node["backend"] == "cpu" and "pyrsmi" in node["reason"]
    want = NO_LIBRARY if devices is None else NONE_FOUND
    assert node["summary"] == want
    page = strict_page
    for width in (1440, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(server.url + "/nodes")
        card = page.locator("#nodes .card")
        card.wait_for()
        text = card.inner_text()
        assert want in text, text
        for word in ("pyrsmi", "pynvml", "Error", "rocm", "libamd_smi", "Traceback"):
            assert word not in text, (word, text)
        assert page.locator("#nodes .notice").count() == 0
    shot(page, f"nodes-no-gpus-{'library' if devices is None else 'devices'}-phone")
