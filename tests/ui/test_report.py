"""A stopped job says who stopped it, where, and what it saved; the run report is one HTML file that
renders its charts with no network and runs none of the markup its data carries."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import OUTPUT, demo_config
from tests.utils.factories import create_job, create_token, post_telemetry

RUNNER = "runner-secret"
# What a runner, a trainer or an old row may carry: markup that must stay text.
EVIL = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


def points(n: int) -> list[dict]:
    return [
        {"current_steps": k, "total_steps": 10, "loss": 3.0 - k / 10, "lr": 2e-4, "percentage": 10 * k}
        for k in range(1, n + 1)
    ]


def stopped_job(app, assets, *, owner: str, adapter: bool, steps: int = 3):
    job = create_job(
        app.engine, app.settings, config=demo_config(assets), name="stop-me", owner=owner, runner_token=RUNNER
    )
    token = create_token(app.engine, owner)
    assert post_telemetry(app.api, job.id, RUNNER, seq=0, points=points(steps)).status_code == 200
    out = Path(job.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if adapter:  # what LLaMA-Factory's graceful stop writes into the output root
        (out / "adapter_model.safetensors").write_bytes(b"\0" * 16)
        (out / "adapter_config.json").write_text("{}")
    r = app.api.post(f"/api/jobs/{job.id}/cancel", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    # The runner reports the stop, unless the scheduler, seeing the signalled stand-in gone, ended it first.
    states = [{"event": "exited", "exit_code": 0, "cancelled": True}]
    assert post_telemetry(app.api, job.id, RUNNER, seq=1, states=states).status_code in (200, 401)
    app.wait(job.id, ("cancelled",), timeout=120)
    return app.api.get(f"/api/jobs/{job.id}").json()


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    from tests.utils.app import App

    app = App(tmp_path_factory.mktemp("ws"), assets).start()
    yield app
    app.stop()


def test_a_stopped_job_says_who_stopped_it_at_which_step_and_what_it_saved(app, assets):
    got = stopped_job(app, assets, owner="alice", adapter=True)
    assert got["status"] == "cancelled"
    assert got["stopped"] == "stopped by alice at step 3, adapter saved"
    got = stopped_job(app, assets, owner="bob", adapter=False, steps=2)
    assert got["stopped"] == "stopped by bob at step 2, no adapter saved"
    listed = {j["id"]: j for j in app.api.get("/api/jobs").json()["jobs"]}
    assert listed[got["id"]]["stopped"] == got["stopped"]
    queued = app.submit({"name": "never-ran", "config": demo_config(assets), "gpus": 0})
    assert queued["stopped"] is None
    got = app.api.post(f"/api/jobs/{queued['id']}/cancel").json()  # an open server: no token
    assert got["stopped"] == "cancelled by a request without a token before it started"


@pytest.fixture(scope="module")
def report(app, assets) -> tuple[str, dict]:
    """The report of a stopped job whose name, GPU name and alert carry markup."""
    job = stopped_job(app, assets, owner="carol", adapter=True, steps=6)
    memory = [
        {"line": i, "t": 1_800_000_000.0 + i, "gpu": 0, "used_bytes": (2 + i) << 30, "total_bytes": 64 << 30,
         "name": EVIL}
        for i in range(5)
    ]  # fmt: skip
    job2 = create_job(app.engine, app.settings, config=demo_config(assets), name="mem", runner_token="r2")
    assert post_telemetry(app.api, job2.id, "r2", seq=0, memory=memory).status_code == 200
    with sqlite3.connect(app.workspace / "tunedeck.db") as db:
        db.execute("UPDATE memory_samples SET job_id = ? WHERE job_id = ?", (job["id"], job2.id))
        db.execute("UPDATE jobs SET name = ? WHERE id = ?", (EVIL, job["id"]))  # an old row, an import
        db.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t,"
            " last_t, count) VALUES (?, 'loss_spike', 'warning', NULL, 1800000003, 3, ?,"
            " 'lower learning_rate', 0, 1800000003, 1800000003, 1)",
            (job["id"], EVIL),
        )
    r = app.api.get(f"/api/jobs/{job['id']}/report")
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
        "stopped by carol at step 6, adapter saved",
        "lower learning_rate",
    ):
        assert part in text, part


def test_the_report_renders_offline_and_runs_none_of_its_data(report, browser, tmp_path):
    text, _ = report
    path = tmp_path / "report.html"
    path.write_text(text)
    for scheme in ("dark",):  # the report follows the reader's theme too
        context = browser.new_context(viewport={"width": 1200, "height": 900}, color_scheme=scheme)
        page = context.new_page()
        requests, errors = [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: (errors.append(f"dialog {d.message}"), d.dismiss()))
        context.route("http*://**/*", lambda route: (requests.append(route.request.url), route.abort()))
        page.goto(path.as_uri())
        page.wait_for_function("window.reportReady === true", timeout=60_000)
        assert requests == [] and errors == []
        assert page.evaluate("window.pwned") is None
        assert (
            page.locator("h1").inner_text().startswith("#") and "<script>" in page.locator("h1").inner_text()
        )
        assert page.locator("#loss-chart .scatterlayer .trace").count() >= 1
        assert page.locator("#mem-chart .scatterlayer .trace").count() >= 1
        assert "<img" in page.locator("#alerts").inner_text()
        assert page.evaluate("document.getElementById('loss-chart').data[0].y.length") == 6
        bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
        rgb = [int(x) for x in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]]
        assert (sum(rgb) < 150) == (scheme == "dark"), bg
        (OUTPUT / "ui").mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / "ui" / f"report-{scheme}.png"), full_page=True)
        context.close()
