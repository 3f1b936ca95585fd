"""The chat page of a chat job that has not started: it says the job is queued, waiting for a slot
(and why, as the queue says), not that the model is loading."""

from __future__ import annotations

import pytest

from tests.ui.conftest import shot

pytestmark = [pytest.mark.browser]


def test_a_queued_chat_says_it_waits_for_a_slot(server_factory, assets, strict_page):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")  # nothing starts: the chat stays queued
    chat = server.submit(
        {
            "name": "ask it",
            "kind": "chat",
            "config": {"model_name_or_path": str(assets / "demo" / "model")},
            "gpus": 0,
        }
    )
    job = server.api.get(f"/api/jobs/{chat['id']}").json()
    assert job["status"] == "queued", job
    page = strict_page
    for width in (1440, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{server.url}/jobs/{chat['id']}/chat")
        state = page.locator("#state")
        state.filter(has_text="queued").wait_for()
        text = state.inner_text()
        assert text.startswith("queued") and "waiting for a slot" in text, text
        assert "loading" not in text, text
        if job.get("waiting_for"):
            assert job["waiting_for"] in text, text
        assert page.locator('#status [data-status="queued"]').count() == 1
        assert page.locator("#question").is_disabled()
    shot(page, "chat-queued-phone")
