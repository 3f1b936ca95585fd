"""A run whose raw memory samples retention dropped long ago: its job page still draws the whole
memory curve from the chart tiles, with its spike at the right time."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from tests.ui.conftest import shot
from tunedeck.services.ingest.retention import rollup
from tunedeck.store.db import make_engine

pytestmark = [pytest.mark.browser, pytest.mark.slow]
GiB = 1 << 30
T0 = 1_700_000_000.0


def test_job_page_draws_a_pruned_run_from_its_tiles(server_factory, page):
    server = server_factory()
    engine = make_engine(server.workspace / "tunedeck.db")
    rnd = random.Random(3)
    used = [20 * GiB + rnd.randint(0, 2**28) for _ in range(6000)]
    used[2500] = 70 * GiB
    with engine.begin() as c:
        job = c.execute(
            text(
                "INSERT INTO jobs (name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at, "
                "finished_at, last_batch_seq) VALUES ('old', 'succeeded', 1, '{}', 'stage: sft\n', '', '', "
                "'2025-01-01 00:00:00', '2025-01-02 00:00:00', -1)"
            )
        ).lastrowid
        c.execute(
            text(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes, name) "
                "VALUES (:j, :i, :t, 0, :u, :tot, 'H200')"
            ),
            [{"j": job, "i": i, "t": T0 + i, "u": u, "tot": 141 * GiB} for i, u in enumerate(used)],
        )
    assert rollup(engine, older_than_s=86400, interval_s=60)["jobs"] == 1
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM memory_samples")).scalar() == 2
    engine.dispose()

    page.goto(f"{server.url}/jobs/{job}")
    page.wait_for_function("window.tunedeckReady === true", timeout=120_000)
    # the job page keys a series by "node/gpu": these rows name no node
    t, y = page.evaluate("[window.tunedeck.mem.get('/0').t, window.tunedeck.mem.get('/0').y]")
    assert len(t) >= 40 and t == sorted(t)  # a curve over the whole run, not the two samples left
    assert t[0] < T0 + 300 and t[-1] > T0 + 5700
    assert max(y) == 70 * GiB and t[y.index(max(y))] == T0 + 2500
    assert page.locator("#mem-chart .scatterlayer .trace").count() >= 1
    assert "downsampled" in page.locator("#mem-n").inner_text()
    shot(page, "job-page-pruned-run")
    assert page.errors == []
