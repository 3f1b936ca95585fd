"""Eval, predict, export and chat jobs end to end: one real server, one tiny adapter trained once for the
module, real `llamafactory-cli train | export | api` processes on the CPU."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.utils.browser import shot
from tests.utils.factories import create_token
from tests.utils.servers import OUTPUT, PYTHON, Server, demo_config, job_processes
from tests.utils.wait import until
from tunedeck.contract.protocol import PHASES

pytestmark = pytest.mark.slow
ENDED = ("succeeded", "failed", "cancelled")
FIGURES = OUTPUT / "kinds-figures.json"
IDLE_S = 8


SCREENS = ((1440, 900), (390, 844))


def units(page) -> dict[str, str]:
    """The results table's metric name -> the unit the page writes beside it."""
    return dict(
        page.locator("#result-metrics tbody tr").evaluate_all(
            "rows => rows.map(r => [r.cells[1].textContent, r.cells[3].textContent])"
        )
    )


def inside(page, sel: str) -> None:
    """The table fits inside its card (its names wrap on a phone) and nothing sticks out of the page."""
    got = page.evaluate(
        "(sel) => { const t = document.querySelector(sel), card = document.getElementById('results');"
        " return { page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth,"
        " box: t.getBoundingClientRect().right, card: card.getBoundingClientRect().right }; }",
        sel,
    )
    assert got["page"] <= got["view"] and got["box"] <= got["card"] + 0.5, got


def record(**figures) -> None:
    """Figures for the report, kept beside the other test output."""
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    FIGURES.write_text(json.dumps({**old, **figures}, indent=2))


def infer_config(assets: Path, **keys) -> dict:
    """Keys an eval, predict, export or chat job of the demo model takes."""
    return {"model_name_or_path": str(assets / "demo" / "model"), "template": "qwen", **keys}


def data_keys(assets: Path) -> dict:
    return {
        "dataset_dir": str(assets / "demo" / "data"),
        "eval_dataset": "demo_identity_small",
        "cutoff_len": 128,
        "per_device_eval_batch_size": 4,
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    # One CPU slot: a chat job holds it until it goes idle, and whatever is queued behind it waits.
    s = Server(
        tmp_path_factory.mktemp("kinds") / "ws",
        assets,
        TUNEDECK_CPU_SLOTS="1",
        TUNEDECK_CHAT_IDLE_S=str(IDLE_S),
    ).start()
    yield s
    s.stop()
    from tunedeck.procs import kill_job

    for run_dir in (s.workspace / "runs").iterdir():
        kill_job(str(run_dir))


def run(server: Server, spec: dict) -> dict:
    job = server.wait(server.submit(spec)["id"], ENDED, timeout=300)
    if job["status"] != "succeeded":
        tail = (Path(job["run_dir"]) / "train.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"{job['kind']} job {job['status']}: {job['error']}\n{tail}")
    return job


@pytest.fixture(scope="module")
def trained(server, assets) -> dict:
    """The module's one LoRA adapter on the tiny model (20 steps)."""
    return run(server, {"name": "kinds adapter", "config": demo_config(assets, eval_steps=20), "gpus": 0})


@pytest.fixture(scope="module")
def exported(server, assets, trained, tmp_path_factory) -> dict:
    """The adapter merged into its base model, submitted as a script would: `tunedeck submit --kind export`."""
    config = infer_config(
        assets, adapter_name_or_path=trained["output_dir"], finetuning_type="lora", export_size=1
    )
    path = tmp_path_factory.mktemp("export") / "merge_lora.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = [PYTHON, "-m", "tunedeck.cli.main", "submit", str(path), "--kind", "export", "--gpus", "0"]
    out = subprocess.run([*cli, "--server", server.url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.split("submitted job ")[1].split()[0])
    job = server.wait(job_id, ENDED, timeout=300)
    assert job["status"] == "succeeded" and job["kind"] == "export", job
    return job


def results(server: Server, job: dict) -> dict:
    r = server.api.get(f"/api/jobs/{job['id']}/results")
    assert r.status_code == 200, r.text
    return r.json()


def metric(res: dict, split: str, name: str) -> float:
    found = [m["value"] for m in res["metrics"] if m["split"] == split and m["name"] == name]
    assert found, (split, name, res["metrics"])
    return found[0]


def noted_phases(server: Server, job: dict) -> list[str]:
    """The phases a job's runner noted in its log, in order (one runner line as each began)."""
    named = {words: key for key, words in PHASES.items()}
    return [
        named[g["text"].removeprefix("phase: ").split(" (")[0]]
        for g in server.all(job["id"], "logs")
        if g["stream"] == "runner" and g["text"].startswith("phase: ")
    ]


def test_phases_follow_the_trainers_output(server, trained, exported):
    """The module's real fine-tune goes loading -> training -> saving in that order (with its dataset
    and evaluation between), and keeps its last phase once finished; the export ends exporting."""
    seen = noted_phases(server, trained)
    load, train = seen.index("loading_model"), seen.index("training")
    assert load < train < seen.index("saving", train), seen
    assert "preparing_dataset" in seen[:train] and "evaluating" in seen, seen
    job = server.api.get(f"/api/jobs/{trained['id']}").json()
    assert job["phase"] == seen[-1] and job["phase_at"], (job["phase"], seen)
    merged = noted_phases(server, exported)
    assert merged[0] == "loading_model" and merged[-1] == "exporting", merged
    assert server.api.get(f"/api/jobs/{exported['id']}").json()["phase"] == "exporting"


def test_eval_job_reports_the_adapters_loss(server, assets, trained, page):
    config = infer_config(
        assets, adapter_name_or_path=trained["output_dir"], finetuning_type="lora", **data_keys(assets)
    )
    job = run(server, {"name": "kinds eval", "kind": "eval", "config": config, "gpus": 0})
    assert job["kind"] == "eval"
    ran = server.api.get(f"/api/jobs/{job['id']}/config").json()["train_yaml"]
    assert "do_eval: true" in ran and "do_train: false" in ran
    res = results(server, job)
    on_disk = json.loads((Path(job["output_dir"]) / "eval_results.json").read_text())
    assert metric(res, "eval", "loss") == pytest.approx(on_disk["eval_loss"])
    assert res["predictions"] == 0 and res["export"] is None
    # The job page: each number with its unit, inside its card, at both widths.
    for width, height in SCREENS:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{server.url}/jobs/{job['id']}")
        page.wait_for_selector("#result-metrics tbody tr")
        got = units(page)
        assert got["loss"] == "nats/token" and got["runtime"] == "s", got
        assert got["samples_per_second"] == "samples/s", got
        inside(page, "#result-metrics")
        # A number and its unit are never broken across lines (only a metric's long name wraps).
        lines = page.locator("#result-metrics tbody td:nth-child(n+3)").evaluate_all(
            "cells => cells.map(c => { const r = document.createRange(); r.selectNodeContents(c);"
            " return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; })"
        )
        assert max(lines) <= 1, lines
        # Its memory by time: its only logged step (0) would stand every sample on one x.
        page.wait_for_function("[...window.tunedeck.mem.values()].some(g => g.y.length >= 2)")
        xs = page.evaluate(
            "document.getElementById('mem-chart').data.filter(d => d.y && d.y.length > 1).map(d => d.x)"
        )
        assert xs and all(len(set(x)) > 1 for x in xs), xs
        assert "memory by time" in page.locator("#xaxis-note").inner_text()
        shot(page, f"eval-results-{width}")
    assert page.errors == []


def test_predict_job_scores_and_pages_its_generations(server, assets, trained, page):
    config = infer_config(
        assets,
        adapter_name_or_path=trained["output_dir"],
        finetuning_type="lora",
        max_new_tokens=8,
        **data_keys(assets),
    )
    job = run(server, {"name": "kinds predict", "kind": "predict", "config": config, "gpus": 0})
    res = results(server, job)
    for name in ("bleu-4", "rouge-1", "rouge-l", "samples_per_second"):
        assert metric(res, "predict", name) >= 0
    record(predict_samples_per_second=metric(res, "predict", "samples_per_second"))

    lines = [
        json.loads(x)
        for x in (Path(job["output_dir"]) / "generated_predictions.jsonl").read_text().splitlines()
    ]
    assert res["predictions"] == len(lines) > 2
    first = server.api.get(f"/api/jobs/{job['id']}/predictions", params={"offset": 0, "limit": 2}).json()
    rest = server.api.get(f"/api/jobs/{job['id']}/predictions", params={"offset": 2, "limit": 200}).json()
    assert first["total"] == rest["total"] == len(lines)
    rows = first["rows"] + rest["rows"]
    assert [r["index"] for r in rows] == list(range(len(lines)))
    assert [(r["prompt"], r["label"], r["prediction"]) for r in rows] == [
        (x["prompt"], x["label"], x["predict"]) for x in lines
    ]
    r = server.api.get(f"/api/jobs/{job['id']}/predictions", params={"ofset": 2})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "ofset", r.text

    # The job page: the scores as a table, the generations beside prompt and label, at both widths.
    for width, height in SCREENS:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{server.url}/jobs/{job['id']}")
        page.wait_for_selector("#predictions tbody tr")
        cells = page.locator("#predictions tbody tr").first.locator("td pre").all_inner_texts()
        assert [c.strip() for c in cells] == [lines[0][k].strip() for k in ("prompt", "label", "predict")]
        assert page.locator("#predictions tbody tr").count() == min(20, len(lines))
        # Each number with its unit: LLaMA-Factory's scores are on 0-100, its runtime in seconds.
        got = units(page)
        assert got["bleu-4"].startswith("%") and got["runtime"] == "s", got
        assert got["samples_per_second"] == "samples/s", got
        inside(page, "#result-metrics")
        shot(page, f"predict-results-{width}")
    assert page.errors == []


def test_export_merges_the_adapter_and_a_predict_job_loads_the_export(server, assets, trained, exported):
    out = Path(exported["output_dir"])
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))
    assert not (out / "adapter_config.json").exists()  # merged: a plain model, no adapter left
    export = results(server, exported)["export"]
    assert export["weights_bytes"] == sum(p.stat().st_size for p in out.glob("*.safetensors"))
    assert export["total_bytes"] == sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert {f["path"] for f in export["files"]} >= {"config.json", "model.safetensors"}
    assert export["base_weights_bytes"] == (assets / "demo" / "model" / "model.safetensors").stat().st_size
    adapter = Path(trained["output_dir"]) / "adapter_model.safetensors"
    assert export["adapter_weights_bytes"] == adapter.stat().st_size
    record(
        export_weights_bytes=export["weights_bytes"],
        export_total_bytes=export["total_bytes"],
        base_weights_bytes=export["base_weights_bytes"],
        adapter_weights_bytes=export["adapter_weights_bytes"],
    )
    config = {"model_name_or_path": str(out), "template": "qwen", "max_new_tokens": 4, **data_keys(assets)}
    job = run(server, {"name": "kinds predict export", "kind": "predict", "config": config, "gpus": 0})
    assert results(server, job)["predictions"] > 0


def test_chat_answers_through_the_openai_client_and_idle_stop_frees_the_slot(server, assets, trained, page):
    from openai import OpenAI

    r = server.api.post(
        f"/api/jobs/{trained['id']}/chat", json={"gpus": 0, "max_new_tokens": 12, "do_sample": False}
    )
    assert r.status_code == 201, r.text
    chat = r.json()
    assert chat["kind"] == "chat"
    server.wait(chat["id"], ("running",), timeout=120)
    token = create_token_on(server)
    base = f"{server.url}/api/jobs/{chat['id']}/v1"

    def listening() -> bool:  # the server loads the model first: 503 until it listens
        code = httpx.get(f"{base}/models", headers=bearer(token)).status_code
        assert code in (200, 503), code
        return code == 200

    until(listening, "the chat model server listening", timeout=180, interval=0.5)

    def clock_started():  # the idle clock starts when the server first answers, not while it loads
        with sqlite3.connect(server.workspace / "tunedeck.db") as db:
            return db.execute("SELECT last_used_at FROM jobs WHERE id = ?", (chat["id"],)).fetchone()[0]

    until(clock_started, "the chat job's idle clock started")
    client = OpenAI(base_url=base, api_key=token, max_retries=0)
    answers = []
    for question in ("Who are you?", "What is your name?"):
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": question}], stream=True
        )
        parts = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        answers.append("".join(parts))
    assert all(answers), answers
    # On this open loopback server the stock client works with any key that is no tunedeck token.
    anyone = OpenAI(base_url=base, api_key="none", max_retries=0)
    reply = anyone.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content, reply
    # The chat page streams its answer through the same route.
    page.goto(f"{server.url}/jobs/{chat['id']}/chat")
    page.wait_for_function("() => window.tunedeck && window.tunedeck.ready")
    page.fill("#question", "Who are you?")
    page.click("#send")
    page.wait_for_function("() => window.tunedeck.answers.length === 1")
    assert page.locator(".chat-assistant .chat-text").inner_text().strip()
    shot(page, "chat")
    assert page.errors == []
    # Without a valid tunedeck token nobody gets through, and the model server itself wants its own key.
    assert (
        httpx.post(f"{base}/chat/completions", json={"messages": []}, headers=bearer("tdk_nope")).status_code
        == 401
    )
    port = server.api.get(f"/api/jobs/{chat['id']}").json()  # the port is not published
    assert "api_port" not in port and "api_key" not in port

    # The chat job holds the only CPU slot: a job submitted now waits until the chat goes idle.
    config = infer_config(
        assets,
        adapter_name_or_path=trained["output_dir"],
        finetuning_type="lora",
        max_new_tokens=2,
        **data_keys(assets),
    )
    queued = server.submit({"name": "kinds after chat", "kind": "predict", "config": config, "gpus": 0})
    waiting = server.api.get(f"/api/jobs/{queued['id']}").json()["status"]
    if server.api.get(f"/api/jobs/{chat['id']}").json()["status"] == "running":
        assert waiting == "queued"
    stopped = server.wait(chat["id"], ENDED, timeout=120)
    assert stopped["status"] == "cancelled" and "chat server stopped" in stopped["error"], stopped
    assert job_processes(stopped["run_dir"]) == []
    after = server.wait(queued["id"], ENDED, timeout=300)
    assert after["status"] == "succeeded" and after["started_at"] >= stopped["finished_at"]
    r = server.api.post(f"/api/jobs/{chat['id']}/v1/chat/completions", json={"messages": []})
    assert r.status_code == 409 and "not running" in r.json()["detail"]


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def create_token_on(server: Server) -> str:
    from tunedeck.store.db import make_engine

    engine = make_engine(server.workspace / "tunedeck.db")
    try:
        return create_token(engine, "chat-script", "submitter")
    finally:
        engine.dispose()
