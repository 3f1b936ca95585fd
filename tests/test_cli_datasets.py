"""`tunedeck datasets list | add | preview` and `tunedeck models` as subprocesses against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROWS = [
    {"instruction": "Who are you?", "input": "", "output": "A model."},
    {"instruction": "Add.", "input": "2 and 3", "output": "5"},
]


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_datasets_and_models_from_the_command_line(server_factory, assets, tmp_path):
    server = server_factory()
    env = {**os.environ, "TUNEDECK_SERVER_URL": server.url}
    mine = tmp_path / "mine.jsonl"
    mine.write_text("\n".join(json.dumps(r) for r in ROWS))

    r = cli("datasets", "add", "mine", str(mine), env=env)
    assert r.returncode == 0, r.stderr
    assert "added mine to" in r.stdout and "alpaca, 2 rows" in r.stdout, r.stdout
    r = cli("datasets", "add", "mine", str(mine), env=env)  # the name is taken now
    assert r.returncode == 1 and "409" in r.stderr and "already defined" in r.stderr, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"instruction": "q", "output": "a"}, {"instruction": "q2"}]))
    r = cli("datasets", "add", "bad", str(bad), env=env)
    assert r.returncode == 1 and "body.file:" in r.stderr and "row 2, column 'output': missing" in r.stderr
    r = cli("datasets", "add", "far", "--path", str(tmp_path / "mine.jsonl"), env=env)  # not inside the roots
    assert r.returncode == 1 and "body.path:" in r.stderr and "outside the allowed roots" in r.stderr
    r = cli("datasets", "add", "both", str(mine), "--path", "x.json", env=env)
    assert r.returncode == 2 and "not both" in r.stderr
    in_roots = str(assets / "demo" / "data" / "demo_identity_small.json")
    r = cli("datasets", "add", "small", "--path", in_roots, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["entry"]["file_name"] == in_roots

    r = cli("datasets", "list", env=env)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert {"mine", "small", "demo_identity"} <= set(lines)
    assert " 2 rows" in lines["mine"] and "alpaca" in lines["mine"]
    listed = json.loads(cli("datasets", "list", "--json", env=env).stdout)
    assert {d["name"] for d in listed} >= {"mine", "small"}

    model = str(assets / "demo" / "model")
    r = cli("datasets", "preview", "mine", "--model", model, "--cutoff-len", "16", "--rows", "2", env=env)
    assert r.returncode == 0, r.stderr
    assert "with template qwen, cutoff_len 16" in r.stdout
    assert r.stdout.count("OVER cutoff_len") == 2 and "<|im_start|>user\nWho are you?<|im_end|>" in r.stdout
    r = cli("datasets", "preview", "mine", "--model", model, "--template", "nope", env=env)
    assert r.returncode == 1 and "query.template:" in r.stderr

    r = cli("models", env=env)
    assert r.returncode == 0, r.stderr
    line = next(
        x for x in r.stdout.splitlines() if x.rstrip().endswith(str((assets / "demo" / "model").resolve()))
    )
    assert "Qwen2ForCausalLM" in line and "template=qwen" in line
    found = json.loads(cli("models", "--json", env=env).stdout)
    assert any(m["architecture"] == "Qwen2ForCausalLM" and m["parameters"] for m in found)
