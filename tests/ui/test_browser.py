"""The browser UI against a real server and a real CPU demo fine-tune: submit from the form, see the
job on the team page, watch loss and memory arrive on its page, stop it; import a YAML; see a
validation error at its field. Screenshots go to test-output/ui/."""

from __future__ import annotations

import sqlite3

import pytest

from tests.ui.conftest import shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WAIT = 240_000  # ms: a tiny CPU fine-tune on a shared 2-core machine


def ready(page) -> None:
    page.wait_for_function("window.tunedeckReady === true")


def test_submit_watch_and_stop(server_factory, assets, page):
    server = server_factory()
    page.goto(f"{server.url}/new")
    ready(page)
    page.select_option("#preset", "demo_cpu")
    page.click("#load-preset")
    page.wait_for_function("document.querySelector('#f-stage').value === 'sft'")
    page.fill("#f-name", "ui-run")
    page.fill("#f-model_name_or_path", str(assets / "demo" / "model"))
    page.fill("#f-dataset_dir", str(assets / "demo" / "data"))
    page.fill("#f-max_steps", "3000")
    page.fill("#f-logging_steps", "1")
    page.fill("#f-save_steps", "1000")
    page.fill("#f-gpus", "0")
    page.click("#preview")
    page.wait_for_function("document.querySelector('#preview-out').textContent.includes('max_steps: 3000')")
    shot(page, "new-job-form")
    page.click("#submit")
    page.wait_for_url("**/jobs/*")
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    # The team page lists it, live.
    page.goto(f"{server.url}/")
    row = page.locator(f'tr[data-job="{job_id}"]')
    row.wait_for()
    assert "ui-run" in row.inner_text()
    page.wait_for_selector(f'tr[data-job="{job_id}"][data-status="running"]', timeout=WAIT)
    shot(page, "jobs-page")

    # Its page: loss points arrive over the stream; the memory chart has a curve.
    row.locator("a").click()
    page.wait_for_url(f"**/jobs/{job_id}")
    ready(page)
    page.wait_for_function(
        "window.tunedeck.metrics.loss && window.tunedeck.metrics.loss.y.length >= 5", timeout=WAIT
    )
    page.wait_for_function("[...window.tunedeck.mem.values()].some(g => g.y.length >= 2)", timeout=WAIT)
    n = page.evaluate("window.tunedeck.metrics.loss.y.length")
    page.wait_for_function(
        f"window.tunedeck.metrics.loss.y.length > {n}", timeout=WAIT
    )  # still arriving live
    assert page.locator("#loss-chart .scatterlayer .trace").count() >= 2
    assert page.locator("#mem-chart .scatterlayer .trace").count() >= 1
    page.wait_for_function("document.querySelector('#logs').textContent.length > 0", timeout=WAIT)
    assert "max_steps: 3000" in page.inner_text("#train-yaml")
    page.check("#logy")
    shot(page, "job-page-running")

    page.once("dialog", lambda d: d.accept())  # Stop asks first
    page.click("#stop")
    page.wait_for_selector('#status [data-status="cancelled"]', timeout=WAIT)
    assert page.locator("#stop").is_disabled()
    stopped = page.locator("#stopped")
    stopped.wait_for(timeout=WAIT)
    assert "stopped by" in stopped.inner_text() and " at step " in stopped.inner_text()
    assert server.api.get(f"/api/jobs/{job_id}").json()["status"] == "cancelled"

    # An alert, as the alert engine stores one: it reaches the open page and the team page live.
    t = page.evaluate("window.tunedeck.metrics.loss.t.at(-1)")
    with sqlite3.connect(server.workspace / "tunedeck.db") as con:
        con.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t,"
            " last_t, count) VALUES (?, 'loss_spike', 'warning', NULL, ?, 3, 'loss jumped 3x in one step',"
            " 'lower learning_rate', 1, ?, ?, 1)",
            (job_id, t, t, t),
        )
    item = page.locator('.alert-item[data-kind="loss_spike"]')
    item.wait_for()
    assert "lower learning_rate" in item.inner_text()
    shot(page, "job-page-cancelled")

    page.goto(f"{server.url}/compare?jobs={job_id}")
    ready(page)
    shot(page, "compare")
    page.goto(f"{server.url}/nodes")
    ready(page)
    shot(page, "nodes")
    assert page.errors == []


def test_import_yaml_fills_fields(server_factory, assets, page, tmp_path):
    server = server_factory()
    page.goto(f"{server.url}/new")
    ready(page)
    text = (
        "model_name_or_path: demo/model\nstage: sft\nfinetuning_type: lora\nlora_target: all\n"
        "dataset: demo_identity\ntemplate: qwen\nlearning_rate: 1.0e-4\nfp16: true\n"
        "num_train_epochs: 3.0\nneftune_noise_alpha: 5\ndeepspeed: examples/deepspeed/ds_z3_rocm.json\n"
    )
    path = tmp_path / "qwen2_lora_sft.yaml"
    path.write_text(text)
    page.set_input_files("#import-file", str(path))
    page.wait_for_function("document.querySelector('#f-learning_rate').value !== ''")
    assert float(page.input_value("#f-learning_rate")) == 1e-4
    assert page.input_value("#f-fp16") == "true"  # the preset's fp16.enabled: true must agree (DS006)
    assert page.input_value("#f-finetuning_type") == "lora"
    assert page.input_value("#f-name") == "qwen2_lora_sft"
    assert "neftune_noise_alpha: 5" in page.input_value("#extra")  # a key the form has no field for
    assert page.input_value("#ds-mode") == "path:examples/deepspeed/ds_z3_rocm.json"
    # The preview renders what would run; the ROCm ZeRO-3 preset stands in for the examples/ path.
    page.fill("#f-model_name_or_path", str(assets / "demo" / "model"))
    page.fill("#f-dataset_dir", str(assets / "demo" / "data"))  # where demo_identity is defined
    page.fill("#f-gpus", "0")
    page.click("#preview")
    page.wait_for_function("document.querySelector('#preview-out').textContent.includes('learning_rate')")
    out = page.inner_text("#preview-out")
    assert "neftune_noise_alpha: 5" in out and "zero_optimization" in out
    shot(page, "new-job-imported")
    # The estimate counts the nodes: ZeRO-3 shards over one rank a node on the CPU.
    page.fill("#f-nodes", "2")
    page.click("#check")
    page.wait_for_function("document.querySelector('#checks').textContent.includes('Estimate:')")
    assert "(2 nodes × CPU: ZeRO shards over 2 ranks)" in page.inner_text("#checks")
    assert page.errors == []


def bad_form(page, url: str, assets) -> None:
    """The form with an outside model folder and a misspelt key; Lint & estimate marks the errors at
    their fields too, as Submit does."""
    page.goto(f"{url}/new")
    ready(page)
    page.fill("#f-name", "bad")
    page.fill("#f-model_name_or_path", "/etc")
    page.fill("#f-dataset", "demo_identity")
    page.fill("#f-dataset_dir", str(assets / "demo" / "data"))
    page.fill("#extra", "learning_rte: 0.001\n")
    page.fill("#f-gpus", "0")
    page.click("#check")
    checked = page.locator('[data-field="extra"] .field-error')
    checked.wait_for()
    assert "LF001" in checked.inner_text() and "learning_rate" in checked.inner_text()
    assert page.locator('[data-field="extra"].has-error').count() == 1


def test_validation_errors_show_at_their_fields(server_factory, assets, page):
    server = server_factory()
    page.set_viewport_size({"width": 390, "height": 844})  # a phone first, then the wide page submits
    bad_form(page, server.url, assets)
    page.set_viewport_size({"width": 1440, "height": 900})
    bad_form(page, server.url, assets)
    page.click("#submit")
    model_err = page.locator('[data-field="config.model_name_or_path"] .field-error')
    model_err.wait_for()
    assert "outside the allowed roots" in model_err.inner_text()
    extra_err = page.locator('[data-field="extra"] .field-error')
    assert "learning_rate" in extra_err.inner_text()  # "did you mean 'learning_rate'?"
    assert page.locator('[data-field="config.model_name_or_path"].has-error').count() == 1
    assert "/new" in page.url  # nothing was submitted
    assert server.api.get("/api/jobs").json()["jobs"] == []
    shot(page, "new-job-errors")
    assert page.errors == []
