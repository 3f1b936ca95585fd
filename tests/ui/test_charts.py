"""Charts that never mislead, read from the page as a person sees them: plotly's own layout ranges,
shapes and legend, the words of empty charts, hover text, and boxes that must not overlap. One
server (launches paused) holds imported runs, queued jobs and one job fed through its telemetry
route; every page is loaded once per screen size. Screenshots go to test-output/ui/."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.ui.conftest import shot
from tests.utils.servers import CONFIGS, Server, demo_config
from tunedeck.contract.lflog import METRICS

pytestmark = [pytest.mark.browser]
GIB = 1 << 30
LR = 2e-4
T0 = 1_700_000_000.0
TOTAL = 80 * GIB
SCREENS = {"wide": (1440, 900), "phone": (390, 844)}


def trainer_log(steps: int) -> str:
    rows = []
    for s in range(1, steps + 1):
        rows.append(
            {
                "current_steps": s,
                "total_steps": steps,
                "loss": round(2.5 * 0.93**s + 0.01 * (s % 3), 4),
                "lr": LR,
                "epoch": s / steps,
                "throughput": 1500.0 + 3 * s,
                "total_tokens": 512 * s,
                "grad_norm": 0.5 + 0.25 * (s % 4),
                "elapsed_time": f"0:00:{2 * s:02d}",
            }
        )
        if s % 10 == 0:
            rows.append({"current_steps": s, "total_steps": steps, "eval_loss": 1.9 - 0.05 * s})
    return "".join(json.dumps(r) + "\n" for r in rows)


def memory_csv(n: int) -> str:
    lines = ["t,gpu,used_bytes,total_bytes"]
    for i in range(n):
        for gpu in (0, 1):
            used = (40 + 5 * gpu + (20 if i in (10, 25, 40) else 0)) * GIB
            lines.append(f"{T0 + 2 * i},{gpu},{used},{TOTAL}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def deck(tmp_path_factory, assets):
    server = Server(tmp_path_factory.mktemp("charts") / "ws", assets, TUNEDECK_LAUNCH_PAUSED="true").start()
    api = server.api

    def imported(name: str, log: str, memory: str | None = None, output: str | None = None) -> dict:
        files = {"trainer_log": log.encode(), **({"memory": memory.encode()} if memory else {})}
        files.update({"log": output.encode()} if output else {})
        r = api.post("/api/runs/import", files=files, data={"name": name})
        assert r.status_code == 201, r.text
        return r.json()

    rich = imported("rich run", trainer_log(30), memory_csv(50))
    single = imported("one point", trainer_log(1))
    died = imported(
        "died at once",
        '{"current_steps": 0, "total_steps": 100}\n',
        output="torch.OutOfMemoryError: CUDA out of memory.\n",
    )
    ds = {}
    for stage in (2, 3):
        d = json.loads((CONFIGS / f"ds_z{stage}_rocm.json").read_text())
        d["fp16"]["enabled"] = False
        ds[stage] = d
    z2 = server.submit(
        {"name": "queued z2", "config": demo_config(assets, lr_scheduler_type="cosine"), "deepspeed": ds[2]}
    )
    z3 = server.submit(
        {"name": "queued z3", "config": demo_config(assets, lr_scheduler_type="linear"), "deepspeed": ds[3]}
    )
    telemetry = server.submit({"name": "telemetry", "config": demo_config(assets)})

    # A repeated spike as the alert engine stores one: first and newest occurrence, and how many.
    first, newest = T0 + 2 * 10, T0 + 2 * 40
    token = secrets.token_urlsafe(32)
    with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db, db:
        db.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t,"
            " last_t, count) VALUES (?, 'test_repeat', 'warning', 0, ?, NULL, 'used memory jumped by 20 GiB',"
            " NULL, 0, ?, ?, 3)",
            (rich["id"], newest, first, newest),
        )
        # Periodic spikes from the 2nd sample to the 48th: the whole run, so a marker, never a band.
        db.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t,"
            " last_t, count) VALUES (?, 'vram_periodic_spikes', 'warning', 1, ?, NULL, 'spikes every 8 s',"
            " NULL, 0, ?, ?, 12)",
            (rich["id"], T0 + 96, T0 + 4, T0 + 96),
        )
        # And a recurring loss spike, from step 5 to step 25 (an import's clock: T0 + elapsed).
        db.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t,"
            " last_t, count) VALUES (?, 'test_loss_repeat', 'warning', NULL, ?, 25, 'loss jumped', NULL, 0,"
            " ?, ?, 4)",
            (rich["id"], T0 + 50, T0 + 10, T0 + 50),
        )
        # The token a runner holds (the server hands it only to the runner): this test's own; and the
        # GPU its samples name (a runner reports only its job's devices).
        db.execute(
            "UPDATE jobs SET runner_token_hash = ?, gpus = 1 WHERE id = ?",
            (hashlib.sha256(token.encode()).hexdigest(), telemetry["id"]),
        )
    samples = {
        "line": list(range(6)),
        "t": [T0 + i for i in range(6)],
        "gpu": [0] * 6,
        "used_bytes": [(10 + i) * GIB for i in range(6)],
        "total_bytes": [TOTAL] * 6,
        "util": [90.0, 95.5, 97.0, 99.0, 98.0, 96.0],
        "temp_c": [55.0, 61.0, 66.0, 70.0, 71.0, 72.0],
        # cumulative xGMI bytes, a second apart: the driver reloads before the fifth sample
        "xgmi_read_bytes": [0, 2 * 10**9, 4 * 10**9, 7 * 10**9, 10**9, 3 * 10**9],
        "xgmi_write_bytes": [i * 10**9 for i in range(6)],
        "name": ["MI300X"] * 6,
    }
    r = api.post(
        f"/api/jobs/{telemetry['id']}/telemetry",
        json={"seq": 1, "memory": samples},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 200, r.text

    # Saved checkpoints, as LLaMA-Factory writes them into the output folder.
    out = Path(rich["output_dir"])
    for step in (10, 20):
        for f in ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json"):
            (out / f"checkpoint-{step}").mkdir(exist_ok=True)
            (out / f"checkpoint-{step}" / f).write_bytes(b"x" * 100)
    (out / "adapter_model.safetensors").write_bytes(b"x" * 300)
    server.ids = {
        "rich": rich["id"],
        "single": single["id"],
        "died": died["id"],
        "z2": z2["id"],
        "z3": z3["id"],
    }
    server.ids["telemetry"] = telemetry["id"]
    server.near_oom = api.get("/api/health").json()["near_oom_share"]
    server.first, server.newest = first, newest
    yield server
    server.stop()


def open_page(page, url: str, screen: str) -> None:
    page.set_viewport_size(dict(zip(("width", "height"), SCREENS[screen], strict=True)))
    console: list[str] = []

    def seen(m) -> None:
        # The favicon is another change's (the browser asks for it on its own): not this page's script.
        if m.type == "error" and not m.location.get("url", "").endswith("/favicon.ico"):
            console.append(f"{m.text} {m.location}")

    page.on("console", seen)
    page.console_errors = console
    page.goto(url)
    page.wait_for_function("window.tunedeckReady === true", timeout=120_000)


def plot(page, el: str, what: str):
    return page.evaluate(f"(() => {{ const gd = document.getElementById({el!r}); return {what}; }})()")


# The legend and x-axis title boxes of a chart, once its legend names every entry asked for; read in
# one go, so both come from the same drawing.
BOXES = """([id, names]) => {
  const legend = document.querySelector(`#${id} .legend`), title = document.querySelector(`#${id} .g-xtitle`);
  if (!legend || !title) return null;
  const shown = [...legend.querySelectorAll(".legendtext")].map((e) => e.textContent);
  if (!names.every((n) => shown.includes(n))) return null;
  const box = (e) => { const r = e.getBoundingClientRect(); return { x: r.x, y: r.y, width: r.width, height: r.height }; };
  return { legend: box(legend), title: box(title) };
}"""


def boxes_apart(page, chart: str, names: list[str]) -> None:
    """The legend and the x-axis title of a chart do not overlap (and both are on screen), read once the
    chart is drawn as it ends: its legend names `names` (a page redraws a chart when its alerts come,
    and they may come after its series)."""
    boxes = page.wait_for_function(BOXES, arg=[chart, names], timeout=120_000).json_value()
    legend, title = boxes["legend"], boxes["title"]
    assert legend["width"] and legend["height"] and title["width"] and title["height"], (chart, boxes)
    apart = (
        legend["x"] + legend["width"] <= title["x"]
        or title["x"] + title["width"] <= legend["x"]
        or legend["y"] + legend["height"] <= title["y"]
        or title["y"] + title["height"] <= legend["y"]
    )
    assert apart, (chart, legend, title)


# The job page's loss legend once the rich run's alerts are drawn on it (their markers come last).
LOSS_LEGEND = ["loss", "eval loss", "alerts"]


def compared_loss(ids: dict) -> list[str]:
    return [
        f"#{ids['rich']} rich run loss",
        f"#{ids['rich']} rich run eval loss",
        f"#{ids['single']} one point loss",
    ]


def compared_memory(ids: dict) -> list[str]:
    return [f"#{ids['rich']} rich run GPU 0", f"#{ids['rich']} rich run GPU 1"]


def hover_text(page, el: str, curve: int, point: int) -> str:
    # A label from an earlier hover can outlive a redraw: clear it, so the text read is this hover's.
    page.evaluate(f"Plotly.Fx.unhover({el!r})")
    page.wait_for_function(f"!document.querySelector('#{el} .hoverlayer').textContent")
    page.evaluate(f"Plotly.Fx.hover({el!r}, [{{curveNumber: {curve}, pointNumber: {point}}}])")
    page.wait_for_function(f"document.querySelector('#{el} .hoverlayer').textContent.length > 0")
    return page.locator(f"#{el} .hoverlayer").text_content()


def significant(text: str) -> list[int]:
    """Significant digits of each decimal number in a hover label."""
    return [len(m.replace(".", "").lstrip("0")) for m in re.findall(r"\d+\.\d+", text)]


def test_job_page_charts(deck, page):
    rich = deck.ids["rich"]
    open_page(page, f"{deck.url}/jobs/{rich}", "wide")
    # Alerts arrive after the charts: wait for them to be drawn.
    page.wait_for_function(
        "(document.getElementById('mem-chart').layout.shapes || []).some(s => s.name === 'test_repeat ×3')",
    )

    # A constant learning rate sits at its value on a narrow axis, not on a 0 ± 1 one.
    lo, hi = plot(page, "lr-chart", "gd.layout.yaxis.range")
    assert lo < LR < hi and hi - lo < LR
    assert plot(page, "lr-chart", "gd.data[0].y") == [LR] * 30
    # The loss axis holds every loss and eval loss point.
    lo, hi = plot(page, "loss-chart", "gd.layout.yaxis.range")
    ys = plot(page, "loss-chart", "[...gd.data[0].y, ...gd.data[2].y]")
    assert lo < min(ys) and max(ys) < hi and hi - lo < 2 * (max(ys) - min(ys))
    boxes_apart(page, "loss-chart", LOSS_LEGEND)

    # A repeated spike's span is shaded; periodic spikes are a marker at their newest (a band from the
    # first to the newest would shade the whole chart).
    shaded = plot(
        page, "mem-chart", "gd.layout.shapes.filter(s => s.type === 'rect' && s.name).map(s => s.name)"
    )
    assert "test_repeat ×3" in shaded and not [n for n in shaded if "periodic" in n], shaded
    marks = plot(page, "mem-chart", "gd.data.find(d => d.name === 'alerts').text")
    assert any(m.startswith("×12 · vram_periodic_spikes") for m in marks), marks

    # The near-OOM band is the alert's threshold of the device, named in the legend.
    band = plot(page, "mem-chart", "gd.layout.shapes.find(s => s.showlegend)")
    assert band["y0"] == pytest.approx(deck.near_oom * TOTAL / GIB)
    assert band["y1"] == pytest.approx(TOTAL / GIB)
    pct = round(100 * deck.near_oom)
    assert band["label"]["text"] == f"near-OOM ≥ {pct}%"
    assert f"near-OOM ≥ {pct}% (alert threshold)" in page.locator("#mem-chart .legend").text_content()
    assert page.locator("#mem-chart .layer-above, #mem-chart .shapelayer").count() >= 1
    lo, hi = plot(page, "mem-chart", "gd.layout.yaxis.range")
    assert lo == 0 and TOTAL / GIB <= hi < 1.2 * TOTAL / GIB

    # The repeated alert: its span from first to newest occurrence, and a marker at both ends (on the
    # step axis every chart starts on: the logged points put T0 + 2 s at step 1).
    span = plot(
        page,
        "mem-chart",
        "gd.layout.shapes.filter(s => s.name === 'test_repeat ×3' && s.type === 'rect').map(s => [s.type, s.x0, s.x1])",
    )
    at = [(deck.first - T0) / 2, (deck.newest - T0) / 2]
    assert span == [["rect", *(pytest.approx(x) for x in at)]]
    marks = plot(
        page,
        "mem-chart",
        "(() => { const a = gd.data.find(t => t.name === 'alerts');"
        " return a.x.map((x, i) => [x, a.text[i]]).filter(m => m[1].includes('test_repeat')); })()",
    )
    assert [m[0] for m in marks] == pytest.approx(at)
    assert marks[0][1].startswith("first of 3") and marks[1][1].startswith("newest of 3")

    # On the step axis too: the loss spike's span runs from its first step to its newest.
    span = plot(
        page,
        "loss-chart",
        "gd.layout.shapes.filter(s => s.name === 'test_loss_repeat ×4' && s.type === 'rect')",
    )
    assert [(s["type"], s["x0"], s["x1"]) for s in span] == [("rect", 5, 25)]

    # Hover labels: units, at most 4 significant digits, whole series names.
    text = hover_text(page, "mem-chart", 0, 3)
    assert "GPU 0 used" in text and "GiB" in text, text
    assert all(n <= 4 for n in significant(text)), text
    text = hover_text(page, "tp-chart", 0, 7)
    assert "tokens/s" in text and all(n <= 4 for n in significant(text)), text
    text = hover_text(page, "loss-chart", 1, 4)
    assert "loss (smoothed 0.33)" in text and all(n <= 4 for n in significant(text)), text

    # The summary of the run's end, and peak memory per GPU.
    summary = page.locator("#summary").inner_text()
    assert "last loss" in summary and "at step 30" in summary
    best = min(1.9 - 0.05 * s for s in (10, 20, 30))
    assert f"{best:.4g} at step 30" in summary
    assert "256 (last)" in summary  # tokens/s from the run's own steps: 512 tokens every 2 s
    assert "1m 38s" in summary  # an import's runtime: its own times, the memory CSV's 50 samples 2 s apart
    assert "peak GPU 0" in summary and "60.0 GiB of 80.0 GiB" in summary
    assert "peak GPU 1" in summary and "65.0 GiB of 80.0 GiB" in summary

    # Files: each checkpoint folded into one line; the final output apart.
    groups = page.locator("#files details")
    assert groups.count() == 3
    assert [groups.nth(i).get_attribute("data-group") for i in range(3)] == [
        "final",
        "checkpoint-10",
        "checkpoint-20",
    ]
    assert all(groups.nth(i).get_attribute("open") is None for i in range(3))
    assert "3 files" in groups.nth(1).locator("summary").inner_text()
    assert not page.locator("#files code", has_text="optimizer.pt").first.is_visible()
    if "grad_norm" in METRICS:  # stored: charted
        assert plot(page, "grad-chart", "gd.data[0].y") == [0.5 + 0.25 * (s % 4) for s in range(1, 31)]
    else:  # the store has no such column yet: no empty card either
        assert page.locator("#grad-card").is_hidden()
    assert page.locator("#gpu-card").is_hidden()  # nor utilisation
    shot(page, "charts-job-wide")
    assert page.errors == [] and page.console_errors == []


def test_one_point_and_empty_charts(deck, page):
    open_page(page, f"{deck.url}/jobs/{deck.ids['single']}", "wide")
    loss = plot(page, "loss-chart", "gd.data[0]")
    assert loss["mode"] == "markers" and loss["y"] == [pytest.approx(2.5 * 0.93 + 0.01)]
    lo, hi = plot(page, "loss-chart", "gd.layout.yaxis.range")
    assert lo < loss["y"][0] < hi
    lo, hi = plot(page, "lr-chart", "gd.layout.yaxis.range")
    assert lo < LR < hi and hi - lo < LR
    assert page.locator("#lr-chart .point").count() == 1  # drawn: a marker, not a line of one point
    # No memory CSV: words, not a 1970 axis.
    assert plot(page, "mem-chart", "gd.layout.annotations[0].text") == "This run logged no memory samples."
    assert page.locator("#mem-chart .xtick").count() == 0
    shot(page, "charts-one-point")

    open_page(page, f"{deck.url}/jobs/{deck.ids['died']}", "wide")
    page.locator('#status [data-status="failed"]').wait_for()
    for el, what in (("loss-chart", "loss"), ("mem-chart", "memory samples")):
        text = page.locator(f"#{el} .annotation-text").text_content()
        assert text == f"No {what}: the job failed before logging any (its log below says why).", el
        assert page.locator(f"#{el} .xtick, #{el} .ytick").count() == 0, el
    shot(page, "charts-failed")

    open_page(page, f"{deck.url}/jobs/{deck.ids['z2']}", "wide")
    for el, what in (
        ("loss-chart", "loss"),
        ("lr-chart", "learning rate"),
        ("tp-chart", "throughput"),
        ("mem-chart", "memory samples"),
    ):
        page.locator(f"#{el} .annotation-text").wait_for()
        text = page.locator(f"#{el} .annotation-text").text_content()
        assert text == f"No {what} yet: the job is queued and has not started.", el
        assert page.locator(f"#{el} .xtick, #{el} .ytick").count() == 0, el
    shot(page, "charts-queued")
    assert page.errors == [] and page.console_errors == []


def test_utilisation_and_temperature_from_telemetry(deck, page):
    open_page(page, f"{deck.url}/jobs/{deck.ids['telemetry']}", "wide")
    page.locator("#gpu-card").wait_for(state="visible")
    traces = plot(page, "gpu-chart", "gd.data.map(t => [t.name, t.yaxis || 'y', t.y])")
    assert traces == [
        ["GPU 0 MI300X utilisation", "y", [90.0, 95.5, 97.0, 99.0, 98.0, 96.0]],
        ["GPU 0 MI300X edge temperature", "y2", [55.0, 61.0, 66.0, 70.0, 71.0, 72.0]],
    ]
    text = hover_text(page, "gpu-chart", 1, 2)
    assert "°C" in text and "GPU 0 MI300X edge temperature" in text, text
    # Peak memory per GPU against the job's stored estimate.
    est = deck.api.get(f"/api/jobs/{deck.ids['telemetry']}/estimate").json()["estimate"]["per_gpu_bytes"]
    peak = page.locator('#summary [data-key="peak GPU 0 MI300X"]').inner_text()
    assert re.fullmatch(r"15\.0 GiB of 80\.0 GiB · estimate \d+(\.\d)? [MG]iB \(measured .*×\)", peak), peak
    assert f"(measured {15 * GIB / est:.3g}×)" in peak, peak
    shot(page, "charts-gpu-utilisation")
    assert page.errors == [] and page.console_errors == []


def test_xgmi_traffic_is_charted_as_a_rate_between_samples(deck, page):
    open_page(page, f"{deck.url}/jobs/{deck.ids['telemetry']}", "wide")
    page.locator("#xgmi-card").wait_for(state="visible")
    traces = plot(page, "xgmi-chart", "gd.data.map(t => [t.name, t.y])")
    # GB/s from the cumulative counters; none where the counter went back (a driver reload).
    assert traces == [
        ["GPU 0 MI300X xGMI read", [None, 2.0, 2.0, 3.0, None, 2.0]],
        ["GPU 0 MI300X xGMI written", [None, 1.0, 1.0, 1.0, 1.0, 1.0]],
    ]
    assert "GB/s" in hover_text(page, "xgmi-chart", 0, 2)
    shot(page, "charts-xgmi")
    open_page(page, f"{deck.url}/jobs/{deck.ids['rich']}", "wide")  # no counters: no card
    page.wait_for_function("/samples shown/.test(document.getElementById('mem-n').textContent)")
    assert page.locator("#xgmi-card").is_hidden()
    assert page.errors == [] and page.console_errors == []


def test_compare(deck, page):
    ids = deck.ids
    open_page(page, f"{deck.url}/compare?jobs={ids['rich']},{ids['single']}", "wide")
    traces = plot(page, "loss-chart", "gd.data.map(t => [t.name, t.line.color, t.line.dash, t.mode])")
    rich = [t for t in traces if t[0].startswith(f"#{ids['rich']} ")]
    assert [t[0] for t in rich] == [f"#{ids['rich']} rich run loss", f"#{ids['rich']} rich run eval loss"]
    assert rich[0][1] == rich[1][1] and (rich[0][2], rich[1][2]) == ("solid", "dash")
    single = [t for t in traces if t[0].startswith(f"#{ids['single']} ")]
    assert single == [[f"#{ids['single']} one point loss", single[0][1], "solid", "markers"]]
    assert single[0][1] != rich[0][1]
    # A run's colour is its own: the same beside another run, and in the memory chart.
    mem = plot(page, "mem-chart", "gd.data.map(t => [t.name, t.line.color])")
    assert {c for n, c in mem if n.startswith(f"#{ids['rich']} ")} == {rich[0][1]}, mem
    open_page(page, f"{deck.url}/compare?jobs={ids['single']},{ids['died']}", "wide")  # now listed first
    again = plot(page, "loss-chart", "gd.data.map(t => [t.name, t.line.color])")
    assert {c for n, c in again if n.startswith(f"#{ids['single']} ")} == {single[0][1]}, again
    open_page(page, f"{deck.url}/compare?jobs={ids['rich']},{ids['single']}", "wide")
    boxes_apart(page, "loss-chart", compared_loss(ids))
    boxes_apart(page, "mem-chart", compared_memory(ids))

    # Any metric, over steps, time or tokens.
    options = page.locator("#metric option").all_inner_texts()
    assert {"loss and eval loss", "learning rate", "throughput", "tokens seen"} <= set(options)
    page.select_option("#metric", "lr")
    page.wait_for_function("document.getElementById('loss-chart').data[0].name.endsWith('learning rate')")
    lo, hi = plot(page, "loss-chart", "gd.layout.yaxis.range")
    assert lo < LR < hi and hi - lo < LR
    page.select_option("#metric", "throughput")
    page.select_option("#xaxis", "tokens")
    page.wait_for_function("document.getElementById('loss-chart').layout.xaxis.title.text === 'tokens seen'")
    assert plot(page, "loss-chart", "gd.data[0].x") == [512 * s for s in range(1, 31)]
    text = hover_text(page, "loss-chart", 0, 4)
    assert "tokens/s" in text and f"#{ids['rich']} rich run throughput" in text, text
    page.select_option("#xaxis", "time")
    page.wait_for_function(
        "document.getElementById('loss-chart').layout.xaxis.title.text.startsWith('seconds')"
    )
    assert plot(page, "loss-chart", "gd.data[0].x")[:3] == [0, 2, 4]
    text = hover_text(page, "loss-chart", 0, 2)
    assert "4 s: 256 tokens/s" in text, text  # the x value in seconds, said so; our own tokens/s
    shot(page, "charts-compare-wide")

    # The config diff: DeepSpeed keys one by one, values as written.
    page.goto(f"{deck.url}/compare?jobs={ids['z2']},{ids['z3']}")
    page.wait_for_function("window.tunedeckReady === true", timeout=120_000)
    row = page.locator('#diff tr[data-key="deepspeed.zero_optimization.stage"]')
    assert row.locator("td").all_inner_texts()[1:] == ["2", "3"]
    row = page.locator('#diff tr[data-key="lr_scheduler_type"]')
    assert row.locator("td").all_inner_texts()[1:] == ["cosine", "linear"]
    assert page.locator('#diff tr[data-key="deepspeed"]').count() == 0  # the run's own path: noise
    for el, what in (("loss-chart", "a loss"), ("mem-chart", "")):
        text = page.locator(f"#{el} .annotation-text").text_content()
        assert (
            text.startswith("None of the chosen jobs logged a loss") if what else text.startswith("No memory")
        )
    assert page.errors == [] and page.console_errors == []


def test_compare_with_nothing_picked_says_so(deck, page):
    open_page(page, f"{deck.url}/compare", "wide")
    assert (
        page.locator("#loss-chart .annotation-text").text_content()
        == "Pick jobs above to overlay their curves."
    )
    assert (
        page.locator("#mem-chart .annotation-text").text_content()
        == "Pick jobs above to overlay their memory."
    )
    assert page.locator("#loss-chart .xtick, #mem-chart .xtick").count() == 0
    shot(page, "charts-compare-empty")
    assert page.errors == [] and page.console_errors == []


def test_legends_clear_of_axis_titles_on_a_phone(deck, page):
    ids = deck.ids
    open_page(page, f"{deck.url}/jobs/{ids['rich']}", "phone")
    boxes_apart(page, "loss-chart", LOSS_LEGEND)  # the alerts' row makes the legend its tallest
    # On a phone too: periodic spikes a marker, never a band; an import's runtime its own span.
    page.wait_for_function(
        "(document.getElementById('mem-chart').layout.shapes || []).some(s => s.name === 'test_repeat ×3')"
    )
    shaded = plot(
        page, "mem-chart", "gd.layout.shapes.filter(s => s.type === 'rect' && s.name).map(s => s.name)"
    )
    assert "test_repeat ×3" in shaded and not [n for n in shaded if "periodic" in n], shaded
    marks = plot(page, "mem-chart", "gd.data.find(d => d.name === 'alerts').text")
    assert any(m.startswith("×12 · vram_periodic_spikes") for m in marks), marks
    assert "1m 38s" in page.locator("#summary").inner_text()
    shot(page, "charts-job-phone")
    open_page(page, f"{deck.url}/compare?jobs={ids['rich']},{ids['single']}", "phone")
    boxes_apart(page, "loss-chart", compared_loss(ids))
    boxes_apart(page, "mem-chart", compared_memory(ids))
    # A run's colour is its own on a phone as well: one colour for all its curves, in both charts.
    loss = plot(page, "loss-chart", "gd.data.map(t => [t.name, t.line.color])")
    mem = plot(page, "mem-chart", "gd.data.map(t => [t.name, t.line.color])")
    rich = {c for n, c in loss + mem if n.startswith(f"#{ids['rich']} ")}
    single = {c for n, c in loss if n.startswith(f"#{ids['single']} ")}
    assert len(rich) == 1 and len(single) == 1 and rich != single, (loss, mem)
    shot(page, "charts-compare-phone")
    assert page.errors == [] and page.console_errors == []


CHART_KEYS = """() => [...document.querySelectorAll('.chart')].map((c) => [c.id, c.getAttribute('role'),
  c.getAttribute('aria-label'), c.querySelectorAll('.modebar-btn').length])"""


def test_charts_are_named_and_their_toolbars_short_and_off_a_phone(deck, page):
    """Each chart has an accessible name; its toolbar holds zoom, pan, reset and save (4 Tab stops, not
    a dozen), and a phone gets none: there it covered the legend's first row."""
    for url in (f"/jobs/{deck.ids['rich']}", f"/compare?jobs={deck.ids['rich']},{deck.ids['single']}"):
        open_page(page, deck.url + url, "wide")
        page.wait_for_function("document.querySelectorAll('#loss-chart .modebar-btn').length > 0")
        drawn = [c for c in page.evaluate(CHART_KEYS) if c[3]]
        assert drawn and all(role == "figure" and name for _, role, name, _ in drawn), drawn
        assert all(n == 4 for *_, n in drawn), drawn
        labels = page.evaluate(
            "[...document.querySelectorAll('.modebar-btn')].map(b => b.getAttribute('aria-label'))"
        )
        assert not [x for x in labels if "Share" in (x or "") or "Chart Studio" in (x or "")], labels
        open_page(page, deck.url + url, "phone")
        page.wait_for_function("document.querySelector('#loss-chart .main-svg') !== null")
        assert [c for c in page.evaluate(CHART_KEYS) if c[3]] == []
        assert page.locator("#loss-chart .modebar").count() == 0
        assert page.errors == [] and page.console_errors == []


@pytest.mark.parametrize("screen", SCREENS)
def test_the_view_is_kept_in_the_address_across_a_reload(deck, page, screen):
    """Smoothing, log scale and the loss chart's zoom go into the URL; a reload (or the link, shared)
    shows the same view, at both widths."""
    url = f"{deck.url}/jobs/{deck.ids['rich']}"
    open_page(page, url, screen)
    page.evaluate(
        "(() => { const s = document.getElementById('smooth'); s.value = 0.8; s.dispatchEvent(new Event('input')); })()"
    )
    page.check("#logy")
    page.evaluate("Plotly.relayout('loss-chart', {'xaxis.range': [5, 20]})")
    page.wait_for_function("location.search.includes('steps=5..20')")
    kept = page.url
    assert "smooth=0.80" in kept and "logy=1" in kept, kept
    open_page(page, kept, screen)
    assert page.input_value("#smooth") == "0.8" and page.is_checked("#logy")
    page.wait_for_function("document.getElementById('loss-chart').layout.xaxis.range[0] === 5")
    assert plot(page, "loss-chart", "gd.layout.xaxis.range") == [5, 20]
    assert plot(page, "loss-chart", "gd.layout.yaxis.type") == "log"
    assert page.errors == [] and page.console_errors == []

    # Compare keeps its metric, x axis, log scale and smoothing the same way.
    open_page(page, f"{deck.url}/compare?jobs={deck.ids['rich']},{deck.ids['single']}", screen)
    page.select_option("#metric", "throughput")
    page.select_option("#xaxis", "tokens")
    page.check("#logy")
    page.wait_for_function("location.search.includes('x=tokens') && location.search.includes('logy=1')")
    kept = page.url
    assert "metric=throughput" in kept, kept
    open_page(page, kept, screen)
    assert (page.input_value("#metric"), page.input_value("#xaxis"), page.is_checked("#logy")) == (
        "throughput",
        "tokens",
        True,
    )
    assert plot(page, "loss-chart", "gd.layout.xaxis.title.text") == "tokens seen"
    assert plot(page, "loss-chart", "gd.data[0].name").endswith("throughput")
    assert page.errors == [] and page.console_errors == []


def ema(ys: list[float], w: float) -> list[float]:
    """TensorBoard's debiased smoothing, recomputed from the first point."""
    out, last = [], 0.0
    for n, y in enumerate(ys, 1):
        last = last * w + (1 - w) * y
        out.append(last / (1 - w**n))
    return out


def test_live_points_are_appended_in_order_and_smoothed(deck, assets, page):
    job = deck.submit({"name": "live points", "config": demo_config(assets)})
    token = secrets.token_urlsafe(32)
    with closing(sqlite3.connect(deck.workspace / "tunedeck.db", timeout=60)) as db, db:
        db.execute(
            "UPDATE jobs SET runner_token_hash = ? WHERE id = ?",
            (hashlib.sha256(token.encode()).hexdigest(), job["id"]),
        )
    open_page(page, f"{deck.url}/jobs/{job['id']}", "wide")
    # Losses that leave the first points' y range both ways, so the axis has to follow them.
    losses = [2.0, 1.9, 2.6, 1.7] + [1.5 - 0.04 * i + (0.3 if i % 7 == 3 else 0) for i in range(26)] + [0.2]
    lines = [
        {"current_steps": s, "total_steps": 100, "loss": y, "lr": LR * (1 - s / 100)}
        for s, y in enumerate(losses, 1)
    ]
    batches = [(0, 1), (1, 3), (3, 4), (4, 12), (12, 13), (13, 20), (20, 21), (21, 31)]
    for seq, (a, b) in enumerate(batches):
        if seq == 4:  # a new smoothing weight between batches: the live line goes on from the redrawn one
            page.locator("#smooth").fill("0.8")
        r = deck.api.post(
            f"/api/jobs/{job['id']}/telemetry",
            json={
                "seq": seq,
                "metrics": [{"line": i, "t": T0 + i, "raw": json.dumps(lines[i])} for i in range(a, b)],
            },
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
        if seq % 2:  # some batches wait for their points to be drawn, others arrive back to back
            page.wait_for_function(f"document.getElementById('loss-chart').data?.[0]?.x.length === {b}")
    n = len(losses)
    page.wait_for_function(f"document.getElementById('loss-chart').data?.[0]?.x.length === {n}")
    traces = "gd.data.slice(0, 2).map((t) => ({x: t.x, y: t.y}))"
    gd = plot(page, "loss-chart", f"({{data: {traces}, range: gd.layout.yaxis.range}})")
    steps = list(range(1, n + 1))
    assert gd["data"][0] == {"x": steps, "y": losses}
    assert gd["data"][1]["x"] == steps
    assert gd["data"][1]["y"] == pytest.approx(ema(losses, 0.8), rel=1e-12)
    assert gd["range"][0] < min(losses) and gd["range"][1] > max(losses), gd["range"]
    lr = plot(page, "lr-chart", "gd.data[0]")
    assert lr["x"] == steps and lr["y"] == pytest.approx([x["lr"] for x in lines], rel=1e-12)
    # Each streamed loss point is noted once, when it was drawn.
    assert sorted(s for s, _ in page.evaluate("window.tunedeck.arrivals")) == steps
    assert not page.errors and not page.console_errors


def test_default_smoothing_follows_the_run_length(deck, page):
    # An 8-point run is not smoothed (0.6 made a wrecked one read as a descent); a long one is; and the
    # raw line under the smoothed one stays readable.
    ids = dict(deck.ids)
    for name, steps in (("eight points", 8), ("long run", 200)):
        r = deck.api.post(
            "/api/runs/import", files={"trainer_log": trainer_log(steps).encode()}, data={"name": name}
        )
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]
    weights = {}
    for name, screen in (
        ("eight points", "wide"),
        ("eight points", "phone"),
        ("rich", "wide"),
        ("long run", "wide"),
    ):
        open_page(page, f"{deck.url}/jobs/{ids[name]}", screen)
        raw, smoothed = plot(page, "loss-chart", "gd.data.slice(0, 2)")
        w = float(page.locator("#smooth").input_value())
        assert page.locator("#smooth-v").inner_text() == f"{w:.2f}"
        assert smoothed["name"] == f"loss (smoothed {w:.2f})"
        assert smoothed["y"] == pytest.approx(ema(raw["y"], w) if w else raw["y"], rel=1e-9)
        alpha = float(re.fullmatch(r"rgba\(.*,\s*([\d.]+)\)", raw["line"]["color"]).group(1))
        assert alpha >= 0.5, raw["line"]
        weights[name] = w
    assert weights["eight points"] == 0
    assert 0 < weights["rich"] < weights["long run"]
    # A weight the user picks stays, and the line follows it.
    page.locator("#smooth").fill("0.5")
    page.wait_for_function("document.getElementById('loss-chart').data[1].name === 'loss (smoothed 0.50)'")
    assert page.errors == [] and page.console_errors == []
    # Compare: the shortest chosen run's default (one slider for all).
    for short, w in (("eight points", 0), ("rich", weights["rich"])):
        open_page(page, f"{deck.url}/compare?jobs={ids[short]},{ids['long run']}", "wide")
        assert float(page.locator("#smooth").input_value()) == w
        (y,) = plot(
            page, "loss-chart", f"gd.data.filter(t => t.name.startsWith('#{ids[short]} ')).map(t => t.y)"
        )[:1]
        raw = [round(2.5 * 0.93**s + 0.01 * (s % 3), 4) for s in range(1, 9 if w == 0 else 31)]
        assert y == pytest.approx(ema(raw, w) if w else raw, rel=1e-9)
    assert page.errors == [] and page.console_errors == []


# Every chart of the job page and how to read its x values and alert shapes as numbers (dates as ms).
JOB_CHARTS = ("loss-chart", "lr-chart", "tp-chart", "grad-chart", "mem-chart")
AXIS_VIEW = """(ids) => Object.fromEntries(ids.map((id) => {
  const gd = document.getElementById(id), num = (x) => (typeof x === "number" ? x : new Date(x).getTime());
  return [id, { title: gd.layout.xaxis.title.text, type: gd.layout.xaxis.type, x: gd.data[0].x.map(num),
    shapes: (gd.layout.shapes || []).filter((s) => s.name && s.type === "rect" && s.xref === "x").map((s) => [s.name, num(s.x0), num(s.x1)]),
    lines: (gd.layout.shapes || []).filter((s) => s.type === "line" && s.name).map((s) => [s.name, num(s.x0)]),
    marks: (gd.data.find((t) => t.name === "alerts") || { x: [] }).x.map(num) }];
}))"""


@pytest.mark.parametrize("screen", SCREENS)
def test_one_x_axis_moves_every_chart_and_its_alerts(deck, page, screen):
    """Step, time or tokens for every chart at once: the memory samples placed by the logged points'
    times (a sample every 2 s, a step every 2 s), tokens by the tokens-seen column; each chart carries
    every alert at its place on that axis; the choice is kept in the address."""
    open_page(page, f"{deck.url}/jobs/{deck.ids['rich']}", screen)
    page.wait_for_function(
        "['loss-chart', 'lr-chart', 'mem-chart'].every(id => (document.getElementById(id).layout.shapes || [])"
        ".some(s => s.name === 'test_repeat ×3'))",
    )
    steps = list(range(1, 31))
    # In steps, T0 + 2 s is step 1: the repeated memory jump from T0 + 20 to T0 + 80 runs from step
    # 10 to step 40 (past the last logged step, at the run's pace), the loss one from step 5 to 25.
    spans = {"test_repeat ×3": (10, 40), "test_loss_repeat ×4": (5, 25)}
    places = {
        "step": (lambda s: s, lambda t: (t - T0) / 2),
        "tokens": (lambda s: 512 * s, lambda t: 512 * (t - T0) / 2),
        "time": (lambda s: (T0 + 2 * s) * 1000, lambda t: t * 1000),
    }
    for axis in ("step", "tokens", "time", "step"):
        if axis != "step" or page.input_value("#xaxis") != "step":
            page.select_option("#xaxis", axis)
        by_step, by_time = places[axis]
        title = {"step": "step", "tokens": "tokens seen", "time": "time"}[axis]
        page.wait_for_function(
            f"{list(JOB_CHARTS)!r}.every(id => document.getElementById(id).layout.xaxis.title.text === {title!r})",
        )
        charts = page.evaluate(AXIS_VIEW, list(JOB_CHARTS))
        for chart in ("lr-chart", "tp-chart", "grad-chart", "loss-chart"):
            assert charts[chart]["x"] == pytest.approx([by_step(s) for s in steps]), (axis, chart)
        mem = charts["mem-chart"]
        assert mem["type"] == ("date" if axis == "time" else "linear")
        assert mem["x"] == pytest.approx([by_time(T0 + 2 * i) for i in range(50)]), axis
        for chart, c in charts.items():
            got = {name: (x0, x1) for name, x0, x1 in c["shapes"]}
            # A step-placed alert on the time axis sits at its step's time (5 and 25 are T0 + 10, T0 + 50).
            want = {"test_repeat ×3": tuple(by_time(T0 + 2 * s) for s in spans["test_repeat ×3"])}
            want["test_loss_repeat ×4"] = tuple(by_step(s) for s in spans["test_loss_repeat ×4"])
            assert got == {k: pytest.approx(v) for k, v in want.items()}, (axis, chart)
            # The periodic spikes: one named line at their newest (T0 + 96), on every chart too.
            assert [x for n, x in c["lines"] if n == "vram_periodic_spikes"] == [
                pytest.approx(by_time(T0 + 96))
            ]
            assert c["marks"], (axis, chart)  # markers to hover, with the alert's words
        assert ("x=" + axis in page.url) == (axis != "step"), page.url
        if axis == "tokens":
            shot(page, f"charts-x-tokens-{screen}")
    # The address keeps the choice: a reload (or the link, shared) draws every chart by time.
    page.select_option("#xaxis", "time")
    page.wait_for_function("location.search.includes('x=time')")
    open_page(page, page.url, screen)
    assert page.input_value("#xaxis") == "time"
    assert page.evaluate(AXIS_VIEW, list(JOB_CHARTS))["lr-chart"]["type"] == "date"
    assert page.errors == [] and page.console_errors == []


@pytest.fixture(scope="module")
def lineage(deck, assets):
    """Three attempts of one run: the first stopped at step 25 (checkpoint 10), the second resumed from
    it and crashed at 33 (checkpoint 30), the third resumed from that and ran to 50. Their trainer-log
    rows as ingest stores them; the resumes through the API."""

    def logged(job_id: int, steps: range, t0: float) -> None:
        rows = [
            (
                job_id,
                i,
                s,
                t0 + 2 * s,
                3.0 - s / 50 + (0.5 if job_id % 2 else 0.0),
                LR,
                json.dumps({"current_steps": s}),
            )
            for i, s in enumerate(steps)
        ]
        with closing(sqlite3.connect(deck.workspace / "tunedeck.db", timeout=60)) as db, db:
            db.executemany(
                "INSERT INTO metric_points (job_id, line, step, t, loss, lr, raw) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def resumed(parent: dict, step: int) -> dict:
        folder = Path(parent["output_dir"]) / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        for f in (
            "adapter_model.safetensors",
            "optimizer.pt",
            "scheduler.pt",
            "rng_state.pth",
            "trainer_state.json",
        ):
            (folder / f).write_bytes(b"x")
        r = deck.api.post(f"/api/jobs/{parent['id']}/resume", json={"checkpoint": f"checkpoint-{step}"})
        assert r.status_code == 201, r.text
        return r.json()

    first = deck.submit({"name": "attempts", "config": demo_config(assets)})
    logged(first["id"], range(1, 26), T0)
    second = resumed(first, 10)
    logged(second["id"], range(11, 34), T0 + 1000)
    third = resumed(second, 30)
    logged(third["id"], range(31, 51), T0 + 2000)
    return [first["id"], second["id"], third["id"]]


@pytest.mark.parametrize("screen", SCREENS)
def test_a_resumed_run_charts_its_lineage_as_one_curve(deck, lineage, page, screen):
    first, second, third = lineage
    open_page(page, f"{deck.url}/jobs/{third}", screen)
    loss = plot(page, "loss-chart", "gd.data[0]")
    # One curve: the first attempt's steps through its checkpoint, the second's through its own, then
    # this run's; no step twice.
    assert loss["x"] == list(range(1, 51))
    owners = [first] * 10 + [second] * 20 + [third] * 20
    assert loss["text"] == [f"#{j}" for j in owners]
    # Each resume marked where it happened, on every metric chart, in the chosen axis too.
    for chart in ("loss-chart", "lr-chart"):
        lines = plot(
            page,
            chart,
            "gd.layout.shapes.filter(s => / resumed at step /.test(s.name)).map(s => [s.name, s.x0])",
        )
        assert lines == [[f"#{second} resumed at step 10", 10], [f"#{third} resumed at step 30", 30]], chart
    marks = plot(page, "loss-chart", "gd.data.find(t => t.name === 'resumes')")
    assert marks["x"] == [10, 30] and f"#{second} attempts: resumed from checkpoint-10" in marks["text"][0]
    # The hover of a point says which attempt it is from.
    assert f"#{second}" in hover_text(page, "loss-chart", 0, 14)  # step 15
    page.select_option("#xaxis", "time")
    page.wait_for_function("document.getElementById('lr-chart').layout.xaxis.type === 'date'")
    lines = plot(
        page,
        "lr-chart",
        "gd.layout.shapes.filter(s => / resumed at step /.test(s.name)).map(s => new Date(s.x0).getTime())",
    )
    # At the time its checkpoint's step was logged: step 10 by the first attempt, 30 by the second.
    assert lines == [(T0 + 20) * 1000, (T0 + 1000 + 60) * 1000]
    shot(page, f"charts-lineage-{screen}")
    assert page.errors == [] and page.console_errors == []


@pytest.mark.parametrize("screen", SCREENS)
def test_utilisation_and_temperature_of_a_downsampled_run_after_a_reload(deck, assets, page, screen):
    """A run with more samples than the chart draws: its memory comes downsampled from the chart tiles,
    and its utilisation and temperature come with it (the tiles keep them), busy and hot spikes too."""
    if not hasattr(deck, "long_memory"):
        job = deck.submit({"name": "long memory", "config": demo_config(assets)})["id"]
        rows = []
        for i in range(4000):
            util = 100.0 if i == 3100 else 70.0 + i % 9
            temp = 91.0 if i == 1700 else 60.0 + i % 4
            rows.append((job, i, T0 + i, 0, (30 + i % 5) * GIB, TOTAL, "MI300X", util, temp))
        with closing(sqlite3.connect(deck.workspace / "tunedeck.db", timeout=60)) as db, db:
            db.executemany(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes, name, util, temp_c)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        deck.long_memory = job
    for _ in range(2):  # the page, and the page reloaded
        open_page(page, f"{deck.url}/jobs/{deck.long_memory}", screen)
        assert "downsampled" in page.locator("#mem-n").inner_text()
        page.locator("#gpu-card").wait_for(state="visible")
        traces = plot(page, "gpu-chart", "gd.data.filter(t => t.name !== 'alerts').map(t => [t.name, t.y])")
        names = [n for n, _ in traces]
        assert names == ["GPU 0 MI300X utilisation", "GPU 0 MI300X edge temperature"], names
        util, temp = (y for _, y in traces)
        assert 100 <= len(util) < 4000 and None not in util and None not in temp
        assert max(util) == 100.0 and max(temp) == 91.0  # the spikes survive the buckets
    shot(page, f"charts-downsampled-utilisation-{screen}")
    assert page.errors == [] and page.console_errors == []
