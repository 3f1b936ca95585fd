"""A server with closed reads: the page asks for a token once, in a sign-in dialog of its own (never
window.prompt), and keeps it for the session."""

from __future__ import annotations

from tests.security.test_auth import token
from tests.ui.conftest import shot
from tests.utils.servers import demo_config


def sign_in(page, tok: str) -> str:
    """Answers the page's sign-in dialog with `tok`; returns the reason it gave for asking."""
    dialog = page.locator("dialog#signin")
    dialog.wait_for()
    why = page.locator("#signin-why").inner_text()
    page.fill("#signin-token", tok)
    page.click("#signin-ok")
    dialog.wait_for(state="detached")
    return why


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
    opened: list[str] = []
    page.on("dialog", lambda d: (opened.append(d.type), d.dismiss()))
    page.goto(f"{server.url}/jobs/1")  # a page that sends several requests at once asks only once
    signed = sign_in(page, wall)
    assert "needs a token" in signed
    page.wait_for_selector('#status [data-status="queued"]')
    page.locator("#me", has_text="wall · viewer").wait_for()
    assert page.locator("#signin").count() == 0
    assert page.locator("#stop").is_hidden()  # a viewer stops nothing: not offered
    page.goto(f"{server.url}/")
    page.locator('tr[data-job="1"]').wait_for()
    assert page.locator("#signin").count() == 0 and opened == []
    page.locator("#me", has_text="wall · viewer").wait_for()
    page.locator("a.button[href='/new']").wait_for(state="hidden")  # a viewer submits nothing
    assert page.locator("[data-stop]").count() == 0
    assert page.evaluate("sessionStorage.getItem('tunedeck.token')") == wall
    shot(page, "jobs-page-with-token")
    page.goto(f"{server.url}/new")  # the form lints and previews for a viewer, and offers no Submit
    page.locator("#no-submit").wait_for()
    assert page.locator("#submit").is_hidden() and page.locator("#check").is_visible()
    assert page.locator("#signin").count() == 0 and opened == []


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
    page.wait_for_function("document.querySelector('#logs').textContent.includes('onerror')")
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
    opened: list[str] = []
    page.on("dialog", lambda d: (opened.append(d.type), d.dismiss()))
    page.goto(f"{server.url}/compare?jobs=1,2")
    sign_in(page, wall)
    page.wait_for_function("window.tunedeckReady === true")
    assert "learning_rate" in page.locator("#diff").inner_text()
    assert page.locator("#signin").count() == 0 and opened == [] and page.errors == []
    shot(page, "compare-as-viewer")
