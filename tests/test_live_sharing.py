"""How open streams share reads and encodings (services/live): a read serves every stream whose
ticket's key was not woken after it started, whatever else was woken meanwhile; an event's bytes are
the frame sse_starlette writes, made once."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from sse_starlette.event import ServerSentEvent

from tests.utils.wait import DEADLINE, until
from tunedeck.services.live.events import TEAM, Broadcaster
from tunedeck.services.live.feed import Event


def test_an_event_is_the_frame_sse_starlette_writes():
    rows = [{"id": 3, "name": 'a "quoted"\nname\r\n', "loss": 1.5, "nonfinite": None, "when": "é"}] * 3
    for ev in (Event("jobs", rows, "m1-l2-s3-a4-j5"), Event("metrics", [], ""), Event("job", {}, "m0")):
        frame = ev.sse()
        data = frame.decode().split("\r\ndata: ", 1)[1].removesuffix("\r\n\r\n")
        assert frame == ServerSentEvent(data=data, event=ev.event, id=ev.id).encode()
        assert ev.sse() is frame  # encoded once


def test_streams_share_a_read_unless_their_key_was_woken_after_it_began():
    async def scenario() -> list[str]:
        hub = Broadcaster(engine=None, team_every_s=0.0)  # type: ignore[arg-type]  # (no watcher)
        hub.loop = asyncio.get_running_loop()
        gate, reads = threading.Event(), []

        def read(name: str):
            def run() -> str:
                reads.append(name)
                assert gate.wait(DEADLINE)
                return name

            return run

        since = hub.woken(TEAM)
        first = asyncio.ensure_future(hub.shared(("c",), since, read("first"), ticket=TEAM))
        await asyncio.to_thread(until, lambda: "first" in reads, "the first read under way")
        hub._fire({7})  # a batch of job 7: its page's key only
        joined = asyncio.ensure_future(hub.shared(("c",), hub.woken(TEAM), read("joined"), ticket=TEAM))
        hub._fire({TEAM, 7})  # the team's rows changed after the first read began
        late = asyncio.ensure_future(hub.shared(("c",), hub.woken(TEAM), read("late"), ticket=TEAM))
        # A job page's read at the same cursor is its own (its key counts its own wake-ups).
        page = asyncio.ensure_future(hub.shared(("c",), hub.woken(7), read("page"), ticket=7))
        # The streams' coroutines ran up to their reads: the two that read started them.
        await asyncio.to_thread(until, lambda: {"late", "page"} <= set(reads), "the late and page reads")
        gate.set()
        return [await first, await joined, await late, await page, *sorted(reads)]

    # In a thread of its own: the suite's session-wide browser (Playwright's sync API) keeps an event
    # loop running in the main thread, where asyncio.run refuses to start another.
    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(asyncio.run, scenario()).result(timeout=DEADLINE)
    assert got[:4] == ["first", "first", "late", "page"]
    assert got[4:] == ["first", "late", "page"]  # three reads for four streams
