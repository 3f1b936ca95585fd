"""Nothing wider than the page: the predictions table of a predict job (long prompts, a label with no
space to break at) and the run report scroll inside themselves, at 1440 and 390 px."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ui.conftest import shot

pytestmark = [pytest.mark.browser]
SCREENS = {"wide": (1440, 900), "phone": (390, 844)}
LONG = "Summarise the following paragraph in one sentence. " * 12
UNBROKEN = "x" * 400  # a token, a URL, a base64 blob: nowhere to wrap
# Each element's right edge and the page's width; what sticks out names itself.
WIDE = """(sel) => {
  const vw = document.documentElement.clientWidth;
  const out = [...document.querySelectorAll(sel)].map((e) => ({ sel: e.id || e.tagName, right: e.getBoundingClientRect().right }))
    .filter((b) => b.right > vw + 0.5);
  return { vw, scroll: document.documentElement.scrollWidth, out };
}"""


def fits(page, sel: str) -> None:
    got = page.evaluate(WIDE, sel)
    assert got["scroll"] <= got["vw"] and got["out"] == [], got


@pytest.fixture
def run(server_factory):
    server = server_factory()
    log = "".join(
        json.dumps({"current_steps": k, "total_steps": 4, "loss": 2.0 - k / 10}) + "\n" for k in range(1, 5)
    )
    r = server.api.post("/api/runs/import", files={"trainer_log": log.encode()}, data={"name": UNBROKEN[:60]})
    assert r.status_code == 201, r.text
    job = r.json()
    rows = [{"prompt": LONG, "label": UNBROKEN, "predict": f"answer {i}\n{LONG}"} for i in range(3)]
    (Path(job["output_dir"]) / "generated_predictions.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in rows)
    )
    server.job = job["id"]
    return server


def test_the_predictions_table_scrolls_inside_its_card(run, page):
    for screen, (w, h) in SCREENS.items():
        page.set_viewport_size({"width": w, "height": h})
        page.goto(f"{run.url}/jobs/{run.job}")
        page.locator("#predictions tbody tr").nth(2).wait_for()
        fits(page, "main, .card, #predictions-box, #results, #predictions-box > div, pre")
        table = page.evaluate(
            "(() => { const t = document.getElementById('predictions'), box = t.parentElement;"
            " return { table: t.getBoundingClientRect().width, box: box.getBoundingClientRect().width,"
            " card: document.getElementById('results').getBoundingClientRect().width }; })()"
        )
        assert table["box"] <= table["card"], table  # the table scrolls inside its own box
        assert page.locator("#predictions pre").first.inner_text().startswith("Summarise")
        shot(page, f"predictions-{screen}")
    assert page.errors == []


def test_the_run_report_fits_a_phone(run, browser, tmp_path):
    r = run.api.get(f"/api/jobs/{run.job}/report", timeout=180)
    assert r.status_code == 200, r.text
    path = tmp_path / "report.html"
    path.write_text(r.text)
    for screen, (w, h) in SCREENS.items():
        context = browser.new_context(viewport={"width": w, "height": h})
        try:
            page = context.new_page()
            page.goto(path.as_uri())
            page.wait_for_function("window.reportReady === true")
            fits(page, "body, table, pre, h1, .chart, #facts td")
            # An import trained elsewhere: its environment is said to be unknown, not this server's.
            env = page.locator("#environment").inner_text()
            assert "Unknown: this run was imported" in env and "python" not in env.lower(), env
            shot(page, f"report-{screen}")
        finally:
            context.close()
