"""The new-job form opened from an existing job (`/new?from=ID`): its YAML as the starting point."""

from __future__ import annotations

import pytest

from tests.ui.conftest import shot
from tests.utils.servers import demo_config

pytestmark = pytest.mark.browser


def test_a_job_opens_in_the_form_as_a_starting_point(server_factory, assets, page):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")
    config = demo_config(assets, learning_rate=0.00042, neftune_noise_alpha=5)
    job = server.submit({"name": "tuned before", "config": config, "gpus": 0})
    page.goto(f"{server.url}/jobs/{job['id']}")
    page.wait_for_function("document.querySelector('#again').getAttribute('href').includes('from=')")
    assert page.get_attribute("#again", "href") == f"/new?from={job['id']}"
    page.goto(f"{server.url}/new?from={job['id']}")
    page.wait_for_function("window.tunedeckReady === true")
    assert float(page.input_value("#f-learning_rate")) == 0.00042
    assert page.input_value("#f-name") == "tuned before"
    assert page.input_value("#f-model_name_or_path") == str(assets / "demo" / "model")
    extra = page.input_value("#extra")
    assert "neftune_noise_alpha: 5" in extra.splitlines()
    assert not [
        line for line in extra.splitlines() if line.startswith("output_dir:")
    ]  # each job gets its own
    page.fill("#f-learning_rate", "0.0001")
    page.fill("#f-name", "tuned again")
    page.click("#submit")
    page.wait_for_url("**/jobs/*")
    again = server.api.get("/api/jobs", params={"q": "tuned again"}).json()["jobs"][0]
    text = server.api.get(f"/api/jobs/{again['id']}/config").json()["train_yaml"]
    assert "learning_rate: 0.0001\n" in text and "neftune_noise_alpha: 5\n" in text
    shot(page, "new-job-from-job")
    assert page.errors == []
