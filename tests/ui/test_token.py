"""A server with closed reads: the page asks for a token once and keeps it for the session."""

from __future__ import annotations

from tests.security.test_auth import token
from tests.ui.conftest import shot
from tests.utils.servers import demo_config


def test_page_asks_for_a_token_once(server_factory, assets, page, tmp_path):
    wall = token(tmp_path / "ws", "wall", "viewer")
    server = server_factory(
        TUNEDECK_OPEN_READ="false", TUNEDECK_OPEN_WRITE="false", TUNEDECK_LAUNCH_PAUSED="true"
    )
    admin = token(tmp_path / "ws", "root", "admin")
    r = server.api.post(
        "/api/jobs",
        json={"name": "held", "config": demo_config(assets)},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert r.status_code == 201
    asked: list[str] = []

    def answer(dialog):  # noqa: ANN001
        asked.append(dialog.message)
        dialog.accept(wall)

    page.on("dialog", answer)
    page.goto(f"{server.url}/jobs/1")  # a page that sends several requests at once asks only once
    page.wait_for_selector('#status [data-status="queued"]', timeout=30_000)
    page.goto(f"{server.url}/")
    page.locator('tr[data-job="1"]').wait_for(timeout=30_000)
    assert len(asked) == 1 and "token" in asked[0]
    assert len(asked) == 1
    assert page.evaluate("sessionStorage.getItem('tunedeck.token')") == wall
    shot(page, "jobs-page-with-token")


def test_output_and_errors_are_shown_as_text(server_factory, assets, page):
    """A hostile line in a job's output is text on the page, never markup."""
    import sqlite3

    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")
    job = server.submit({"name": "held", "config": demo_config(assets)})
    evil = '<img src=x onerror="window.pwned=1"><b>bold</b>'
    with sqlite3.connect(server.workspace / "tunedeck.db") as db:
        db.execute(
            "INSERT INTO log_lines (job_id, line, t, stream, text) VALUES (?, 0, 1.0, 'stderr', ?)",
            (job["id"], evil),
        )
    page.goto(f"{server.url}/jobs/{job['id']}")
    page.wait_for_function("document.querySelector('#logs').textContent.includes('onerror')", timeout=30_000)
    assert page.evaluate("window.pwned") is None
    assert page.locator("#logs img, #logs b").count() == 0


def test_a_viewer_compares_jobs_with_one_prompt(server_factory, assets, page, tmp_path):
    """Reading a job's YAML back into fields changes nothing: a viewer's token is enough for it."""
    wall = token(tmp_path / "ws", "wall", "viewer")
    server = server_factory(
        TUNEDECK_OPEN_READ="false", TUNEDECK_OPEN_WRITE="false", TUNEDECK_LAUNCH_PAUSED="true"
    )
    admin = {"Authorization": f"Bearer {token(tmp_path / 'ws', 'root', 'admin')}"}
    for lr in (1e-4, 3e-4):
        r = server.api.post(
            "/api/jobs",
            json={"name": f"lr {lr}", "config": demo_config(assets, learning_rate=lr)},
            headers=admin,
        )
        assert r.status_code == 201, r.text
    asked: list[str] = []

    def answer(dialog) -> None:
        asked.append(dialog.message)
        dialog.accept(wall)

    page.on("dialog", answer)
    page.goto(f"{server.url}/compare?jobs=1,2")
    page.wait_for_function("window.tunedeckReady === true", timeout=60_000)
    assert "learning_rate" in page.locator("#diff").inner_text()
    assert len(asked) == 1 and page.errors == []
    shot(page, "compare-as-viewer")
