"""A queued job's place in line and what it waits for, on the team page and the job page, kept current."""

from __future__ import annotations

import json
import queue
import threading

import httpx

from tests.ui.conftest import shot
from tests.utils.servers import demo_config


def positions(url: str, job_id: int, out: queue.Queue) -> None:
    """Every queue_position the job's own stream sends, as it sends them, until the server stops."""
    try:
        with httpx.stream("GET", f"{url}/api/stream", params={"job": job_id}, timeout=None) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and '"queue_position"' in line:
                    out.put(json.loads(line[5:])["queue_position"])
    except httpx.RemoteProtocolError:  # the test's end stops the server mid-stream
        pass


def test_queue_place_and_reason_follow_the_queue(server_factory, assets, page):
    # Keep-alive pings far apart: the pages must be woken by the change itself.
    server = server_factory(
        TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_GPU_SLOTS="0", TUNEDECK_STREAM_PING_S="300"
    )
    first = server.submit({"name": "first", "config": demo_config(assets)})["id"]
    second = server.submit({"name": "second", "config": demo_config(assets)})["id"]
    page.goto(f"{server.url}/")
    row = page.locator(f'tr[data-job="{second}"] .waiting')
    row.filter(has_text="#2 · launches paused").wait_for()
    job_page = page.context.new_page()
    job_page.goto(f"{server.url}/jobs/{second}")
    notice = job_page.locator("#waiting")
    notice.filter(has_text="Queued, #2 in line: launches paused").wait_for()

    # The first job leaves the queue: both open pages move the second up without a reload.
    assert server.api.post(f"/api/jobs/{first}/cancel").status_code == 200
    row.filter(has_text="#1 · launches paused").wait_for()
    notice.filter(has_text="Queued, #1 in line: launches paused").wait_for()
    assert page.locator(f'tr[data-job="{first}"] .waiting').count() == 0
    shot(page, "queue-place")
    job_page.close()

    # The job's own stream, read raw: another job's change alone sends its row again.
    third = server.submit({"name": "third", "config": demo_config(assets)})["id"]
    seen: queue.Queue = queue.Queue()
    threading.Thread(target=positions, args=(server.url, third, seen), daemon=True).start()
    assert seen.get(timeout=60) == 2
    assert server.api.post(f"/api/jobs/{second}/cancel").status_code == 200
    assert seen.get(timeout=60) == 1

    # Its owner raises its priority: the team page shows it in the row.
    assert server.api.patch(f"/api/jobs/{third}", json={"priority": 5}).json()["priority"] == 5
    page.locator(f'tr[data-job="{third}"] .waiting').filter(
        has_text="#1 · priority 5 · launches paused"
    ).wait_for()


def test_the_form_sets_priority_pinned_gpus_and_environment(server_factory, assets, page):
    """The queue's fields from the new-job form: what the form cannot read, and what the server
    refuses, is shown at its field; what it submits is on the job, and `/new?from=` brings it back."""
    server = server_factory(TUNEDECK_GPU_SLOTS="2", TUNEDECK_LAUNCH_PAUSED="true")
    page.goto(f"{server.url}/new")
    page.wait_for_function("window.tunedeckReady === true")
    page.fill("#f-name", "pinned")
    page.fill("#f-model_name_or_path", str(assets / "demo" / "model"))
    page.fill("#f-dataset_dir", str(assets / "demo" / "data"))
    page.fill("#f-dataset", "demo_identity")
    page.fill("#f-template", "qwen")
    page.fill("#f-devices", "1,x")
    page.click("#submit")
    err = page.locator('[data-field="devices"] .field-error')
    err.wait_for()
    assert "whole numbers" in err.inner_text()
    page.fill("#f-devices", "5")  # read, and refused by the server: the node has GPUs 0 and 1
    page.fill("#f-env", "NCCL_DEBUG=INFO\nLD_PRELOAD=/tmp/x.so")
    page.click("#submit")
    page.locator('[data-field="devices"] .field-error', has_text="GPU 5").wait_for()
    assert page.locator('[data-field="env"] .field-error').count() == 1, page.inner_text("#banner")
    assert server.api.get("/api/jobs").json()["jobs"] == []
    shot(page, "new-job-queue-fields-refused")

    page.fill("#f-devices", "1")
    page.fill("#f-env", "NCCL_DEBUG=INFO\n\nOMP_NUM_THREADS = 2\n")
    page.fill("#f-priority", "7")
    page.click("#submit")
    page.wait_for_url("**/jobs/*")
    (job,) = server.api.get("/api/jobs").json()["jobs"]
    assert (job["priority"], job["pinned"], job["gpus"]) == (7, [1], 1), job
    env = server.api.get(f"/api/jobs/{job['id']}/config").json()["env"]
    assert env == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "2"}

    page.goto(f"{server.url}/new?from={job['id']}")
    page.wait_for_function("window.tunedeckReady === true")
    assert page.input_value("#f-priority") == "7" and page.input_value("#f-devices") == "1"
    assert page.input_value("#f-env").splitlines() == ["NCCL_DEBUG=INFO", "OMP_NUM_THREADS=2"]
    assert page.errors == []
