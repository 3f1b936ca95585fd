"""The form's "Save as preset…": a name and a description in a dialog, the form's YAML checked as a
submit checks it (its errors kept at the fields), the saved preset in the picker with its owner and
description, and deleted from the form; and the job page's and the form's chat starts saying what a
chat job holds and for how long."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.ui.conftest import shot
from tests.utils.servers import demo_config

pytestmark = pytest.mark.browser
PHONE = 390  # the phone width the pages' tests use


def test_save_as_preset_keeps_errors_at_the_fields_and_lists_the_preset(server_factory, assets, page):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_CHAT_IDLE_S="900")
    text = yaml.safe_dump(demo_config(assets), sort_keys=False)
    for width, suffix in ((1440, "wide"), (PHONE, "phone")):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{server.url}/new")
        page.wait_for_function("window.tunedeckReady === true")
        page.click("#toggle-paste")
        page.fill("#paste", text)
        page.click("#import-paste")
        page.locator("#banner .notice").filter(has_text="Imported").wait_for()
        page.fill("#f-max_steps", "-3")

        page.click("#save-preset")
        dialog = page.locator("#preset-dialog")
        dialog.wait_for(state="visible")
        page.fill("#preset-name", f"team sft {suffix}")
        page.fill("#preset-description", f"our LoRA SFT, {suffix}")
        page.click("#preset-save")
        problem = dialog.locator('.preset-problem[data-loc="config.max_steps"]')
        problem.wait_for()
        assert dialog.is_visible()  # nothing saved: the dialog stays, with why
        field = page.locator('[data-field="config.max_steps"]')
        assert "has-error" in (field.get_attribute("class") or "")
        assert field.locator(".field-error").inner_text() in problem.inner_text()
        if suffix == "phone":
            shot(page, "save-preset-refused-phone")
        assert server.api.get(f"/api/presets/team sft {suffix}").status_code == 404

        page.click("#preset-cancel")
        page.fill("#f-max_steps", "5")
        page.click("#save-preset")
        page.fill("#preset-name", "demo_cpu")  # a shipped preset's name: read-only
        page.click("#preset-save")
        taken = dialog.locator('[data-preset-field="name"] .field-error')
        taken.wait_for()
        assert "read-only" in taken.inner_text()
        assert dialog.locator(".preset-problem").count() == 0

        page.fill("#preset-name", f"team sft {suffix}")
        page.click("#preset-save")
        page.locator("#preset-saved").wait_for()
        assert not dialog.is_visible()
        option = page.locator(f'#preset option[value="team sft {suffix}"]')
        assert option.get_attribute("data-source") == "team"
        assert option.inner_text() == f"team sft {suffix} — no owner: our LoRA SFT, {suffix}"
        assert page.input_value("#preset") == f"team sft {suffix}"
        assert page.locator('#preset option[value="demo_cpu"]').get_attribute("data-source") == "shipped"
        saved = server.api.get(f"/api/presets/team sft {suffix}").json()
        assert (saved["source"], saved["description"]) == ("team", f"our LoRA SFT, {suffix}")
        assert yaml.safe_load(saved["text"])["max_steps"] == 5
        assert yaml.safe_load(saved["text"])["model_name_or_path"] == str(assets / "demo" / "model")
        if suffix == "phone":
            shot(page, "save-preset-saved-phone")

        # The saved preset loads back into a fresh form.
        page.goto(f"{server.url}/new?preset=team sft {suffix}")
        page.wait_for_function("window.tunedeckReady === true")
        page.locator("#banner .notice").filter(has_text="Imported").wait_for()
        assert page.input_value("#f-max_steps") == "5"

        # Deleted from the form behind a dialog of its own (open mode: anyone here may); a shipped
        # preset offers no Delete.
        page.locator("#delete-preset").wait_for(state="visible")
        assert page.locator("#delete-preset").is_enabled()
        page.click("#delete-preset")
        page.locator("#delete-preset-dialog").wait_for(state="visible")
        assert f"team sft {suffix}" in page.inner_text("#delete-preset-what")
        page.click("#delete-preset-cancel")
        assert server.api.get(f"/api/presets/team sft {suffix}").status_code == 200
        page.click("#delete-preset")
        page.click("#delete-preset-ok")
        page.locator("#preset-deleted").wait_for()
        assert server.api.get(f"/api/presets/team sft {suffix}").status_code == 404
        assert page.locator(f'#preset option[value="team sft {suffix}"]').count() == 0
        assert page.locator("#delete-preset").is_hidden()
        page.select_option("#preset", "demo_cpu")
        assert page.locator("#delete-preset").is_hidden()
    assert page.errors == []


def test_the_chat_starts_say_what_a_chat_holds(server_factory, page):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_CHAT_IDLE_S="900")
    log = "".join(
        json.dumps({"current_steps": i, "total_steps": 3, "loss": 2.0 - i / 3}) + "\n" for i in (1, 2, 3)
    )
    r = server.api.post(
        "/api/runs/import",
        files={"trainer_log": log.encode()},
        data={"name": "trained"},
        headers={"X-Tunedeck": "1"},
    )
    assert r.status_code == 201, r.text
    job = r.json()
    for width in (1440, PHONE):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{server.url}/jobs/{job['id']}")
        holds = page.locator("#chat-holds").filter(has_text="15 minutes")
        holds.wait_for()
        cpu = "the only CPU slot" if server.api.get("/api/health").json()["cpu_slots"] == 1 else "a CPU slot"
        slot = "its GPU" if job["gpus"] else cpu
        want = f"A chat job holds {slot} until you stop it or it has had no request for 15 minutes."
        assert holds.inner_text() == want
        page.goto(f"{server.url}/new")  # the form's own chat start says it too
        page.wait_for_function("window.tunedeckReady === true")
        page.fill("#f-gpus", "0")
        page.select_option("#f-kind", "chat")
        note = page.locator('[data-field="kind"] #chat-holds').filter(has_text="15 minutes")
        note.wait_for()
        assert (
            note.inner_text()
            == f"A chat job holds {cpu} until you stop it or it has had no request for 15 minutes."
        )
        page.select_option("#f-kind", "train")
        note.wait_for(state="detached")
    assert page.errors == []
