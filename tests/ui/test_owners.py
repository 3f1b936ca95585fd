"""Who owns what, and what I may do: a team server (writes need a token) with alice's and bob's jobs.
The page says who is signed in, signs in through a field of its own (never window.prompt), offers
Stop only where the server would let the caller stop, keeps a refusal on screen through live updates
until it is dismissed, and has "my jobs". Launches are held: nothing trains here."""

from __future__ import annotations

import pytest

from tests.security.test_auth import token
from tests.ui.conftest import shot
from tests.utils.servers import demo_config

pytestmark = [pytest.mark.browser]
SCREENS = {"wide": (1440, 900), "phone": (390, 844)}


@pytest.fixture
def team(server_factory, assets, tmp_path):
    """A loopback server whose writes need a token (reads stay open), two queued jobs of alice's and
    one of bob's; the tokens ride on the server object."""
    server = server_factory(TUNEDECK_OPEN_WRITE="false", TUNEDECK_LAUNCH_PAUSED="true")
    server.tokens = {n: token(tmp_path / "ws", n, "submitter") for n in ("alice", "bob")}
    server.jobs = {}
    server.demo = demo_config(assets)
    for owner, name in (("alice", "alice-first"), ("alice", "alice-second"), ("bob", "bob-one")):
        r = server.api.post(
            "/api/jobs",
            json={"name": name, "config": demo_config(assets)},
            headers={"Authorization": f"Bearer {server.tokens[owner]}"},
        )
        assert r.status_code == 201, r.text
        server.jobs[name] = r.json()["id"]
    return server


def sized(page, screen: str) -> list[str]:
    """The page at `screen`'s size, recording every native dialog it opens (and accepting it)."""
    width, height = SCREENS[screen]
    page.set_viewport_size({"width": width, "height": height})
    opened: list[str] = []
    page.on("dialog", lambda d: (opened.append(d.type), d.accept()))
    return opened


@pytest.mark.parametrize("screen", SCREENS)
def test_bob_signs_in_on_the_page_and_is_offered_only_his_own_jobs(team, page, screen):
    opened = sized(page, screen)
    jobs = team.jobs
    page.goto(f"{team.url}/")
    page.locator(f'tr[data-job="{jobs["bob-one"]}"]').wait_for()
    # Not signed in on a server whose writes need a token: no Stop anywhere, and the page says so.
    page.locator("#me", has_text="not signed in").wait_for()
    assert page.locator("[data-stop]").count() == 0
    assert page.locator("#mine-label").is_hidden()

    page.click("#sign-in")
    page.fill("#signin-token", team.tokens["bob"])
    page.click("#signin-ok")
    page.locator("#me", has_text="bob · submitter").wait_for()
    assert page.evaluate("sessionStorage.getItem('tunedeck.token')") == team.tokens["bob"]
    page.locator(f'[data-stop="{jobs["bob-one"]}"]').wait_for()
    for name in ("alice-first", "alice-second"):
        assert page.locator(f'tr[data-job="{jobs[name]}"]').count() == 1
        assert page.locator(f'[data-stop="{jobs[name]}"]').count() == 0, name

    # My jobs: only bob's, kept in the address (a reload keeps it).
    page.check("#mine")
    page.locator(f'tr[data-job="{jobs["alice-first"]}"]').wait_for(state="detached")
    assert page.locator("#jobs tbody tr").evaluate_all("rs => rs.map(r => r.dataset.job)") == [
        str(jobs["bob-one"])
    ]
    assert "mine=1" in page.url
    page.reload()
    page.locator("#me", has_text="bob · submitter").wait_for()
    page.locator(f'tr[data-job="{jobs["bob-one"]}"]').wait_for()
    assert page.is_checked("#mine")
    assert page.locator("#jobs tbody tr").count() == 1
    shot(page, f"owners-my-jobs-{screen}")

    # The job pages: no Stop on alice's job, Stop on his own; her job's priority shown, its change
    # disabled with the reason.
    page.goto(f"{team.url}/jobs/{jobs['alice-first']}")
    page.wait_for_function("window.tunedeckReady === true")
    page.locator("#me", has_text="bob · submitter").wait_for()
    assert page.locator("#owner").inner_text() == "by alice"
    assert page.locator("#stop").is_hidden()
    assert page.locator("#priority").inner_text() == "0"
    page.locator("#edit-priority").wait_for(state="visible")
    assert page.locator("#edit-priority").is_disabled()
    assert page.locator("#edit-priority").get_attribute("title") == (
        "Only its owner (alice) or an admin may change this job."
    )
    page.goto(f"{team.url}/jobs/{jobs['bob-one']}")
    page.locator("#stop").wait_for(state="visible")
    assert page.locator("#stop").is_enabled()

    # His queued job's priority, changed on its page: a value the server refuses stays on screen, one
    # it takes moves the job up the line (PATCH, as `tunedeck priority` does).
    page.locator("#waiting", has_text="Queued, #3 in line").wait_for()
    page.locator("#edit-priority").wait_for(state="visible")
    page.click("#edit-priority")
    page.fill("#priority-input", "11")
    page.click("#priority-dialog-ok")
    refusal = page.locator("#refusals .refusal", has_text="Changing the priority failed")
    refusal.filter(has_text="priority").wait_for()
    assert refusal.get_attribute("data-status") == "422"
    refusal.locator(".dismiss").click()
    page.click("#edit-priority")
    assert page.input_value("#priority-input") == "0"
    page.fill("#priority-input", "4")
    page.click("#priority-dialog-ok")
    page.locator("#waiting", has_text="Queued, #1 in line (priority 4)").wait_for()
    assert page.locator("#priority").inner_text() == "4"
    assert team.api.get(f"/api/jobs/{jobs['bob-one']}").json()["priority"] == 4
    wide = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert wide[0] <= wide[1], wide
    assert opened == [] and page.errors == []  # never a prompt for the token


@pytest.mark.parametrize("screen", SCREENS)
def test_a_refusal_stays_on_screen_through_live_updates_until_dismissed(team, page, screen):
    opened = sized(page, screen)
    jobs = team.jobs
    page.goto(f"{team.url}/")
    page.evaluate("t => sessionStorage.setItem('tunedeck.token', t)", team.tokens["alice"])
    # Each cancel the page sends goes out with bob's token: the server's own refusal, whatever the page
    # believed when it offered Stop.
    page.route(
        "**/api/jobs/*/cancel",
        lambda route: route.continue_(
            headers={**route.request.headers, "authorization": f"Bearer {team.tokens['bob']}"}
        ),
    )
    second = jobs["alice-second"]
    page.goto(f"{team.url}/jobs/{second}")
    notice = page.locator("#waiting")
    notice.filter(has_text="Queued, #2 in line").wait_for()
    page.locator("#stop").wait_for(state="visible")
    page.click("#stop")
    refusal = page.locator("#refusals .refusal")
    refusal.filter(has_text="only its owner (alice) or an admin may cancel").wait_for()
    assert refusal.get_attribute("data-status") == "403"

    # A live update of this job (the first leaves the queue) re-renders the header: the refusal stays.
    bearer = {"Authorization": f"Bearer {team.tokens['alice']}"}
    assert team.api.post(f"/api/jobs/{jobs['alice-first']}/cancel", headers=bearer).status_code == 200
    notice.filter(has_text="Queued, #1 in line").wait_for()
    assert refusal.count() == 1 and refusal.is_visible()
    assert page.locator("#stop").inner_text() == "Stop" and page.locator("#stop").is_enabled()
    shot(page, f"owners-refusal-kept-{screen}")
    refusal.locator(".dismiss").click()
    assert refusal.count() == 0

    # The team page: the same refusal outlives the rows the stream redraws.
    page.goto(f"{team.url}/")
    page.locator(f'[data-stop="{second}"]').click()
    refusal.filter(has_text=f"may cancel job {second}").wait_for()
    r = team.api.post("/api/jobs", json={"name": "alice-third", "config": team.demo}, headers=bearer)
    assert r.status_code == 201, r.text
    page.locator(f'tr[data-job="{r.json()["id"]}"]').wait_for()
    assert refusal.count() == 1 and refusal.is_visible()
    refusal.locator(".dismiss").click()
    assert refusal.count() == 0
    assert opened == ["confirm", "confirm"] and page.errors == []
