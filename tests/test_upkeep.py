"""The database file's upkeep (services/ingest/upkeep.py) on real SQLite files: pages retention frees go
back to the disk, a WAL that readers kept from rewinding is emptied, and /api/health says what a day of
telemetry costs there."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing

from sqlalchemy import text

from tests.test_retention import db_command, seed
from tests.utils.wait import until
from tunedeck.services.ingest import upkeep
from tunedeck.services.ingest.retention import rollup
from tunedeck.store.db import make_engine, upgrade


def pages(path) -> tuple[int, int, int]:
    """(auto_vacuum, pages, free pages) of the file."""
    with closing(sqlite3.connect(path)) as c:
        return tuple(
            c.execute(f"PRAGMA {p}").fetchone()[0] for p in ("auto_vacuum", "page_count", "freelist_count")
        )


def give_back_all(path) -> int:
    given = 0
    with closing(sqlite3.connect(path, isolation_level=None)) as c:
        while step := upkeep.give_back(c):
            given += step
    return given


def test_a_new_database_gives_the_pages_retention_frees_back_to_the_disk(tmp_path):
    path = tmp_path / "new.db"
    engine = make_engine(path)
    upgrade(engine)
    seed(engine, job_id=1, ended="2026-01-01 00:00:00", n=60000)
    seed(engine, job_id=2, ended="2099-01-01 00:00:00", n=6000)  # still in its retention window
    mode, _, _ = pages(path)
    assert mode == 2, "a new database vacuums incrementally"
    report = rollup(engine, older_than_s=86400, interval_s=60)
    assert report["jobs"] == 1
    _, full, freed = pages(path)
    assert freed > full // 2, "retention frees pages inside the file; the file keeps them"
    given = give_back_all(path)
    _, now, left = pages(path)
    assert left < upkeep.VACUUM_MIN_FREE_PAGES and now <= full - freed + upkeep.VACUUM_MIN_FREE_PAGES
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    assert given == (full - now) * page
    with engine.connect() as c:  # what stayed is all there
        assert c.execute(text("SELECT count(*) FROM memory_samples WHERE job_id = 2")).scalar() == 6000


def test_a_connection_opened_while_another_program_holds_the_write_lock_reads_at_once(tmp_path):
    # The pool opens connections as requests need them: one must read while a backup or a sqlite3 shell
    # writes, whatever its busy timeout (here so short that waiting for the lock at all would fail).
    path = tmp_path / "t.db"
    upgrade(make_engine(path))
    with closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        engine = make_engine(path, busy_timeout_s=0.01)
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM jobs")).scalar() == 0
        engine.dispose()
        holder.execute("ROLLBACK")
    assert pages(path)[0] == 2, "the new file still vacuums incrementally"


def test_an_older_database_gives_nothing_back_until_db_vacuum_converts_it(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    path = ws / "tunedeck.db"
    with closing(sqlite3.connect(path)) as c:  # as a file made before tunedeck turned it on
        c.execute("PRAGMA auto_vacuum=NONE")
        c.execute("CREATE TABLE made_before (x)")
    engine = make_engine(path)
    upgrade(engine)
    seed(engine, job_id=1, ended="2026-01-01 00:00:00", n=30000)
    rollup(engine, older_than_s=86400, interval_s=60)
    engine.dispose()
    mode, full, freed = pages(path)
    assert mode == 0 and freed > full // 2
    assert give_back_all(path) == 0
    r = db_command(ws, "vacuum")
    assert r.returncode == 0, r.stderr
    assert "freed pages now go back to the disk" in r.stdout
    mode, now, _ = pages(path)
    assert mode == 2 and now <= full - freed + 16


def test_a_wal_that_readers_kept_from_rewinding_is_emptied_and_nothing_is_lost(tmp_path):
    path = tmp_path / "wal.db"
    engine = make_engine(path)
    upgrade(engine)
    wal = tmp_path / "wal.db-wal"
    held = sqlite3.connect(path, isolation_level=None)
    held.execute("BEGIN")
    held.execute("SELECT count(*) FROM jobs").fetchone()  # a reader on an old snapshot: no rewind past it
    for job in range(1, 5):
        seed(engine, job_id=job, ended="2099-01-01 00:00:00", n=20000)
    grown = wal.stat().st_size
    assert grown > 1000 * 4096, grown  # past where SQLite's own checkpoint would have rewound it
    held.rollback()
    held.close()

    stop = threading.Event()
    reads = [0]

    def reader() -> None:  # short overlapping reads, as team streams make
        with closing(sqlite3.connect(path, timeout=30)) as c:
            while not stop.is_set():
                c.execute("SELECT count(*) FROM jobs").fetchone()
                reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        until(lambda: reads[0] > 50, "readers reading")
        done = until(
            lambda: (d := upkeep.checkpoint(path)) and not d["busy"] and d,
            "a checkpoint that emptied the WAL",
            interval=0.5,
        )
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert done["wal_bytes_before"] >= grown and done["wal_bytes_after"] == 0, done
    assert wal.stat().st_size == 0
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM memory_samples")).scalar() == 80000


def test_health_says_the_files_sizes_and_what_a_day_of_telemetry_costs(app_factory):
    app = app_factory(TUNEDECK_STORAGE_SURVEY_S="1")
    engine = app.app.state.engine
    seed(engine, job_id=1, ended="2026-01-01 00:00:00", n=5000)  # t = 1000.. : long before the last day
    now = time.time()
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes, name) "
                "VALUES (1, :i, :t, 1, 1, 2, 'H200')"
            ),
            [{"i": i, "t": now - 3600 + i * 0.5} for i in range(3000)],
        )
    storage = until(
        lambda: (s := app.api.get("/api/health").json()["storage"])["day"] and s,
        "a survey of a day's cost in /api/health",
        timeout=120,
    )
    day = storage["day"]
    assert day["memory_samples"] == 3000 and day["metric_points"] == 0, day
    assert 20 < day["bytes_per_sample"] < 2000, day
    assert abs(day["bytes"] - 3000 * day["bytes_per_sample"]) <= 3000 * 0.05, day  # its rounding
    assert 8000 * day["bytes_per_sample"] < storage["db_bytes"], "all 8000 samples' cost lies inside the file"
    assert storage["incremental_vacuum"] is True
    assert storage["db_bytes"] >= app.settings.db_path.stat().st_size  # its pages, the WAL's newest included
    assert storage["wal_limit_bytes"] == app.settings.wal_limit_bytes
