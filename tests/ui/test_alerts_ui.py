"""Alerts as a person sees them, in headless Chromium against one real server: the team page shows each
job's worst alert ever (info never as a warning) and a run that went NaN as "succeeded with problems";
/nodes lists recent problems of finished runs; a CPU job's memory is "host memory"; advice offers its
change as a new job in one click; an alert that closes changes the open pages at once."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.ui.conftest import shot
from tests.utils.factories import create_job, post_telemetry
from tests.utils.runs import decaying, imported, memory_csv
from tests.utils.servers import Server, demo_config
from tests.utils.wait import until
from tunedeck.config import Settings
from tunedeck.store.db import make_engine

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WAIT = 120_000  # ms: a generous deadline on a shared machine, never a measure of speed
GiB = 1024**3


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    s = Server(tmp_path_factory.mktemp("alerts-ui") / "ws", assets, TUNEDECK_LAUNCH_PAUSED="true").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def runs(server) -> dict[str, int]:
    rng = np.random.default_rng(3)
    calm = 40 * GiB + rng.normal(0, 0.05 * GiB, 237)
    host = 3 * GiB + rng.normal(0, 0.01 * GiB, 237)
    host[80] += 6 * GiB
    return {
        "nan": imported(
            server.api, "went-nan", [2.5, 2.4, float("nan"), 18.0], "fp16: true\nlearning_rate: 1.0e-4\n"
        )["id"],
        "calm": imported(server.api, "calm", decaying(), memory=memory_csv(0, calm, 192 * GiB))["id"],
        "cpu": imported(server.api, "cpu-run", decaying(), memory=memory_csv(-1, host, 64 * GiB))["id"],
    }


def ready(page) -> None:
    page.wait_for_function("window.tunedeckReady === true", timeout=WAIT)


def test_team_views_show_the_worst_alert_ever_problems_and_the_change_to_run(server, runs, page):
    clones: list = []

    def clone(route):  # the clone route is another part's; what the page sends is what is checked here
        clones.append((route.request.method, route.request.url, route.request.post_data_json))
        route.fulfill(status=201, content_type="application/json", body=json.dumps({"id": 4242}))

    page.route("**/api/jobs/*/clone", clone)
    page.goto(f"{server.url}/")
    row = page.locator(f'tr[data-job="{runs["nan"]}"]')
    row.locator('[data-verdict="succeeded_with_problems"]').wait_for(timeout=WAIT)
    assert "succeeded with problems" in row.inner_text()
    bad = row.locator("td.alerts .badge")
    assert bad.get_attribute("data-severity") == "critical" and "critical 1" in bad.inner_text()
    calm = page.locator(f'tr[data-job="{runs["calm"]}"]')
    info = calm.locator("td.alerts .badge")
    assert info.get_attribute("data-severity") == "info" and "sev-info" in info.get_attribute("class")
    assert info.inner_text().startswith("ℹ") and "⚠" not in info.inner_text()
    assert calm.locator('[data-status="succeeded"]').inner_text() == "succeeded"

    page.goto(f"{server.url}/nodes")
    page.locator('#recent .alert-item[data-kind="loss_nan"]').wait_for(
        timeout=WAIT
    )  # not after the GPU probe
    assert page.locator("#alerts").inner_text().startswith("No open alerts; ")  # and it says where to look
    assert "recent problem" in page.locator("#alerts").inner_text()
    assert page.locator('#recent .alert-item[data-kind="loss_nan"]').count() == 1
    assert "finished runs" in page.locator("#recent-what").inner_text()
    shot(page, "alerts-nodes-recent-problems")

    page.goto(f"{server.url}/jobs/{runs['nan']}")
    ready(page)
    assert page.locator("#status").inner_text() == "succeeded with problems"
    item = page.locator('.alert-item[data-kind="loss_nan"]')
    item.wait_for(timeout=WAIT)
    assert "bf16: true" in item.locator(".change").inner_text()
    shot(page, "alerts-run-again")
    item.locator("button.rerun").click()  # "Run again with this change": the new job's page follows
    page.wait_for_url("**/jobs/4242", timeout=WAIT)
    assert clones == [
        ("POST", f"{server.url}/api/jobs/{runs['nan']}/clone", {"overrides": {"bf16": True, "fp16": False}})
    ]

    page.goto(f"{server.url}/jobs/{runs['cpu']}")
    ready(page)
    item = page.locator('.alert-item[data-kind="vram_spike"]')
    item.wait_for(timeout=WAIT)
    text = page.locator("#alerts").inner_text()
    assert "host memory" in item.inner_text() and "GPU -1" not in text
    names = page.evaluate("document.getElementById('mem-chart').data.map((t) => t.name)")
    assert "host memory (CPU job) used" in names and not any("GPU -1" in n for n in names)
    shot(page, "alerts-host-memory")
    assert [e for e in page.errors if "4242" not in e] == []  # job 4242 was the stand-in answer's


def test_an_alert_that_closes_changes_the_open_pages_at_once(server, assets, page):
    with pytest.MonkeyPatch.context() as mp:  # the server's own settings, read as it reads them
        for k, v in server.env.items():
            if k.startswith("TUNEDECK_"):
                mp.setenv(k, v)
        settings = Settings()
    engine = make_engine(settings.db_path)
    job = create_job(engine, settings, config=demo_config(assets), name="live", runner_token="r")
    engine.dispose()
    points = [{"current_steps": 1, "loss": 2.5}, {"current_steps": 2, "loss": float("nan")}]
    assert post_telemetry(server.api, job.id, "r", seq=0, points=points).status_code == 200
    team = page.context.new_page()
    team_errors: list[str] = []
    team.on("pageerror", lambda e: team_errors.append(str(e)))
    team.goto(f"{server.url}/")
    badge = team.locator(f'tr[data-job="{job.id}"] td.alerts .badge')
    page.goto(f"{server.url}/jobs/{job.id}")
    ready(page)
    page.locator('.alert-item[data-kind="loss_nan"][data-open="1"]').wait_for(timeout=WAIT)
    expect(badge).to_contain_text("1 open", timeout=WAIT)
    # The loss is finite again: the engine closes loss_nan, and both pages change without a reload.
    post_telemetry(server.api, job.id, "r", seq=1, start_line=2, points=[{"current_steps": 3, "loss": 2.2}])
    page.locator('.alert-item[data-kind="loss_nan"][data-open="0"]').wait_for(timeout=WAIT)
    assert "resolved" in page.locator('.alert-item[data-kind="loss_nan"]').inner_text()
    expect(badge).not_to_contain_text("open", timeout=WAIT)
    assert badge.get_attribute("data-severity") == "critical"  # the worst it ever had stays shown
    shot(page, "alerts-closed-live")
    server.api.post(f"/api/jobs/{job.id}/cancel")
    assert page.errors == [] and team_errors == []


@pytest.mark.parametrize("width", ["wide", "phone"])
def test_a_stall_shows_where_each_rank_waits_from_the_dumps_it_asked_for(server, assets, page, width):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in server.env.items():
            if k.startswith("TUNEDECK_"):
                mp.setenv(k, v)
        settings = Settings()
    engine = make_engine(settings.db_path)
    job = create_job(engine, settings, config=demo_config(assets), name=f"hung {width}", runner_token="h")
    engine.dispose()
    # Steps that ended hours ago: a stall, which asks the job's runners for stack dumps.
    points = [{"current_steps": i, "total_steps": 100, "loss": 2.0} for i in range(1, 21)]
    assert (
        post_telemetry(server.api, job.id, "h", seq=0, points=points, t=time.time() - 20000).status_code
        == 200
    )
    until(lambda: server.api.get(f"/api/jobs/{job.id}/stacks").status_code == 200, "the stall's dump request")
    frames = [
        {"name": "all_reduce", "file": "/v/torch/distributed/distributed_c10d.py", "line": 2500},
        {"name": "backward", "file": "/v/torch/autograd/__init__.py", "line": 200},
    ]
    body = {  # what the runner of the job's one node sends for the request
        "request": 1,
        "node": "gpu-a",
        "processes": [
            {
                "pid": 4321,
                "rank": 0,
                "threads": [{"name": "MainThread", "frames": frames}],
                "flight": {  # the job turned torch's flight recorder on
                    "source": "asked",
                    "groups": [{"pg": "0", "last_enqueued": 9, "last_completed": 8}],
                    "pending": [{"pg": "0", "seq": 9, "op": "all_reduce"}],
                },
            }
        ],
    }
    r = server.api.post(
        f"/api/jobs/{job.id}/telemetry/stacks", json=body, headers={"Authorization": "Bearer h"}
    )
    assert r.status_code == 200, r.text
    page.set_viewport_size(
        {"width": 1440, "height": 900} if width == "wide" else {"width": 390, "height": 844}
    )
    page.goto(f"{server.url}/jobs/{job.id}")
    ready(page)
    stall = page.locator('.alert-item[data-kind="stall"]')
    stall.wait_for(timeout=WAIT)
    stall.locator("button.stacks-show").click()
    expect(stall.locator(".stacks-summary")).to_have_text(
        "Where each rank waits: rank 0 in all_reduce (backward)", timeout=WAIT
    )
    expect(stall.locator(".stacks-flight")).to_have_text(
        "Flight recorder: rank 0 in all_reduce #9, not completed"
    )
    expect(stall.locator(".stacks-ranks li")).to_have_text(
        ["rank 0 on gpu-a (pid 4321): all_reduce (backward)"]
    )
    assert stall.locator("a").get_attribute("href") == f"/api/jobs/{job.id}/stacks?request=1"
    # Asking again: a new request, whose dump is still on its way.
    stall.locator("button.stacks-again").click()
    expect(stall.locator(".stacks-summary")).to_contain_text("no runner has sent its dump yet", timeout=WAIT)
    assert server.api.get(f"/api/jobs/{job.id}/stacks").json()["request"] == 2
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, f"alerts-stall-stacks-{width}")
    server.api.post(f"/api/jobs/{job.id}/cancel")
    assert page.errors == []
