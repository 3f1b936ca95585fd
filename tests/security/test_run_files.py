"""A run's files are not to be trusted: an import follows no link, /files lists and serves only what
resolves inside the run folder, a download writes a bare file name, and an import of a run longer
than the body limit streams in once (the same import again is the same job). One real server."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from typer.testing import CliRunner

from tests.utils.servers import Server
from tunedeck.cli.main import app as cli_app

BODY_LIMIT = 65536
IMPORT_LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    s = Server(
        tmp_path_factory.mktemp("run-files") / "ws",
        assets,
        TUNEDECK_LAUNCH_PAUSED="true",
        TUNEDECK_MAX_BODY_BYTES=str(BODY_LIMIT),
        TUNEDECK_IMPORT_MAX_BYTES=str(IMPORT_LIMIT),
    )
    s.start()
    yield s
    s.stop()


def cli(*args: str):
    # In this process: the verbs read no settings beyond --server, and interpreter starts cost more.
    return CliRunner().invoke(cli_app, list(args), catch_exceptions=False)


def trainer_log(steps: int) -> str:
    return "".join(
        json.dumps(
            {
                "current_steps": s,
                "total_steps": steps,
                "loss": 2.0 + 1 / s,
                "elapsed_time": f"0:00:{s % 60:02d}",
            }
        )
        + "\n"
        for s in range(1, steps + 1)
    )


def run_folder(at: Path, steps: int = 3) -> Path:
    at.mkdir(parents=True)
    (at / "trainer_log.jsonl").write_text(trainer_log(steps))
    return at


def imported(server: Server, name: str, **files: bytes) -> dict:
    r = server.api.post(
        "/api/runs/import", files={"trainer_log": trainer_log(3).encode(), **files}, data={"name": name}
    )
    assert r.status_code == 201, r.text
    return r.json()


def job_count(server: Server) -> int:
    return len(server.api.get("/api/jobs", params={"limit": 1000}).json()["jobs"])


def test_an_import_follows_no_link_and_names_the_file(server, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret\n")
    run = run_folder(tmp_path / "run")
    (run / "train.yaml").symlink_to(secret)
    before = job_count(server)
    r = cli("import", str(run), "--server", server.url)
    assert r.exit_code == 2 and f"{run / 'train.yaml'} is a symbolic link" in r.stderr, r.stderr
    (run / "train.yaml").unlink()
    (run / "train.yaml").write_text("learning_rate: 0.1\n")
    (run / "trainer_log.jsonl").rename(tmp_path / "log.jsonl")
    (run / "trainer_log.jsonl").symlink_to(tmp_path / "log.jsonl")
    r = cli("import", str(run), "--server", server.url)
    assert r.exit_code == 2 and "trainer_log.jsonl is a symbolic link" in r.stderr, r.stderr
    (run / "trainer_log.jsonl").unlink()
    (tmp_path / "log.jsonl").rename(run / "trainer_log.jsonl")
    (tmp_path / "memory.csv").symlink_to(secret)
    r = cli("import", str(run), "--memory", str(tmp_path / "memory.csv"), "--server", server.url)
    assert r.exit_code == 2 and "memory.csv is a symbolic link" in r.stderr, r.stderr
    assert job_count(server) == before  # nothing reached the server
    r = cli("import", str(run), "--name", "no links", "--server", server.url)
    assert r.exit_code == 0, r.stderr
    assert (
        server.api.get(f"/api/jobs/{r.stdout.split()[3]}/config").json()["train_yaml"]
        == "learning_rate: 0.1\n"
    )

    # The server writes no file through a link either: a deleted job kept its run folder, its id
    # comes back to the next job, and a link was planted in that folder meanwhile.
    kept = imported(server, "kept", config=b"learning_rate: 0.2\n")
    assert server.api.delete(f"/api/jobs/{kept['id']}").status_code == 200  # files kept
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    (Path(kept["run_dir"]) / "train.yaml").unlink()
    (Path(kept["run_dir"]) / "train.yaml").symlink_to(victim)
    again = imported(server, "kept", config=b"learning_rate: 0.3\n")
    assert again["id"] == kept["id"] and again["run_dir"] != kept["run_dir"]
    assert victim.read_text() == "mine\n"
    assert not Path(again["run_dir"], "train.yaml").is_symlink()
    assert server.api.get(f"/api/jobs/{again['id']}/config").json()["train_yaml"] == "learning_rate: 0.3\n"


def test_files_lists_and_serves_only_what_resolves_inside(server, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s" * 1234)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "id_rsa").write_text("key")
    job = imported(server, "links inside")
    out, base = Path(job["output_dir"]), f"/api/jobs/{job['id']}"
    (out / "adapter_model.safetensors").write_bytes(b"w" * 10)
    (out / "same").symlink_to("adapter_model.safetensors")  # resolves inside: listed and served
    (out / "leak").symlink_to(secret)
    (out / "adapter_config.json").symlink_to(secret)  # would ride along in the adapter archive
    (out / "checkpoint-1").symlink_to(elsewhere, target_is_directory=True)
    log_size = len(trainer_log(3))

    listed = {f["path"]: f["bytes"] for f in server.api.get(f"{base}/files").json()}
    assert listed == {"trainer_log.jsonl": log_size, "adapter_model.safetensors": 10, "same": 10}
    assert server.api.get(f"{base}/files/same").content == b"w" * 10
    for path in ("leak", "adapter_config.json", "checkpoint-1/id_rsa"):
        assert server.api.get(f"{base}/files/{path}").status_code == 404, path
    z = zipfile.ZipFile(io.BytesIO(server.api.get(f"{base}/archive").content))
    assert z.namelist() == [f"job{job['id']}-adapter/adapter_model.safetensors"]
    r = server.api.get(f"{base}/archive", params={"what": "output", "format": "tar"})
    with tarfile.open(fileobj=io.BytesIO(r.content)) as t:
        assert {m.name.split("/", 1)[1] for m in t.getmembers()} == {
            "trainer_log.jsonl",
            "adapter_model.safetensors",
            "same",
        }
    assert server.api.get(f"{base}/archive", params={"what": "checkpoint-1"}).status_code == 404
    for nul in ("a%00b", "%00", "trainer_log.jsonl%00.png"):
        r = server.api.get(f"{base}/files/{nul}")
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "path"], (nul, r.text)

    # An output folder that is itself a link to elsewhere is no output folder.
    linked = imported(server, "linked output")
    out, base = Path(linked["output_dir"]), f"/api/jobs/{linked['id']}"
    (out / "trainer_log.jsonl").unlink()
    out.rmdir()
    out.symlink_to(elsewhere, target_is_directory=True)
    assert server.api.get(f"{base}/files").json() == []
    assert server.api.get(f"{base}/files/id_rsa").status_code == 404
    assert server.api.get(f"{base}/archive", params={"what": "output"}).status_code == 404


class Hostile(BaseHTTPRequestHandler):
    """A server that names its archive as it likes: `name` is the Content-Disposition file name."""

    name: ClassVar[str] = ""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Disposition", f'attachment; filename="{Hostile.name}"')
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"PK")

    def log_message(self, *a) -> None:
        pass


def test_a_download_writes_a_bare_name_where_asked(tmp_path, monkeypatch):
    http = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{http.server_port}"
    here, there = tmp_path / "a" / "b" / "here", tmp_path / "there"
    here.mkdir(parents=True)
    there.mkdir()
    monkeypatch.chdir(here)
    try:
        for sent, written in (
            ("../../up.zip", "up.zip"),
            ("/etc/cron.d/x", "x"),
            ("..\\\\..\\\\win.zip", "win.zip"),
            ("..", "job1.zip"),
            ("", "job1.zip"),
        ):
            Hostile.name = sent
            for target, args in ((here, ()), (there, ("-o", str(there)))):
                r = cli("download", "1", *args, "--server", url)
                assert r.exit_code == 0, r.stderr
                assert (target / written).read_bytes() == b"PK", (sent, target)
                (target / written).unlink()
    finally:
        http.shutdown()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing written anywhere else


def test_a_long_run_streams_past_the_body_limit_once(server, tmp_path):
    # Past the body limit and past one stored batch of lines (services/jobs/imports.py METRICS_PER_BATCH).
    steps = 6_000
    run = run_folder(tmp_path / "long", steps)
    (run / "train.yaml").write_text("learning_rate: 0.1\n")
    assert (run / "trainer_log.jsonl").stat().st_size > BODY_LIMIT
    too_big = server.api.post(
        "/api/jobs", content=b"{" + b" " * BODY_LIMIT + b"}", headers={"content-type": "application/json"}
    )
    assert too_big.status_code == 413  # the body limit still holds everywhere else

    first = cli("import", str(run), "--name", "long", "--server", server.url)
    assert first.exit_code == 0, first.stderr
    job_id = int(first.stdout.split()[3])
    job = server.api.get(f"/api/jobs/{job_id}").json()
    assert (job["status"], job["progress"]["current_steps"]) == ("succeeded", steps)
    points = server.api.get(f"/api/jobs/{job_id}/metrics", params={"limit": 20000}).json()["points"]
    assert [p["step"] for p in points] == list(range(1, steps + 1))

    again = cli("import", str(run), "--name", "long", "--server", server.url)
    assert again.exit_code == 0 and again.stdout.split()[3] == str(job_id), again.stdout
    assert "imported before: no new job" in again.stdout
    files = {
        k: (run / n).read_bytes() for k, n in (("trainer_log", "trainer_log.jsonl"), ("config", "train.yaml"))
    }
    r = server.api.post("/api/runs/import", files=files, data={"name": "long"})
    assert (r.status_code, r.json()["id"]) == (200, job_id)
    # Sent twice at once (a retry while the server still stores the first): one job.
    with ThreadPoolExecutor(2) as pool:

        def send() -> httpx.Response:
            with httpx.Client(base_url=server.url, timeout=120, headers={"X-Tunedeck": "1"}) as c:
                return c.post("/api/runs/import", files=files, data={"name": "long at once"})

        both = [f.result() for f in [pool.submit(send) for _ in range(2)]]
    assert sorted(r.status_code for r in both) == [200, 201] and both[0].json()["id"] == both[1].json()["id"]
    twins = [imported(server, name, config=b"seed: 1\n")["id"] for name in ("twin", "twin 2")]
    assert twins[0] != twins[1]  # the same files under another name: another job
    r = server.api.post("/api/runs/import", files={"trainer_log": b"\n" * (IMPORT_LIMIT + 1)})
    assert r.status_code == 413
    r = server.api.post("/api/runs/import", files={"trainer_log": files["trainer_log"], "config": b"\xff\n"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "config"], r.text
