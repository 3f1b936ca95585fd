"""The output-file listing stays bounded, however many shards a run writes."""

from __future__ import annotations

from tunedeck.services.jobs.records import run_files
from tunedeck.store.tables import Job


def test_listing_is_bounded_and_sorted(tmp_path):
    out = tmp_path / "output"
    (out / "checkpoint-1").mkdir(parents=True)
    for i in range(1500):
        (out / "checkpoint-1" / f"shard-{i:05d}.bin").write_bytes(b"x" * (i % 7))
    (out / "adapter_model.safetensors").write_bytes(b"abc")
    files = run_files(
        Job(name="j", spec="{}", train_yaml="", run_dir=str(tmp_path), output_dir=str(out)), limit=1000
    )
    assert len(files) == 1000
    assert [f["path"] for f in files] == sorted(f["path"] for f in files)
    small = run_files(
        Job(name="j", spec="{}", train_yaml="", run_dir=str(tmp_path), output_dir=str(out / "checkpoint-1")),
        limit=5000,
    )
    assert len(small) == 1500 and small[3] == {"path": "shard-00003.bin", "bytes": 3}
    assert run_files(Job(name="j", spec="{}", train_yaml="", output_dir="")) == []
