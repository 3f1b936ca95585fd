"""A running job says what its trainer is doing, on the team page's row and on the job page, through the
real runner's reporting path: a stand-in trainer prints a real run's lines and the start of an op build,
then holds until the test lets it go."""

from __future__ import annotations

from pathlib import Path

from tests.ui.conftest import shot
from tests.utils.servers import demo_config
from tests.utils.standin import release, training_env
from tests.utils.wait import until


def test_the_row_and_the_page_show_the_phase_and_its_duration(server_factory, assets, tmp_path, page):
    server = server_factory(TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "env")))
    job = server.submit({"name": "phased", "gpus": 0, "config": demo_config(assets)})

    def building() -> dict | None:
        j = server.api.get(f"/api/jobs/{job['id']}").json()
        return j if j["phase"] == "building_op" else None

    j = until(building, "the op build reported", explain=lambda: server.explain(job["id"]))
    assert j["status"] == "running" and j["phase_at"]

    page.goto(f"{server.url}/")
    cell = page.locator(f'tr[data-job="{job["id"]}"] .phase')
    cell.filter(has_text="building a DeepSpeed op (").wait_for()
    assert cell.get_attribute("data-phase") == "building_op"
    status = page.locator(f'tr[data-job="{job["id"]}"] td').nth(3).inner_text()
    assert status.startswith("running · building a DeepSpeed op ("), status
    shot(page, "phase-row")

    job_page = page.context.new_page()
    job_page.goto(f"{server.url}/jobs/{job['id']}")
    phase = job_page.locator("#phase")
    phase.filter(has_text="· building a DeepSpeed op (").wait_for()
    logs = job_page.locator("#logs")
    logs.filter(has_text="phase: building a DeepSpeed op").wait_for()

    # The build ends and training begins: both pages follow without a reload; the finished job keeps
    # its last phase, which a success does not show.
    release(Path(job["run_dir"]))
    done = server.wait(job["id"], ("succeeded", "failed", "cancelled"))
    assert done["status"] == "succeeded" and done["phase"] == "training", done
    page.locator(f'tr[data-job="{job["id"]}"][data-status="succeeded"]').wait_for()
    assert cell.count() == 0
    job_page.locator('#status [data-status="succeeded"]').wait_for()
    assert job_page.locator("#phase").is_hidden()
    text = logs.inner_text()
    assert text.index("phase: building a DeepSpeed op") < text.index("phase: training"), text
    shot(job_page, "phase-job-page")
    job_page.close()
