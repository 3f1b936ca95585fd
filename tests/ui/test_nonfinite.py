"""A run whose loss became Infinity, among others: the team page shows every row and says "inf",
and its job page draws the loss with the inf/NaN points marked, without a script error, and says the
same last loss as the team page (not the last finite one)."""

from __future__ import annotations

import json

import pytest

from tests.ui.conftest import shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def trainer_log(last_loss: float) -> bytes:
    lines = [
        {"current_steps": s, "total_steps": 3, "loss": v, "elapsed_time": f"0:00:0{s}"}
        for s, v in ((1, 2.5), (2, float("nan")), (3, last_loss))
    ]
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def test_team_page_shows_every_row_when_a_loss_is_infinite(server_factory, page):
    server = server_factory()
    ids = []
    for i, last in enumerate((1.5, float("inf"), 1.25, 1.0, 0.75)):
        r = server.api.post(
            "/api/runs/import", files={"trainer_log": trainer_log(last)}, data={"name": f"run {i}"}
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    for width in (1440, 390):  # the same words at both widths
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{server.url}/")
        page.wait_for_function("document.querySelectorAll('#jobs tbody tr').length === 5", timeout=120_000)
        assert page.locator("#count").inner_text() == "5 of 5"
        cell = page.locator(f'tr[data-job="{ids[1]}"] td.nonfinite')
        assert cell.inner_text() == "inf"
        assert page.locator(f'tr[data-job="{ids[0]}"]').inner_text().count("1.5") == 1
        shot(page, f"jobs-page-infinite-loss-{width}")

        page.goto(f"{server.url}/jobs/{ids[1]}")
        page.wait_for_function("window.tunedeckReady === true", timeout=120_000)
        page.wait_for_function("window.tunedeck.metrics.loss.bad.step.length === 2", timeout=120_000)
        assert page.evaluate("window.tunedeck.metrics.loss.bad.value") == ["nan", "inf"]
        assert page.evaluate("window.tunedeck.metrics.loss.y") == [2.5]
        last = page.locator('#summary [data-key="last loss"]')
        assert last.inner_text() == "inf at step 3" and "nonfinite" in last.get_attribute("class")
        # A run whose loss is a number again after a NaN: its last loss is that number on both pages.
        page.goto(f"{server.url}/jobs/{ids[0]}")
        page.wait_for_function("window.tunedeckReady === true", timeout=120_000)
        last = page.locator('#summary [data-key="last loss"]')
        assert last.inner_text() == "1.5 at step 3" and "nonfinite" not in last.get_attribute("class")
        shot(page, f"job-page-infinite-loss-{width}")
        assert page.errors == []
