"""The pages as a new user meets them: every page on a phone without sideways scrolling, in the dark
theme, with no console error or failed request; the form's help, choices, dataset preview and
template fill; Stop that asks first. Launches are held: nothing trains here."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

from tests.ui.conftest import shot
from tests.utils.servers import Server, demo_config
from tests.utils.wait import until
from tunedeck.checks.tables import lf_table

pytestmark = [pytest.mark.browser]
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    s = Server(tmp_path_factory.mktemp("ws"), assets, TUNEDECK_LAUNCH_PAUSED="true").start()
    s.job = s.submit({"name": "held", "config": demo_config(assets), "gpus": 0})
    # The report shows the node's preflight, whose probe imports torch: start it while the pages are tested.
    probe = threading.Thread(target=s.api.get, args=("/api/nodes/local/preflight",), kwargs={"timeout": 300})
    probe.start()
    yield s
    probe.join()
    s.stop()


def watched(browser, **context):
    """A page under the server's policy that records console errors, page errors and failed requests."""
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    page.problems = []
    page.on("console", lambda m: page.problems.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(f"pageerror: {e}"))
    # Leaving a page aborts its open stream (ERR_ABORTED): that is navigation, not a failure.
    page.on(
        "requestfailed",
        lambda r: (
            page.problems.append(f"failed: {r.url} {r.failure}") if "ERR_ABORTED" not in r.failure else None
        ),
    )
    page.on("response", lambda r: page.problems.append(f"{r.status}: {r.url}") if r.status >= 400 else None)
    return ctx, page


def ready(page, selector: str | None = None) -> None:
    """Wait for the page's script (the pages' policy forbids wait_for_function's eval)."""
    if selector:
        page.locator(selector).first.wait_for()
        return
    until(lambda: page.evaluate("window.tunedeckReady === true"), "the page's script loaded", 60)


def test_every_page_fits_a_phone_in_the_dark_without_errors_and_stop_asks_first(server, browser):
    job = server.job["id"]
    pages = [("/", f'tr[data-job="{job}"]'), ("/new", None), (f"/compare?jobs={job}", None),
             ("/nodes", None), (f"/jobs/{job}", None)]  # fmt: skip
    ctx, page = watched(browser, viewport=PHONE, color_scheme="dark")
    try:
        # Open mode (no tokens anywhere): the page says anyone here may act, the job made without a
        # token says what its "–" owner means, and Stop is offered; no "My jobs" (no name to filter by).
        for size in ({"width": 1440, "height": 900}, PHONE):
            page.set_viewport_size(size)
            page.goto(server.url + "/")
            row = page.locator(f'tr[data-job="{job}"]')
            row.wait_for()
            page.locator("#me", has_text="open mode: anyone here may act").wait_for()
            assert row.locator('td[title^="made without a token"]').inner_text() == "–"
            page.locator(f'[data-stop="{job}"]').wait_for()
            assert page.locator("#mine-label").is_hidden()
        for path, selector in pages:
            page.goto(server.url + path)
            ready(page, selector)
            name = "home" if path == "/" else path.strip("/").split("?")[0].replace("/", "-")
            shot(page, f"phone-dark-{name}")
            wide = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert wide[0] <= wide[1], f"{path} scrolls sideways on a phone: {wide}"
            bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
            rgb = [int(x) for x in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]]
            assert sum(rgb) < 150, f"{path} is not dark: {bg}"
            assert page.problems == [], (path, page.problems)
        # Still on the job page. Its charts follow the theme: no white paper, the page's text colour.
        paper = page.evaluate("document.getElementById('loss-chart')._fullLayout.paper_bgcolor")
        ink = page.evaluate("document.getElementById('loss-chart')._fullLayout.font.color")
        fg = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--fg').trim()")
        assert paper.replace(" ", "") == "rgba(0,0,0,0)" and ink == fg == "#e2e7ef", (paper, ink, fg)
        # It reads in order on a phone: header, charts, alerts, log, config.
        tops = [
            page.locator(s).first.bounding_box()["y"]
            for s in ("#head", "#loss-chart", "#alerts", "#logs", "#train-yaml")
        ]
        assert tops == sorted(tops), tops
        favicon = page.evaluate("fetch('/favicon.ico').then(r => [r.status, r.headers.get('content-type')])")
        assert favicon == [200, "image/svg+xml"]

        # Stop asks first: dismissed, nothing happens; accepted, the job says who stopped it.
        asked = []
        page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
        page.click("#stop")
        assert asked and "held" in asked[0]
        assert server.api.get(f"/api/jobs/{job}").json()["status"] == "queued"
        assert page.locator("#stop").is_enabled()
        page.once("dialog", lambda d: d.accept())
        page.click("#stop")
        page.locator('#status [data-status="cancelled"]').wait_for()
        assert (
            page.locator("#stopped").inner_text()
            == "cancelled by a request without a token before it started"
        )
        assert page.problems == [], page.problems
    finally:
        ctx.close()


def test_the_form_helps_offers_choices_and_clears_stale_results(server, browser, assets):
    ctx, page = watched(browser, viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server.url}/new")
        ready(page)
        help_text = lf_table()["args"]["lora_rank"]["help"]
        assert page.locator('[data-help="lora_rank"]').inner_text() == help_text
        page.fill("#extra", "neftune_noise_alpha: 5")
        page.locator("#extra").press("End")
        assert lf_table()["args"]["neftune_noise_alpha"]["help"] in page.locator("#extra-help").inner_text()
        page.fill("#extra", "")

        page.fill("#f-name", "form-run")
        page.fill("#f-gpus", "0")
        page.fill("#f-model_name_or_path", str(assets / "demo" / "model"))
        page.locator("#f-model_name_or_path").dispatch_event("change")
        page.locator('[data-hint="model_name_or_path"]', has_text="template qwen").wait_for()
        assert page.input_value("#f-template") == "qwen"  # the model folder chose it
        assert "llama3" in page.locator("#templates-list option").evaluate_all("os => os.map(o => o.value)")

        page.fill("#f-dataset_dir", str(assets / "demo" / "data"))
        page.locator("#f-dataset_dir").dispatch_event("change")
        page.locator('[data-hint="dataset_dir"]', has_text="2 datasets").wait_for()
        options = page.locator("#datasets-list option").evaluate_all("os => os.map(o => o.value)")
        assert options == ["demo_identity", "demo_identity_small"]
        page.fill("#f-dataset", "demo_identity")
        page.locator("#f-dataset").dispatch_event("change")
        first = (assets / "demo" / "data" / "demo_identity.json").read_text()
        page.locator("#dataset-preview pre").wait_for()
        assert json.loads(first)[0]["instruction"] in page.locator("#dataset-preview pre").inner_text()
        page.fill("#f-max_steps", "5")
        page.select_option("#f-finetuning_type", "lora")

        # Preview and lint, then a refused submit: what they showed is gone.
        page.click("#preview")
        page.locator("#preview-out", has_text="max_steps: 5").wait_for()
        page.click("#check")
        page.locator("#checks", has_text="Estimate").wait_for()
        page.fill("#f-dataset", "demo_identiy")
        page.click("#submit")
        err = page.locator('.field-error[data-loc="config.dataset"]')
        err.wait_for()
        assert "LF014" in err.inner_text() and "demo_identity" in err.inner_text()
        assert "max_steps" not in page.inner_text("#preview-out")
        assert "Estimate" not in page.inner_text("#checks")
        shot(page, "form-refused-cleared")
        assert "not in dataset_info.json" in page.inner_text("#dataset-preview")
        # The refusal is the one 422 (and its console line); nothing else failed.
        assert sorted(page.problems) == [
            "422: " + server.url + "/api/jobs",
            "console: Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)",
        ], page.problems
    finally:
        ctx.close()


# ---------------------------------------------------------------- the run report

# What a runner, a trainer or an old row may carry: markup that must stay text.
EVIL = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
T0 = 1_800_000_000.0


@pytest.fixture(scope="module")
def report(server) -> tuple[str, dict]:
    """The report of an imported run whose name, GPU name and alert carry markup."""
    log = "".join(
        json.dumps({"current_steps": k, "total_steps": 6, "loss": 3.0 - k / 10}) + "\n" for k in range(1, 7)
    )
    memory = "t,gpu,used_bytes,total_bytes\n" + "".join(
        f"{T0 + i},0,{(2 + i) << 30},{64 << 30}\n" for i in range(5)
    )
    r = server.api.post(
        "/api/runs/import", files={"trainer_log": log, "memory": memory}, data={"name": "imported"}
    )
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    with sqlite3.connect(server.workspace / "tunedeck.db") as db:
        db.execute("UPDATE memory_samples SET name = ? WHERE job_id = ?", (EVIL, job))
        db.execute("UPDATE jobs SET name = ? WHERE id = ?", (EVIL, job))  # an old row
        db.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t,"
            " last_t, count) VALUES (?, 'loss_spike', 'warning', NULL, ?, 3, ?, 'lower learning_rate', 0, ?, ?, 1)",
            (job, T0 + 3, EVIL, T0 + 3, T0 + 3),
        )
    r = server.api.get(f"/api/jobs/{job}/report")
    assert r.status_code == 200, r.text
    return r.text, dict(r.headers)


def test_the_report_is_an_attachment_with_everything_in_it(report):
    text, headers = report
    assert headers["content-type"].startswith("text/html")
    assert (
        headers["content-disposition"].startswith("attachment;") and ".html" in headers["content-disposition"]
    )
    assert EVIL not in text and "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in text
    for part in (
        "train.yaml",
        "DeepSpeed",
        "Lint findings",
        "Estimate and measured peak",
        "Alerts",
        "Environment (preflight)",
        "lower learning_rate",
    ):
        assert part in text, part


def test_the_report_renders_offline_and_runs_none_of_its_data(report, browser, tmp_path):
    """Opened from disk with every network request refused, in the reader's dark theme."""
    path = tmp_path / "report.html"
    path.write_text(report[0])
    context = browser.new_context(viewport={"width": 1200, "height": 900}, color_scheme="dark")
    try:
        page = context.new_page()
        requests, errors = [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: (errors.append(f"dialog {d.message}"), d.dismiss()))
        context.route("http*://**/*", lambda route: (requests.append(route.request.url), route.abort()))
        page.goto(path.as_uri())
        page.wait_for_function("window.reportReady === true")
        assert requests == [] and errors == []
        assert page.evaluate("window.pwned") is None
        assert (
            page.locator("h1").inner_text().startswith("#") and "<script>" in page.locator("h1").inner_text()
        )
        assert page.locator("#loss-chart .scatterlayer .trace").count() >= 1
        assert page.locator("#mem-chart .scatterlayer .trace").count() >= 1
        assert "<img" in page.locator("#alerts").inner_text()
        assert page.evaluate("document.getElementById('loss-chart').data[0].y") == [
            2.9,
            2.8,
            2.7,
            2.6,
            2.5,
            2.4,
        ]
        bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert sum(int(x) for x in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]) < 150, bg
        shot(page, "report-dark")
    finally:
        context.close()
