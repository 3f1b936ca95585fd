"""Datasets as first-class things: registered by upload or by path (format detected, every row
checked, the dataset_info.json entry written atomically), previewed with the chat template applied
by the trainer's python, and the local models the server can train."""

from __future__ import annotations

import csv
import io
import json
import os
import threading

import pytest

from tunedeck.checks import datasets as listing

ALPACA = [
    {"instruction": "Who are you?", "input": "", "output": "A model."},
    {"instruction": "Add.", "input": "2 and 3", "output": "5"},
]
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
    {
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "2+2?"},
            {"from": "gpt", "value": "4"},
        ]
    },
]
MESSAGES = [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
]


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    from tests.utils.app import App

    outside = tmp_path_factory.mktemp("outside")
    a = App(tmp_path_factory.mktemp("ds") / "ws", assets, TUNEDECK_DATASET_MAX_BYTES="4096").start()
    a.outside = outside
    yield a
    a.stop()


def upload(app, name: str, filename: str, content: bytes, **form: str):
    return app.api.post("/api/datasets", data={"name": name, **form}, files={"file": (filename, content)})


def info(app) -> dict:
    return json.loads((app.workspace / "data" / "dataset_info.json").read_text())


def jsonl(rows) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


def test_an_upload_of_each_format_is_detected_and_its_entry_written(app):
    r = upload(app, "alp", "a.json", json.dumps(ALPACA).encode())
    assert r.status_code == 201, r.text
    got = r.json()
    assert (got["formatting"], got["rows"]) == ("alpaca", 2)
    assert got["columns"] == {"prompt": "instruction", "query": "input", "response": "output"}
    assert "alpaca, 2 rows" in got["detected"]
    assert info(app)["alp"] == {"file_name": "alp.json", "formatting": "alpaca", "columns": got["columns"]}
    assert json.loads((app.workspace / "data" / "alp.json").read_text()) == ALPACA

    # Prompt/response-like columns in a CSV: mapped onto LLaMA-Factory's names.
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerows([["question", "answer"], ["What is 2+2?", "4"], ["Capital of France?", "Paris"]])
    r = upload(app, "qa", "qa.csv", buf.getvalue().encode())
    assert r.status_code == 201, r.text
    assert (r.json()["formatting"], r.json()["columns"]) == (
        "alpaca",
        {"prompt": "question", "response": "answer"},
    )
    assert info(app)["qa"]["file_name"] == "qa.csv"

    r = upload(app, "chat", "c.jsonl", jsonl(SHAREGPT))
    assert r.status_code == 201, r.text
    got = r.json()
    assert (got["formatting"], got["columns"]) == ("sharegpt", {"messages": "conversations"})
    assert got["tags"] == {
        "role_tag": "from",
        "content_tag": "value",
        "user_tag": "human",
        "assistant_tag": "gpt",
        "system_tag": "system",
    }
    r = upload(app, "msgs", "m.json", json.dumps(MESSAGES).encode())
    assert r.status_code == 201, r.text
    assert r.json()["tags"] == {
        "role_tag": "role",
        "content_tag": "content",
        "user_tag": "user",
        "assistant_tag": "assistant",
    }
    assert info(app)["msgs"]["columns"] == {"messages": "messages"}
    # Listed with the rest, row counts included.
    rows = {d["name"]: d for d in app.api.get("/api/datasets").json()["datasets"]}
    assert (rows["chat"]["rows"], rows["chat"]["formatting"]) == (2, "sharegpt")


def test_roles_are_known_pairs_whichever_comes_first_and_tool_turns_are_turns(app):
    rows = [
        # The first row a bad one (the assistant speaks first): the known pair still decides the roles.
        {"conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "y"}]},
        {
            "conversations": [
                {"from": "human", "value": "weather?"},
                {"from": "function_call", "value": "{}"},
                {"from": "observation", "value": "sunny"},
                {"from": "gpt", "value": "Sunny."},
            ],
            "tools": "[]",
        },
    ]
    r = upload(app, "tools", "t.json", json.dumps(rows).encode())
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"].endswith(
        "row 1, column 'conversations', turn 1: role 'gpt' where 'human' was expected"
    )
    r = upload(app, "tools", "t.json", json.dumps(rows[1:]).encode())
    assert r.status_code == 201, r.text
    assert r.json()["columns"] == {"messages": "conversations", "tools": "tools"}
    assert (r.json()["tags"]["user_tag"], r.json()["tags"]["assistant_tag"]) == ("human", "gpt")


def test_parquet_is_read_by_the_trainers_python(app, tmp_path):
    import subprocess

    from tests.utils.servers import PYTHON

    path = tmp_path / "p.parquet"
    subprocess.run(
        [
            PYTHON,
            "-c",
            "import sys, pyarrow as pa, pyarrow.parquet as pq; "
            "pq.write_table(pa.table({'prompt': ['a', 'b', 'c'], 'response': ['x', 'y', 'z']}), sys.argv[1])",
            str(path),
        ],
        check=True,
    )
    r = upload(app, "pq", "p.parquet", path.read_bytes())
    assert r.status_code == 201, r.text
    assert (r.json()["rows"], r.json()["columns"]) == (3, {"prompt": "prompt", "response": "response"})
    assert info(app)["pq"]["file_name"] == "pq.parquet"
    r = upload(app, "pq2", "p.parquet", b"PAR1 not really")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "file"], r.text


@pytest.mark.parametrize(
    ("filename", "content", "said"),
    [
        ("x.json", b'[{"instruction": 1', "not JSON"),
        ("x.json", b'{"a": 1}', "must be a list of rows"),
        ("x.jsonl", jsonl(ALPACA) + b"\n{oops}", "line 3: not JSON"),
        ("x.json", json.dumps([*ALPACA, {"instruction": "q"}]).encode(), "row 3, column 'output': missing"),
        (
            "x.json",
            json.dumps([*ALPACA, {"instruction": ["q"], "output": "a"}]).encode(),
            "row 3, column 'instruction': must be text",
        ),
        ("x.json", json.dumps([{"text": "a"}]).encode(), "no format detected in the columns 'text'"),
        ("x.csv", b"instruction,output\nq,a\nq2,a2,extra\n", "row 2 (line 3): 3 fields, the header has 2"),
        (
            "x.json",
            json.dumps([SHAREGPT[0], {"conversations": [{"from": "gpt", "value": "x"}]}]).encode(),
            "row 2, column 'conversations', turn 1: role 'gpt' where 'human' was expected",
        ),
        (
            "x.json",
            json.dumps([{"conversations": [{"from": "human", "value": "x"}]}]).encode(),
            "row 1, column 'conversations': 1 turns",
        ),
        ("x.json", b"[]", "no rows"),
        ("x.txt", b"hello", "must end in .json"),
        ("x.json", b"\xff\xfe\x00", "not UTF-8"),
    ],
)
def test_a_bad_file_is_a_422_naming_what_is_wrong(app, filename, content, said):
    before = info(app) if (app.workspace / "data" / "dataset_info.json").exists() else {}
    r = upload(app, "bad", filename, content)
    assert r.status_code == 422, r.text
    item = r.json()["detail"][0]
    assert item["loc"] == ["body", "file"] and said in item["msg"], item
    assert "bad" not in before and (not before or "bad" not in info(app))
    assert not list((app.workspace / "data").glob("*bad*"))  # no file left behind either


def test_a_name_that_exists_is_409_and_over_the_limit_is_413(app):
    assert upload(app, "dup", "d.json", json.dumps(ALPACA).encode()).status_code == 201
    r = upload(app, "dup", "d.jsonl", jsonl(ALPACA))
    assert r.status_code == 409 and "already defined" in r.json()["detail"], r.text
    big = json.dumps([{"instruction": "q" * 100, "output": "a"}] * 50).encode()
    assert len(big) > 4096
    r = upload(app, "big", "big.json", big)
    assert r.status_code == 413, r.text
    assert "big" not in info(app) and not (app.workspace / "data" / "big.json").exists()
    far = app.workspace / "big.json"
    far.write_bytes(big)
    r = app.api.post("/api/datasets", data={"name": "big", "path": str(far)})
    assert r.status_code == 413 and "TUNEDECK_DATASET_MAX_BYTES" in r.json()["detail"], r.text
    for bad in ("", "a,b", "../x", "-x", "dataset_info"):
        r = upload(app, bad, "d.json", json.dumps(ALPACA).encode())
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"][0]["loc"] == ["body", "name"], r.text


def test_a_path_inside_the_roots_is_registered_in_place_and_one_outside_is_refused(app, assets):
    mine = app.workspace / "corpus" / "rows.jsonl"
    mine.parent.mkdir()
    mine.write_bytes(jsonl(ALPACA))
    r = app.api.post("/api/datasets", data={"name": "inplace", "path": str(mine)})
    assert r.status_code == 201, r.text
    assert info(app)["inplace"]["file_name"] == str(mine) and r.json()["file"] == str(mine)
    # Beside its own dataset_info.json the entry names it relatively.
    r = app.api.post(
        "/api/datasets", data={"name": "local", "path": "corpus/rows.jsonl", "dataset_dir": str(mine.parent)}
    )
    assert r.status_code == 201, r.text
    assert json.loads((mine.parent / "dataset_info.json").read_text())["local"]["file_name"] == "rows.jsonl"

    secret = app.outside / "s.json"
    secret.write_text(json.dumps(ALPACA))
    link = app.workspace / "link.json"
    link.symlink_to(secret)  # inside by name, outside once resolved
    for path in (str(secret), str(link), "../../../etc/passwd"):
        r = app.api.post("/api/datasets", data={"name": "out", "path": path})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "path"] and "outside" in r.json()["detail"][0]["msg"]
    r = app.api.post(
        "/api/datasets", data={"name": "out", "path": str(mine)}, files={"file": ("a.json", b"[]")}
    )
    assert r.status_code == 422 and "not both" in r.text
    r = app.api.post("/api/datasets", data={"name": "out"})
    assert r.status_code == 422
    r = upload(app, "out", "a.json", json.dumps(ALPACA).encode(), dataset_dir=str(app.outside))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dataset_dir"], r.text
    r = upload(app, "out", "a.json", json.dumps(ALPACA).encode(), dataset_dir=str(app.workspace / "runs"))
    assert r.status_code == 422 and "run folders" in r.text
    assert "out" not in info(app)


def test_the_entry_is_written_atomically_keeping_the_other_entries(app):
    folder = app.workspace / "kept"
    folder.mkdir()
    # A hand-written file with an entry tunedeck does not understand: kept as it was.
    theirs = {"hub": {"hf_hub_url": "org/x", "formatting": "sharegpt", "columns": {"messages": "m"}}}
    (folder / "dataset_info.json").write_text(json.dumps(theirs))
    (folder / "dataset_info.json").chmod(0o640)
    held = (folder / "dataset_info.json").open()  # holds the old inode: its number cannot be reused
    names = [f"c{i}" for i in range(6)]
    answers: dict[str, int] = {}

    def add(n: str) -> None:
        answers[n] = upload(
            app, n, f"{n}.json", json.dumps(ALPACA).encode(), dataset_dir=str(folder)
        ).status_code

    threads = [threading.Thread(target=add, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == dict.fromkeys(names, 201)
    now = json.loads((folder / "dataset_info.json").read_text())
    assert now["hub"] == theirs["hub"] and set(now) == {"hub", *names}
    assert json.loads(held.read()) == theirs  # replaced by a rename, never rewritten in place
    held.close()
    assert (folder / "dataset_info.json").stat().st_mode & 0o777 == 0o640  # its mode kept
    assert (folder / "c0.json").stat().st_mode & 0o777 == 0o644
    assert (
        sorted(p.name for p in folder.iterdir() if p.name.startswith(".dataset_info.") and p.suffix == ".tmp")
        == []
    )
    # A dataset_info.json that does not parse is never overwritten.
    (folder / "dataset_info.json").write_text("{broken")
    r = upload(app, "c9", "c9.json", json.dumps(ALPACA).encode(), dataset_dir=str(folder))
    assert r.status_code == 422 and "fix it" in r.text
    assert (folder / "dataset_info.json").read_text() == "{broken"
    assert [f.path for f in listing.folders(app.settings)]  # the walk still finds the folders


def test_the_preview_applies_the_models_template_and_counts_tokens(app, assets):
    model = str(assets / "demo" / "model")
    assert upload(app, "prev", "p.jsonl", jsonl(SHAREGPT)).status_code in (201, 409)
    r = app.api.get("/api/datasets/prev/preview", params={"model": model, "cutoff_len": 20, "rows": 2})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["template"] == "qwen"  # the tiny model is a Qwen2: its config picks the template
    first, second = got["rows"]
    assert (
        first["text"].startswith("<|im_start|>system\n") and "<|im_start|>user\nhi<|im_end|>" in first["text"]
    )
    assert "<|im_start|>assistant\nhello<|im_end|>" in first["text"]
    assert "<|im_start|>system\nbe brief<|im_end|>" in second["text"]  # the row's own system turn
    assert all(row["tokens"] > row["response_tokens"] > 0 for row in got["rows"])
    assert [row["over_cutoff"] for row in got["rows"]] == [row["tokens"] > 20 for row in got["rows"]]
    # Another template renders other text; a long cutoff cuts nothing.
    r = app.api.get(
        "/api/datasets/demo_identity/preview",
        params={"model": model, "template": "alpaca", "cutoff_len": 4096, "rows": 1},
    )
    assert r.status_code == 200, r.text
    row = r.json()["rows"][0]
    assert "### Instruction:" in row["text"] and "Who are you?" in row["text"] and row["over_cutoff"] is False
    # Refusals: a model outside the roots, an unknown template, no such dataset, unknown parameters.
    r = app.api.get("/api/datasets/prev/preview", params={"model": str(app.outside)})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "model"], r.text
    r = app.api.get("/api/datasets/prev/preview", params={"model": model, "template": "qwen9"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "template"], r.text
    assert app.api.get("/api/datasets/nope/preview", params={"model": model}).status_code == 404
    r = app.api.get("/api/datasets/prev/preview", params={"model": model, "cutof_len": 3})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "cutof_len"], r.text


def test_the_local_models_are_listed_with_what_they_need(app, assets, tmp_path, monkeypatch):
    # An HF cache with one model in it (headers only: no weights are read).
    cache = tmp_path / "hub"
    snap = cache / "models--org--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("abc")
    (snap / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    header = json.dumps({"a": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]}}).encode()
    (snap / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 24)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    r = app.api.get("/api/models")
    assert r.status_code == 200, r.text
    found = {m["path"]: m for m in r.json()["models"]}
    tiny = found[str((assets / "demo" / "model").resolve())]
    config = json.loads((assets / "demo" / "model" / "config.json").read_text())
    assert (tiny["source"], tiny["model_type"], tiny["architecture"]) == (
        "roots",
        "qwen2",
        "Qwen2ForCausalLM",
    )
    assert tiny["templates"][0] == "qwen" and tiny["problem"] is None
    assert tiny["dtype"] == (config.get("dtype") or config.get("torch_dtype") or "float32")
    # The count is the weights' own: read back with safetensors in the trainer's python.
    import subprocess

    from tests.utils.servers import PYTHON

    counted = subprocess.run(
        [
            PYTHON,
            "-c",
            "import sys; from safetensors import safe_open; f = safe_open(sys.argv[1], 'np'); "
            "print(sum(f.get_slice(k).get_shape() and __import__('math').prod(f.get_slice(k).get_shape()) for k in f.keys()))",
            str(assets / "demo" / "model" / "model.safetensors"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert tiny["parameters"] == int(counted) > 100_000
    hub = found[str(snap)]
    assert (hub["source"], hub["hub_id"], hub["parameters"], hub["dtype"]) == (
        "hf_cache",
        "org/tiny",
        12,
        "bfloat16",
    )
    assert app.api.get("/api/models", params={"x": 1}).status_code == 422
    assert os.environ["HF_HUB_CACHE"] == str(cache)
