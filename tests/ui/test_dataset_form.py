"""The form's dataset and model fields: the registered datasets and the local models are offered, and
"add a dataset…" uploads a file whose format the server detects, then offers it."""

from __future__ import annotations

import json

import pytest

from tests.ui.conftest import shot

pytestmark = pytest.mark.browser

ROWS = [
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
    {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]},
]


def options(page, list_id: str) -> list[str]:
    return page.eval_on_selector_all(f"#{list_id} option", "els => els.map(e => e.value)")


def test_a_dataset_uploaded_from_the_form_is_offered_and_models_are_listed(
    server_factory, assets, page, tmp_path
):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")
    page.goto(f"{server.url}/new")
    page.wait_for_function("window.tunedeckReady === true")
    model = str((assets / "demo" / "model").resolve())
    assert page.get_attribute("#f-model_name_or_path", "list") == "models-list"
    assert model in options(page, "models-list")
    label = page.eval_on_selector(f'#models-list option[value="{model}"]', "e => e.label")
    assert "Qwen2ForCausalLM" in label and "template qwen" in label
    # With no dataset_dir, the datasets the server has are offered (the demo's own).
    assert {"demo_identity", "demo_identity_small"} <= set(options(page, "datasets-list"))

    upload = tmp_path / "chat rows.jsonl"
    upload.write_text("\n".join(json.dumps(r) for r in ROWS))
    page.click("#add-dataset summary")
    page.fill("#add-dataset-name", "my_chat")
    page.set_input_files("#add-dataset-file", str(upload))
    page.click("#add-dataset-send")
    page.wait_for_function("document.querySelector('#add-dataset-said').textContent.startsWith('Added')")
    said = page.text_content("#add-dataset-said")
    assert "my_chat" in said and "sharegpt, 2 rows" in said, said
    assert page.input_value("#f-dataset") == "my_chat"
    assert page.input_value("#f-dataset_dir") == str((server.workspace / "data").resolve())
    page.wait_for_function(
        "[...document.querySelectorAll('#datasets-list option')].some(o => o.value === 'my_chat')"
    )
    listed = {d["name"]: d for d in server.api.get("/api/datasets").json()["datasets"]}
    assert listed["my_chat"]["formatting"] == "sharegpt" and listed["my_chat"]["rows"] == 2
    page.wait_for_function("document.querySelector('#dataset-preview').textContent.includes('my_chat')")

    # With a model chosen, the rows as the model will see them: its chat template, its tokenizer's count.
    page.fill("#f-model_name_or_path", model)
    page.dispatch_event("#f-model_name_or_path", "change")
    page.fill("#f-cutoff_len", "16")
    page.dispatch_event("#f-dataset", "change")
    page.click("#render-rows")
    page.wait_for_function(
        "document.querySelector('#rendered-said').textContent.startsWith('Template')", timeout=120_000
    )
    assert page.text_content("#rendered-said") == "Template qwen, cutoff_len 16"
    rendered = page.text_content("#rendered-rows")
    assert "<|im_start|>user\nhi<|im_end|>" in rendered and "(over cutoff_len 16: cut)" in rendered, rendered

    # A bad file is refused where it was chosen, naming the row.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"instruction": "q", "output": "a"}, {"instruction": "q2"}]))
    page.fill("#add-dataset-name", "bad_one")
    page.set_input_files("#add-dataset-file", str(bad))
    page.click("#add-dataset-send")
    page.wait_for_function("document.querySelector('#add-dataset-said').textContent.startsWith('Not added')")
    assert "row 2, column 'output': missing" in page.text_content("#add-dataset-said")
    shot(page, "new-job-dataset-added")
    assert page.errors == []
