"""Every lifecycle action on the job page (issue 29 §2), at 1440 and 390 px, on a team server whose reads
and writes need a token: resume from a checkpoint picker, downloads of the adapter, a checkpoint, a file
and the whole output (through fetch with the Authorization header: a plain link would get 401), tags and
notes, export, chat, delete behind an in-page dialog, and "Edit as new…" keeping the lineage and the
queue's fields. bob sees alice's job with each action he may not take disabled and the reason said; a
refusal stays on screen through a live update until dismissed.

Launches are held: nothing trains. The stopped job's output folder gets the files a stop leaves (the
adapter at the root, `checkpoint-N` folders), written as the trainer writes them; the lifecycle routes
read only those files (tests/integration/test_lifecycle.py resumes a real run)."""

from __future__ import annotations

import io
import re
import sqlite3
import zipfile
from pathlib import Path

import pytest

from tests.security.test_auth import bearer, token
from tests.ui.conftest import shot
from tests.utils.servers import demo_config

pytestmark = [pytest.mark.browser]
SCREENS = {"wide": (1440, 900), "phone": (390, 844)}
WEIGHTS = bytes(range(256)) * 64


@pytest.fixture
def team(server_factory, assets, tmp_path):
    """alice's stopped job (an adapter and two checkpoints, one resumable) and a queued one of hers."""
    server = server_factory(
        TUNEDECK_OPEN_WRITE="false", TUNEDECK_OPEN_READ="false", TUNEDECK_LAUNCH_PAUSED="true"
    )
    server.tokens = {n: token(tmp_path / "ws", n, "submitter") for n in ("alice", "bob")}
    alice = bearer(server.tokens["alice"])
    server.alice = alice
    jobs = {}
    for name, extra in (("stopped", {"priority": 3, "env": {"OMP_NUM_THREADS": "2"}}), ("waiting", {})):
        spec = {"name": name, "config": demo_config(assets), "gpus": 0, **extra}
        r = server.api.post("/api/jobs", json=spec, headers=alice)
        assert r.status_code == 201, r.text
        jobs[name] = r.json()
    r = server.api.post(f"/api/jobs/{jobs['stopped']['id']}/cancel", headers=alice)
    assert r.json()["status"] == "cancelled", r.text
    out = Path(jobs["stopped"]["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    (out / "adapter_model.safetensors").write_bytes(WEIGHTS)
    for step, holds in ((2, ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json")), (4, ())):
        folder = out / f"checkpoint-{step}"
        folder.mkdir()
        for f in (*holds, "scheduler.pt", "rng_state.pth"):
            (folder / f).write_bytes(b"c" * (10 * step))
    server.jobs = {name: j["id"] for name, j in jobs.items()}
    server.out = out
    return server


def signed_in(page, server, who: str, screen: str) -> list[str]:
    """The page at `screen`'s size with `who`'s token in this tab, recording any native dialog."""
    page.set_viewport_size(dict(zip(("width", "height"), SCREENS[screen], strict=True)))
    opened: list[str] = []
    page.on("dialog", lambda d: (opened.append(d.type), d.dismiss()))
    page.goto(f"{server.url}/static/css/app.css")  # an origin to keep the token for, before any page asks
    page.evaluate("t => sessionStorage.setItem('tunedeck.token', t)", server.tokens[who])
    return opened


def open_job(page, server, job_id: int, who: str) -> None:
    page.goto(f"{server.url}/jobs/{job_id}")
    page.wait_for_function("window.tunedeckReady === true")
    page.locator("#me", has_text=f"{who} · submitter").wait_for()


def job(server, job_id: int) -> dict:
    r = server.api.get(f"/api/jobs/{job_id}", headers=server.alice)
    assert r.status_code == 200, r.text
    return r.json()


def fits(page) -> None:
    wide = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert wide[0] <= wide[1], wide


def saved(page, target) -> tuple[str, bytes]:
    with page.expect_download() as d:
        target.click()
    data = Path(d.value.path()).read_bytes()
    return d.value.suggested_filename, data


@pytest.mark.parametrize("screen", SCREENS)
def test_alice_resumes_downloads_tags_exports_chats_and_deletes(team, page, screen):
    opened = signed_in(page, team, "alice", screen)
    stopped = team.jobs["stopped"]
    open_job(page, team, stopped, "alice")
    # What it was queued with: its priority (no longer changeable: it has ended) and its environment.
    page.locator("#job-env", has_text="OMP_NUM_THREADS=2").wait_for()
    assert page.locator("#priority").inner_text() == "3" and page.locator("#edit-priority").is_hidden()

    # Downloads: each needs the token (reads are closed), so each comes through fetch with the header.
    page.locator('#downloads [data-archive="adapter"]').wait_for()
    assert team.api.get(f"/api/jobs/{stopped}/archive").status_code == 401  # a plain link's request
    name, data = saved(page, page.locator('#downloads [data-archive="adapter"]'))
    assert name == f"job{stopped}-adapter.zip"
    z = zipfile.ZipFile(io.BytesIO(data))
    assert z.read(f"job{stopped}-adapter/adapter_model.safetensors") == WEIGHTS
    name, data = saved(page, page.locator('[data-group="checkpoint-2"] [data-archive="checkpoint-2"]'))
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert name == f"job{stopped}-checkpoint-2.zip" and f"job{stopped}-checkpoint-2/optimizer.pt" in names
    _, data = saved(page, page.locator('#downloads [data-archive="output"]'))
    assert len(zipfile.ZipFile(io.BytesIO(data)).namelist()) == 2 + 5 + 2  # the adapter, both checkpoints
    page.evaluate("document.querySelector('[data-group=final]').open = true")
    name, data = saved(page, page.locator('[data-file="adapter_config.json"]'))
    assert (name, data) == ("adapter_config.json", (team.out / "adapter_config.json").read_bytes())

    # Tags and notes: shown, edited in place, a refused tag said at the form and kept on screen.
    assert page.locator("#tags").inner_text() == "none"
    page.click("#edit-labels")
    page.fill("#tags-input", "baseline, not a tag!")
    page.click("#labels-save")
    refusal = page.locator("#refusals .refusal", has_text="Saving tags and notes failed")
    refusal.wait_for()
    assert refusal.get_attribute("data-status") == "422"
    assert "tags.1" in page.locator("#labels-error").inner_text()
    refusal.locator(".dismiss").click()
    page.fill("#tags-input", "baseline, lr-sweep")
    page.fill("#notes-input", "stopped early:\nloss flat after step 2")
    page.click("#labels-save")
    page.locator('#tags [data-tag="lr-sweep"]').wait_for()
    assert job(team, stopped)["tags"] == ["baseline", "lr-sweep"]
    assert job(team, stopped)["notes"] == "stopped early:\nloss flat after step 2"
    page.reload()
    page.locator('#tags [data-tag="baseline"]').wait_for()
    assert page.locator("#notes").inner_text() == "stopped early:\nloss flat after step 2"
    fits(page)
    shot(page, f"job-actions-{screen}")

    # Resume from the picker: the newest resumable checkpoint is chosen, the unresumable one is not offered.
    page.wait_for_function("window.tunedeckReady === true")
    page.locator("#resume").wait_for(state="visible")
    page.click("#resume")
    picker = page.locator("#resume-dialog")
    picker.wait_for()
    assert page.locator("#resume-checkpoint").input_value() == "checkpoint-2"
    assert page.locator('#resume-checkpoint option[value="checkpoint-4"]').is_disabled()
    shot(page, f"job-actions-resume-{screen}")
    page.click("#resume-dialog-ok")
    page.wait_for_url(re.compile(rf"/jobs/(?!{stopped}$)\d+$"))
    child = int(page.url.rsplit("/", 1)[1])
    assert child != stopped and job(team, child)["parent_id"] == stopped
    yaml = team.api.get(f"/api/jobs/{child}/config", headers=team.alice).json()["train_yaml"]
    assert f"resume_from_checkpoint: {team.out / 'checkpoint-2'}\n" in yaml
    page.locator("#parent", has_text=f"from #{stopped}").wait_for()

    # Export: a kind `export` job of the adapter, its parent recorded.
    open_job(page, team, stopped, "alice")
    page.locator("#export-job").wait_for(state="visible")
    page.click("#export-job")
    page.wait_for_url(re.compile(rf"/jobs/(?!{stopped}$)\d+$"))
    export = job(team, int(page.url.rsplit("/", 1)[1]))
    assert (export["kind"], export["parent_id"]) == ("export", stopped)
    yaml = team.api.get(f"/api/jobs/{export['id']}/config", headers=team.alice).json()["train_yaml"]
    assert f"adapter_name_or_path: {team.out}\n" in yaml

    # Chat with the adapter: alice may act on her job.
    open_job(page, team, stopped, "alice")
    page.locator("#start-chat").wait_for(state="visible")
    assert page.locator("#start-chat").is_enabled()
    page.click("#start-chat")
    page.wait_for_url(re.compile(r"/jobs/\d+/chat$"))
    chat = job(team, int(page.url.rsplit("/", 2)[1]))
    assert (chat["kind"], chat["parent_id"]) == ("chat", stopped)

    # Delete: a queued job cannot be (the button says why); the stopped one asks in the page first.
    # (Its row made a 2-node job: the page says so beside its GPUs.)
    with sqlite3.connect(team.workspace / "tunedeck.db") as db:
        db.execute("UPDATE jobs SET nodes = 2 WHERE id = ?", (team.jobs["waiting"],))
    open_job(page, team, team.jobs["waiting"], "alice")
    assert page.locator("#gpus").inner_text() == "CPU on each of 2 nodes"
    assert page.locator("#edit-priority").is_enabled() and page.locator("#job-env").inner_text() == "none set"
    page.locator("#delete").wait_for(state="visible")
    assert page.locator("#delete").is_disabled()
    assert "Stop it first" in page.locator("#delete").get_attribute("title")
    # Nothing saved yet and still queued: nothing to resume, export or chat with.
    page.locator("#files", has_text="no files yet").wait_for()
    assert page.locator("#resume").is_hidden() and page.locator("#export-job").is_hidden()
    assert page.locator("#start-chat").count() == 0
    open_job(page, team, stopped, "alice")
    page.locator("#delete").wait_for(state="visible")
    page.click("#delete")
    page.locator("#delete-dialog").wait_for()
    page.click("#delete-dialog-cancel")
    page.locator("#delete-dialog").wait_for(state="detached")
    assert job(team, stopped)["status"] == "cancelled"  # cancelled: nothing was deleted
    page.click("#delete")
    page.check("#delete-files")
    shot(page, f"job-actions-delete-{screen}")
    page.click("#delete-dialog-ok")
    page.wait_for_url(f"{team.url}/")
    assert team.api.get(f"/api/jobs/{stopped}", headers=team.alice).status_code == 404
    assert not team.out.exists()
    assert opened == [] and page.errors == []  # no window.confirm, prompt or alert on the way


@pytest.mark.parametrize("screen", SCREENS)
def test_bob_sees_why_and_a_refusal_stays_until_dismissed(team, page, screen):
    opened = signed_in(page, team, "bob", screen)
    stopped = team.jobs["stopped"]
    open_job(page, team, stopped, "bob")
    # What only alice (or an admin) may do is disabled, with the reason on the button and on the page.
    why = "Only its owner (alice) or an admin may change this job."
    page.locator("#actions-why", has_text=why).wait_for()
    for button in ("#delete", "#edit-labels", "#start-chat"):
        page.locator(button).wait_for(state="visible")
        assert page.locator(button).is_disabled(), button
        assert page.locator(button).get_attribute("title") == why, button
    # A new job from hers is his to make: Resume, Export and Edit as new are offered.
    for button in ("#resume", "#export-job", "#again"):
        page.locator(button).wait_for(state="visible")
    assert page.locator("#resume").is_enabled() and page.locator("#export-job").is_enabled()
    fits(page)
    shot(page, f"job-actions-bob-{screen}")

    # Edit as new keeps the lineage and the queue's fields; the new job is bob's, its parent alice's job.
    page.click("#again")
    page.wait_for_function("window.tunedeckReady === true")
    assert page.input_value("#f-parent") == str(stopped)
    assert page.locator("#f-parent-link").inner_text() == f"#{stopped} stopped"
    assert (page.input_value("#f-priority"), page.input_value("#f-env")) == ("3", "OMP_NUM_THREADS=2")
    assert (page.input_value("#f-nodes"), page.input_value("#f-gpus"), page.input_value("#f-kind")) == (
        "1",
        "0",
        "train",
    )
    page.fill("#f-name", "bob tries again")
    page.click("#submit")
    page.wait_for_url(re.compile(r"/jobs/\d+$"))
    again = job(team, int(page.url.rsplit("/", 1)[1]))
    assert (again["owner"], again["parent_id"], again["priority"]) == ("bob", stopped, 3)
    fits(page)

    # The server's own refusal (the page sends alice's delete with bob's token) stays through a live
    # update of the job until bob dismisses it.
    page.evaluate("t => sessionStorage.setItem('tunedeck.token', t)", team.tokens["alice"])
    page.route(
        "**/api/jobs/*?files=*",
        lambda route: route.continue_(
            headers={**route.request.headers, "authorization": f"Bearer {team.tokens['bob']}"}
        ),
    )
    open_job(page, team, stopped, "alice")
    page.locator("#delete").wait_for(state="visible")
    page.click("#delete")
    page.click("#delete-dialog-ok")
    refusal = page.locator("#refusals .refusal", has_text="only its owner (alice) or an admin may delete")
    refusal.wait_for()
    assert refusal.get_attribute("data-status") == "403"
    r = team.api.patch(f"/api/jobs/{stopped}", json={"notes": "seen by bob"}, headers=team.alice)
    assert r.status_code == 200, r.text
    page.locator("#notes", has_text="seen by bob").wait_for()  # the stream's update
    assert refusal.count() == 1 and refusal.is_visible()
    refusal.locator(".dismiss").click()
    assert refusal.count() == 0
    assert job(team, stopped)["status"] == "cancelled"
    assert opened == [] and page.errors == []
