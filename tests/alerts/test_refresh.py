"""A healthy plateau's alert row is not rewritten on every pass: only when REFRESH_S of the series'
time have passed, when something else it says changes, and when it ends (services/alerting/reconcile.py)."""

from __future__ import annotations

from sqlmodel import Session, col, select

from tests.alerts.test_store import database, new_job
from tunedeck.alerts import Finding
from tunedeck.services.alerting.reconcile import REFRESH_S, reconcile, unchanged
from tunedeck.store.tables import Alert


def plateau(start: float, end: float, tip: str | None = None) -> Finding:
    return Finding(
        "vram_plateau",
        "info",
        0,
        [start, end],
        int(end) * 10,  # the step at its end, as the detector gives it: it moves with every pass
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


def stuck(times: list[float], severity: str = "warning") -> Finding:
    n = len(times)
    return Finding(
        "loss_stuck",
        severity,
        None,
        times,
        40,
        f"loss stuck at 2.31 for {n} logged points (steps 40 to {40 + 10 * n})",
        "raise learning_rate",
        True,
    )


def test_a_stuck_loss_row_is_written_at_each_refresh_not_at_each_logged_line(tmp_path):
    """A stuck loss's count and last step grow with every logged line: its row follows at each refresh
    of REFRESH_S, and at once when anything else it says changes."""
    engine, job = database(tmp_path)
    said: list[Finding] | None = None
    tracked: dict = {}
    written: list[float] = []
    times = [100.0 + k for k in range(20)]
    with Session(engine) as s:
        for k in range(100):  # a line a second
            findings = [
                stuck(times + [120.0 + i for i in range(k + 1)], "critical" if k == 50 else "warning")
            ]
            if not unchanged(findings, said, tracked):
                changed: list[Alert] = []
                reconcile(s, job, findings, finished=False, changed=changed, tracked=tracked, said=said)
                written += [a.last_t for a in changed]
            said = findings
        (row,) = s.exec(select(Alert)).all()
    # Opened at 120, then REFRESH_S apart, at once for the severity's change and back.
    assert written == [120.0 + REFRESH_S, 170.0, 171.0, 171.0 + REFRESH_S]
    # The row as the finding was at its last write (the line at 201 s, the 102nd point), not since.
    assert row.last_t == 201.0 and row.count == 102 and row.message.endswith(f"(steps 40 to {40 + 10 * 102})")


def spike(times: list[float]) -> Finding:
    return Finding(
        "vram_spike", "warning", 1, times, None, f"GPU 1: {len(times)} transient spike(s)", None, True
    )


def test_a_pass_that_would_write_nothing_is_told_before_reading_the_rows(tmp_path):
    """`unchanged` (the alert engine's shortcut past reconcile) holds exactly when storing the findings
    would change no row: a plateau's end moving within REFRESH_S, nothing else."""
    engine, job = database(tmp_path)
    said: list[Finding] | None = None
    tracked: dict = {}
    told: list[bool] = []
    passes = [[plateau(100.0, 160.0 + k), spike([120.0])] for k in range(40)]
    passes += [[plateau(100.0, 200.0, tip="headroom"), spike([120.0])]]  # a new suggestion
    passes += [[plateau(100.0, 201.0, tip="headroom"), spike([120.0, 201.0])]]  # a new spike
    passes += [[plateau(100.0, 202.0, tip="headroom"), spike([120.0, 201.0])]]
    passes += [[spike([120.0, 201.0])]]  # the plateau ends
    with Session(engine) as s:
        for findings in passes:
            shortcut = unchanged(findings, said, tracked)
            before = [a.model_dump() for a in s.exec(select(Alert).order_by(col(Alert.id))).all()]
            changed: list[Alert] = []
            new = reconcile(
                s, job, findings, finished=False, changed=changed, closed=changed, tracked=tracked
            )
            after = [a.model_dump() for a in s.exec(select(Alert).order_by(col(Alert.id))).all()]
            assert not shortcut or (before == after and not new and not changed)
            told.append(shortcut)
            said = findings
    # Taken on every pass inside each refresh interval, never where a row was written.
    assert told == [False] + [True] * 29 + [False] + [True] * 9 + [False, False, True, False]


def test_told_what_was_stored_before_reconcile_reads_only_the_kinds_that_changed_to_the_same_rows(tmp_path):
    """Given the findings stored last (`said`), reconcile reads only the rows of kinds whose findings
    changed: the rows come out as a full reconcile leaves them, pass after pass."""
    engine, full = database(tmp_path)
    told = new_job(engine)
    near = Finding("vram_near_oom", "critical", 0, [150.0], None, "GPU 0: near", None, True)
    passes = [[plateau(100.0, 160.0 + k), spike([120.0])] for k in range(35)]
    passes += [[plateau(100.0, 196.0), spike([120.0, 196.0]), near]]  # a new spike, a new kind
    passes += [[plateau(100.0, 197.0), spike([120.0, 196.0])]]  # near-OOM no longer found: closed
    passes += [[spike([120.0, 196.0])]]  # the plateau ends
    passes += [[spike([120.0, 196.0]), near]]  # near-OOM again: a new episode
    passes += [[plateau(100.0, 240.0, tip="headroom"), spike([120.0, 196.0]), near]]

    def rows(s: Session, job: int) -> list[dict]:
        got = s.exec(select(Alert).where(Alert.job_id == job).order_by(col(Alert.id))).all()
        return [a.model_dump(exclude={"id", "job_id"}) for a in got]

    said: list[Finding] | None = None
    tracked: dict = {}
    with Session(engine) as s:
        for findings in passes:
            a: list[Alert] = []
            b: list[Alert] = []
            reconcile(s, full, findings, finished=False, closed=a, changed=a)
            reconcile(s, told, findings, finished=False, closed=b, changed=b, tracked=tracked, said=said)
            assert rows(s, full) == rows(s, told)
            assert [x.kind for x in a] == [x.kind for x in b]
            said = findings
        reconcile(s, told, passes[-1], finished=True, said=said)
        reconcile(s, full, passes[-1], finished=True)
        assert rows(s, full) == rows(s, told) and not any(r["open"] for r in rows(s, told))
