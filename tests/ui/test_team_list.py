"""Finding a run among many on the team page: search (name and notes), owner, tag and created-after
filters asked of the server, a sort, pages of 50 by cursor, and every choice kept in the address (a
reload shows the same rows). Sixty held jobs of alice's and bob's; nothing trains here."""

from __future__ import annotations

import sqlite3

import pytest

from tests.security.test_auth import token
from tests.ui.conftest import shot
from tests.utils.servers import Server, demo_config

pytestmark = [pytest.mark.browser]
SCREENS = {"wide": (1440, 900), "phone": (390, 844)}
N = 60
OLD = 20  # the first jobs, made "in 2020"


@pytest.fixture(scope="module")
def many(tmp_path_factory, assets):
    ws = tmp_path_factory.mktemp("many") / "ws"
    server = Server(ws, assets, TUNEDECK_OPEN_WRITE="false", TUNEDECK_LAUNCH_PAUSED="true").start()
    tokens = {n: {"Authorization": f"Bearer {token(ws, n, 'submitter')}"} for n in ("alice", "bob")}
    config = demo_config(assets)
    for i in range(N):
        owner = "bob" if i % 2 else "alice"
        r = server.api.post(
            "/api/jobs", json={"name": f"sweep-lr-{i}", "config": config}, headers=tokens[owner]
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        change = {"tags": ["best"]} if i % 10 == 1 else {}
        if i == 33:
            change["notes"] = "the needle: warmup fixed"
        if change:
            assert server.api.patch(f"/api/jobs/{job}", json=change, headers=tokens[owner]).status_code == 200
    with sqlite3.connect(ws / "tunedeck.db") as db:
        db.execute("UPDATE jobs SET created_at = '2020-06-01 12:00:00' WHERE id <= ?", (OLD,))
    server.alice, server.assets = tokens["alice"], assets
    yield server
    server.stop()


def shown(page) -> list[int]:
    return [int(x) for x in page.locator("#jobs tbody tr").evaluate_all("rs => rs.map(r => r.dataset.job)")]


def rows_become(page, want: list[int]) -> None:
    """Waits until the table holds exactly `want`, in that order."""
    page.wait_for_function(
        "want => JSON.stringify([...document.querySelectorAll('#jobs tbody tr')].map(r => +r.dataset.job))"
        " === JSON.stringify(want)",
        arg=want,
    )


@pytest.mark.parametrize("screen", SCREENS)
def test_search_filters_sort_and_pages_are_kept_in_the_address(many, page, screen):
    width, height = SCREENS[screen]
    page.set_viewport_size({"width": width, "height": height})
    newest = [j["id"] for j in many.api.get("/api/jobs", params={"limit": 500}).json()["jobs"]]
    page.goto(f"{many.url}/")
    rows_become(page, newest[:50])  # a page of 50, newest first
    assert page.locator("#newer").is_disabled() and page.locator("#older").is_enabled()
    page.click("#older")
    rows_become(page, newest[50:])
    assert page.locator("#older").is_disabled() and f"after={newest[49]}" in page.url
    page.reload()
    rows_become(page, newest[50:])  # the page's cursor is in the address
    page.click("#newer")
    rows_become(page, newest[:50])

    # Text finds notes as well as names (the server's `q`).
    page.fill("#q", "needle")
    rows_become(page, [34])
    page.fill("#q", "")
    # Owner and tag together: bob's best runs (i % 10 == 1 are bob's, i odd); alice has none.
    page.fill("#owner", "alice")
    page.fill("#tag", "best")
    page.locator("#unmatched").wait_for()
    rows_become(page, [])
    page.fill("#owner", "bob")
    rows_become(page, [i + 1 for i in range(N - 1, -1, -1) if i % 10 == 1])
    # Created after a day: the twenty made in 2020 are gone.
    page.fill("#tag", "")
    page.fill("#since", "2021-01-01")
    rows_become(page, [i + 1 for i in range(N - 1, OLD - 1, -1) if i % 2])
    assert page.locator("#pager").is_hidden()  # 20 rows: one page
    page.select_option("#sort", "name")
    # The rows are drawn again on the next frame: wait for the order, then read it.
    page.wait_for_function(
        """() => { const n = [...document.querySelectorAll('#jobs tbody tr td:nth-child(2) a')].map((a) => a.textContent);
                   return n.length === 20 && n.every((x, i) => i === 0 || n[i - 1] <= x); }""",
    )
    names = page.locator("#jobs tbody tr td:nth-child(2) a").all_inner_texts()
    assert names == sorted(names) and len(names) == 20
    for k, v in (("owner", "bob"), ("since", "2021-01-01"), ("sort", "name")):
        assert f"{k}={v}" in page.url, (k, page.url)

    page.reload()  # the same rows, the same fields
    page.wait_for_function("document.querySelectorAll('#jobs tbody tr').length === 20")
    assert page.locator("#jobs tbody tr td:nth-child(2) a").all_inner_texts() == names
    assert (page.input_value("#owner"), page.input_value("#since"), page.input_value("#sort")) == (
        "bob",
        "2021-01-01",
        "name",
    )
    assert sorted(shown(page)) == sorted(i + 1 for i in range(OLD, N) if i % 2)
    wide = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert wide[0] <= wide[1], wide
    shot(page, f"team-filters-{screen}")

    # A job made now that the filters find joins the page live, without a reload.
    page.fill("#owner", "")
    page.fill("#since", "")
    page.fill("#q", f"found-{screen}")
    page.locator("#unmatched").wait_for()
    spec = {"name": f"found-{screen}", "config": demo_config(many.assets)}
    r = many.api.post("/api/jobs", json=spec, headers=many.alice)
    assert r.status_code == 201, r.text
    rows_become(page, [r.json()["id"]])
    assert page.errors == []


@pytest.mark.parametrize("screen", SCREENS)
def test_compare_picks_from_a_search_and_keeps_old_chosen_jobs_listed(many, page, screen):
    """Compare listed every job as a checkbox: now the chosen ones first, then what a search finds."""
    width, height = SCREENS[screen]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{many.url}/compare?jobs=1")  # job 1 is older than the newest fifty
    page.wait_for_function("window.tunedeckReady === true")
    picks = page.locator("#pick [data-pick]")
    ids = picks.evaluate_all("ls => ls.map(l => +l.dataset.pick)")
    assert ids[0] == 1 and len(ids) == 51, ids  # the chosen one, then a page of the newest
    assert "search to narrow" in page.inner_text("#pick-n")
    page.fill("#pick-q", "needle")
    page.wait_for_function(
        "JSON.stringify([...document.querySelectorAll('#pick [data-pick]')].map(l => +l.dataset.pick))"
        " === '[1,34]'",
    )
    page.locator('[data-pick="34"] input').check()
    page.wait_for_function("location.search.includes('jobs=1%2C34') || location.search.includes('jobs=1,34')")
    page.locator("#diff", has_text="The configs are the same.").wait_for()  # two chosen now
    assert page.locator('[data-pick="1"] input').is_checked() and page.errors == []
    wide = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert wide[0] <= wide[1], wide
    shot(page, f"compare-picker-search-{screen}")
