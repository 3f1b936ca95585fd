"""A healthy plateau's alert row is not rewritten on every pass: only when REFRESH_S of the series'
time have passed, when something else it says changes, and when it ends (services/alerting/reconcile.py)."""

from __future__ import annotations

from sqlmodel import Session, select

from tests.alerts.test_store import database
from tunedeck.alerts import Finding
from tunedeck.services.alerting.reconcile import REFRESH_S, reconcile
from tunedeck.store.tables import Alert


def plateau(start: float, end: float, tip: str | None = None) -> Finding:
    return Finding(
        "vram_plateau",
        "info",
        0,
        [start, end],
        None,
        f"GPU 0: memory settled at 40 GiB and stayed within 0.4 GiB for {end - start:.0f} s",
        tip,
        True,
    )


def test_a_plateau_row_is_written_at_each_refresh_and_at_its_end_not_each_pass(tmp_path):
    engine, job = database(tmp_path)
    writes: list[tuple[float, str]] = []
    with Session(engine) as s:

        def passes(ends, **kw) -> None:
            for end in ends:
                changed: list[Alert] = []
                reconcile(s, job, [plateau(100.0, end, **kw)], finished=False, changed=changed)
                writes.extend((a.last_t, a.message) for a in changed)

        assert reconcile(s, job, [plateau(100.0, 160.0)], finished=False)  # opened
        passes([160.0 + k for k in range(1, 61)])  # a pass a second for a minute
        (row,) = s.exec(select(Alert)).all()
        # Written at each refresh only: after REFRESH_S, then again REFRESH_S after that.
        assert [t for t, _ in writes] == [160.0 + REFRESH_S, 160.0 + 2 * REFRESH_S]
        assert row.last_t == 160.0 + 2 * REFRESH_S and row.open
        assert writes[-1][1].endswith(f"for {60 + 2 * REFRESH_S:.0f} s")

        passes([221.0], tip="headroom: a larger batch fits")  # a new suggestion is written at once
        assert writes[-1][0] == 221.0
        s.refresh(row)
        assert row.suggestion == "headroom: a larger batch fits"

        reconcile(s, job, [plateau(100.0, 225.0, tip="headroom: a larger batch fits")], finished=True)
        s.refresh(row)
        assert not row.open and row.last_t == 225.0  # its end, as it was
        assert row.message.endswith("for 125 s")
