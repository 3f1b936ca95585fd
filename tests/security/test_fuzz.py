"""Fuzz the OpenAPI of a real, closed server with schemathesis, and reach its data (bounded for CI).

Before the first generated request the server holds real rows (queued jobs, another owner's job, a
cancelled one, an imported run with metrics, memory and alerts; tokens made with `tunedeck token
create`) and generated requests name them. Valid job specs (the demo model and data) are mixed into
the generated bodies, a state machine walks submit → read → cancel, every answer is checked against
the schema, every operation must answer 2xx at least once, and afterwards the SQLite file holds
nothing malformed. Statuses per operation go to test-output/fuzz.json.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule, run_state_machine_as_test

from tests.alerts.corpus import generate, write_run
from tests.utils.servers import OUTPUT, PYTHON, Server, demo_config, runner_token
from tunedeck.checks import kinds

schemathesis = pytest.importorskip("schemathesis")

CASES = int(os.environ.get("TUNEDECK_FUZZ_CASES", "36"))  # generated cases per operation
RUNS = int(os.environ.get("TUNEDECK_FUZZ_RUNS", "10"))  # state machine runs
STEPS = int(os.environ.get("TUNEDECK_FUZZ_STEPS", "20"))  # most steps per state machine run
WRITE = {"X-Tunedeck": "1"}  # the header a cross-site form cannot send (the CSRF rule for writes)
# A failure is reported as found: shrinking it over HTTP would take unbounded time.
NO_SHRINK = [Phase.explicit, Phase.generate]


def bounded(max_examples: int, **more) -> settings:
    """Every fuzz run's hypothesis settings: a fixed number of cases, no shrinking, no time limit."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        phases=NO_SHRINK,
        suppress_health_check=list(HealthCheck),
        **more,
    )


STREAM = "GET /api/stream"
DELETE = "DELETE /api/jobs/{job_id}"
DELETE_PRESET = "DELETE /api/presets/{name}"
CLONE = "POST /api/jobs/{job_id}/clone"
TELEMETRY = "POST /api/jobs/{job_id}/telemetry"
COMPARE = "GET /api/compare"
# These need a trained model or a running chat server, which a paused fuzz server never has: they are
# fuzzed for conformance here and answer 2xx in tests/integration/test_kinds.py.
NEEDS_A_MODEL = {
    "POST /api/jobs/{job_id}/chat",
    "GET /api/jobs/{job_id}/v1/models",
    "POST /api/jobs/{job_id}/v1/chat/completions",
}
# A stack dump is asked of, sent for and read back from a running job: these answer 2xx in the runner
# test below, where a job runs.
STACKS = (
    "POST /api/jobs/{job_id}/stacks",
    "POST /api/jobs/{job_id}/telemetry/stacks",
    "GET /api/jobs/{job_id}/stacks",
)
JOB_READS = [STREAM] + [
    f"GET /api/jobs/{{job_id}}{tail}"
    for tail in ("", "/metrics", "/logs", "/config", "/files", "/series", "/memory", "/alerts", "/estimate")
]
BODY_LIMIT = 262144  # the fuzz server's TUNEDECK_MAX_BODY_BYTES
START = "m0-l0-s0-a0-j0"  # a stream cursor before every row
NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,30}", fullmatch=True)


@functools.cache
def conformance_checks() -> list:
    from schemathesis import checks

    return [
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
        checks.response_headers_conformance,
    ]


# ---------------------------------------------------------------- what was sent and what came back


class Tally:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.statuses: dict[str, Counter] = defaultdict(Counter)
        self.seconds: Counter = Counter()
        self.failures: dict[tuple[str, str, str], str] = {}  # (test, operation, failure) -> a curl showing it
        self.known: Counter = Counter()  # failures another change fixes, by reason
        self.phase = "seeding"
        self.by_phase: Counter = Counter()

    def record(self, label: str, status: int, seconds: float) -> None:
        self.statuses[label][status] += 1
        self.by_phase[self.phase] += 1
        self.seconds[label] += seconds

    def two_xx(self, label: str) -> int:
        return sum(n for status, n in self.statuses[label].items() if 200 <= status < 300)

    def report(self) -> dict:
        return {
            "requests": sum(sum(c.values()) for c in self.statuses.values()),
            "seconds": round(time.monotonic() - self.started, 1),
            "requests_per_test": dict(self.by_phase),
            "operations": {label: dict(sorted(c.items())) for label, c in sorted(self.statuses.items())},
            "seconds_per_operation": {label: round(t, 1) for label, t in self.seconds.most_common()},
            "failures": self.failures_of(),
            "known": dict(self.known),
        }

    def failures_of(self, phase: str | None = None) -> list[str]:
        return [
            f"{op}: {what}\n  {curl}" for (ph, op, what), curl in self.failures.items() if phase in (None, ph)
        ]


TALLY = Tally()


def exercise(case, headers: dict[str, str]):
    """Send one case and check its answer against the schema; failures are collected, not raised."""
    from schemathesis.errors import FailureGroup

    label = case.operation.label
    # An event stream never ends: schemathesis reads it for this long, or until its first event.
    started = time.monotonic()
    response = case.call(headers=headers, timeout=1 if label == STREAM else 60)
    TALLY.record(label, response.status_code, time.monotonic() - started)
    try:
        case.validate_response(response, checks=conformance_checks(), headers=headers)
    except FailureGroup as group:
        if reason := known_bug(case, response):
            TALLY.known[reason] += 1
            return response
        for failure in group.exceptions:
            TALLY.failures.setdefault(
                (TALLY.phase, label, f"{failure.title} ({response.status_code})"),
                case.as_curl_command(headers=headers),
            )
    return response


def follows_name_rules(name: object) -> bool:
    from tunedeck.schemas import JobSpec

    try:
        JobSpec.model_validate({"name": name, "config": {}})
    except ValueError:
        return False
    return True


def known_bug(case, response) -> str | None:
    """A failure that another change fixes: counted and listed, not failed on.

    Drop each entry once that change has landed (the fuzzer then holds the line)."""
    return None


def stream_config():
    from schemathesis import Config

    return Config.from_dict({"max-stream-events": 1})


# ---------------------------------------------------------------- valid inputs


def valid_specs(assets: Path) -> st.SearchStrategy[dict]:
    """Job specs that must be accepted: the demo preset with train keys varied inside sane ranges."""
    overrides = st.fixed_dictionaries(
        {},
        optional={
            "learning_rate": st.floats(1e-6, 1e-2),
            "max_steps": st.integers(1, 500),
            "per_device_train_batch_size": st.integers(1, 8),
            "gradient_accumulation_steps": st.integers(1, 8),
            "cutoff_len": st.integers(16, 1024),
            "lora_rank": st.sampled_from([4, 8, 16]),
            "seed": st.integers(0, 2**31 - 1),
            "warmup_steps": st.integers(0, 10),
            "lr_scheduler_type": st.sampled_from(["cosine", "linear", "constant"]),
        },
    )
    return st.builds(
        lambda name, o, gpus: {"name": name, "config": demo_config(assets, **o), "gpus": gpus},
        NAMES,
        overrides,
        st.sampled_from([0, None]),
    )


def trainer_log(losses: list[float]) -> str:
    """LLaMA-Factory's trainer_log.jsonl for these per-step losses."""
    n = len(losses)
    return "".join(
        json.dumps(
            {
                "current_steps": i + 1,
                "total_steps": n,
                "loss": loss,
                "lr": 1e-4,
                "epoch": (i + 1) / n,
                "percentage": round(100 * (i + 1) / n, 2),
                "elapsed_time": "0:00:01",
                "remaining_time": "0:00:01",
            }
        )
        + "\n"
        for i, loss in enumerate(losses)
    )


TRAINER_LOGS = st.lists(st.floats(0.01, 20.0), min_size=1, max_size=30).map(trainer_log)


def valid_batches(job_line: int = 10**6) -> st.SearchStrategy[dict]:
    """Runner batches that must be stored (lines far above the runner's own, so they never collide)."""
    point = st.builds(
        lambda i, loss: {
            "line": job_line + i,
            "t": time.time(),
            "raw": json.dumps({"current_steps": i + 1, "loss": loss}),
        },
        st.integers(0, 1000),
        st.floats(0.01, 20.0),
    )
    line = st.builds(
        lambda i, text: {"line": job_line + i, "t": time.time(), "stream": "stdout", "text": text},
        st.integers(0, 1000),
        st.text(max_size=80, alphabet=st.characters(codec="utf-8")),
    )
    return st.fixed_dictionaries(
        {
            "seq": st.integers(0, 2**31),
            "metrics": st.lists(point, max_size=5),
            "logs": st.lists(line, max_size=5),
        }
    )


@st.composite
def replaced(draw, op, **parts: st.SearchStrategy):
    """A generated case of `op` with some of its parts (body, query, ...) drawn from valid inputs."""
    case = draw(op.as_strategy())
    for part, strategy in parts.items():
        setattr(case, part, draw(strategy))
    return case


def valid_variants(op, assets: Path) -> list[st.SearchStrategy]:
    """Cases of `op` whose body (and name) must be accepted, and YAML mappings of any keys."""
    specs = valid_specs(assets)
    data = str(assets / "demo" / "data")
    # Bytes go out as they are; anything else schemathesis sends as YAML of that value.
    yaml_text = specs.map(lambda s: yaml.safe_dump(s["config"]).encode())
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
    # `1:` and `null:` are keys too in YAML.
    keys = st.one_of(st.text(max_size=20), st.integers(), st.none(), st.booleans())
    mappings = st.dictionaries(keys, scalars, max_size=6).map(
        lambda d: yaml.safe_dump(d, sort_keys=False).encode()
    )
    return {
        "POST /api/jobs": [replaced(op, body=specs)],
        "POST /api/lint": [replaced(op, body=specs)],
        "POST /api/ui/preview": [replaced(op, body=specs)],
        "POST /api/estimate": [
            replaced(
                op,
                body=st.builds(lambda s, b: {**s, "device_total_bytes": b}, specs, st.integers(2**30, 2**40)),
            )
        ],
        "POST /api/jobs/yaml": [
            replaced(op, body=yaml_text, query=st.fixed_dictionaries({"name": NAMES, "gpus": st.just(0)})),
            replaced(op, body=mappings),
        ],
        "POST /api/ui/parse-yaml": [replaced(op, body=yaml_text), replaced(op, body=mappings)],
        "POST /api/presets": [
            replaced(
                op,
                body=st.fixed_dictionaries(
                    {"name": NAMES, "text": specs.map(lambda s: yaml.safe_dump(s["config"]))},
                    optional={"description": st.text(max_size=40, alphabet=st.characters(codec="utf-8"))},
                ),
            )
        ],
        "POST /api/runs/import": [
            replaced(op, body=st.fixed_dictionaries({"trainer_log": TRAINER_LOGS, "name": NAMES}))
        ],
        # The form's choices: the demo's own folders (inside the allowed roots).
        "GET /api/ui/datasets": [replaced(op, query=st.just({"dataset_dir": data}))],
        "GET /api/ui/dataset-preview": [
            replaced(
                op,
                query=st.fixed_dictionaries(
                    {
                        "dataset_dir": st.just(data),
                        "name": st.sampled_from(["demo_identity", "demo_identity_small"]),
                    },
                    optional={"rows": st.integers(1, 20)},
                ),
            )
        ],
        # Datasets: a file inside the roots registered under a new name, the demo's previewed by its model.
        "POST /api/datasets": [
            replaced(
                op,
                body=st.fixed_dictionaries(
                    {"name": NAMES, "path": st.just(str(assets / "demo" / "data" / "demo_identity.json"))}
                ),
            )
        ],
        "GET /api/datasets/{name}/preview": [
            replaced(
                op,
                path_parameters=st.just({"name": "demo_identity"}),
                query=st.just({"model": str(assets / "demo" / "model"), "rows": 1}),
            )
        ],
        "GET /api/ui/model-templates": [
            replaced(op, query=st.just({"model": str(assets / "demo" / "model")}))
        ],
    }.get(op.label, [])


# ---------------------------------------------------------------- the server and its seeded rows


@dataclass
class Seeds:
    jobs: list[int]
    imported: int
    presets: list[str]
    stocked: int  # an ended job with an adapter and a resumable checkpoint in its output folder
    doomed: list[int]  # ended jobs for DELETE alone: the others must stay for every other operation
    team_presets: list[str]  # saved for DELETE /api/presets/{name} alone


ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
CHECKPOINT_FILES = ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")


def cli_token(server: Server, name: str, role: str) -> str:
    """A token made the way an admin makes one: `tunedeck token create` on the server's workspace."""
    out = subprocess.run(
        [PYTHON, "-m", "tunedeck.cli.main", "token", "create", "--name", name, "--role", role],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def headers_for(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **WRITE}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, assets):
    # Closed, and launches paused: valid jobs stay queued instead of training.
    server = Server(
        tmp_path_factory.mktemp("fuzz") / "ws",
        assets,
        TUNEDECK_LAUNCH_PAUSED="true",
        TUNEDECK_MAX_BODY_BYTES=str(BODY_LIMIT),
        TUNEDECK_OPEN_WRITE="false",
        TUNEDECK_OPEN_READ="false",
        TUNEDECK_GPU_SLOTS="0",
    )
    server.start()
    TALLY.started = time.monotonic()
    server.tokens = {name: cli_token(server, name, "submitter") for name in ("fuzzer", "rival")}
    # The node's preflight probe imports torch once: start it now, while the rows are seeded.
    probe = threading.Thread(
        target=httpx.get,
        args=(f"{server.url}/api/nodes/local/preflight",),
        kwargs={"headers": headers_for(server.tokens["fuzzer"]), "timeout": 300},
    )
    probe.start()
    yield server
    probe.join()
    server.stop()
    report = TALLY.report()
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / "fuzz.json").write_text(json.dumps(report, indent=2))
    print(f"\nschemathesis: {report['requests']} requests in {report['seconds']} s")
    for label, statuses in report["operations"].items():
        print(f"  {label}: {statuses}")
    for reason, n in report["known"].items():
        print(f"  known, not failed on ({n}x): {reason}")


@pytest.fixture(scope="module")
def schema(fuzz_server):
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json", config=stream_config())


@pytest.fixture(scope="module")
def seeds(fuzz_server, assets, tmp_path_factory) -> Seeds:
    """Real rows for generated requests to name: queued, another owner's, cancelled and imported jobs."""
    me, rival = (
        httpx.Client(base_url=fuzz_server.url, headers=headers_for(fuzz_server.tokens[who]), timeout=60)
        for who in ("fuzzer", "rival")
    )

    def created(r: httpx.Response) -> int:
        assert r.status_code == 201, r.text
        return r.json()["id"]

    queued = created(me.post("/api/jobs", json={"name": "seed-json", "config": demo_config(assets)}))
    from_yaml = created(
        me.post(
            "/api/jobs/yaml",
            params={"name": "seed yaml"},
            content=yaml.safe_dump(demo_config(assets)),
            headers={"Content-Type": "application/yaml"},
        )
    )
    theirs = created(rival.post("/api/jobs", json={"name": "seed-rival", "config": demo_config(assets)}))
    ended = created(me.post("/api/jobs", json={"name": "seed-cancelled", "config": demo_config(assets)}))
    assert me.post(f"/api/jobs/{ended}/cancel").json()["status"] == "cancelled"
    trace = next(t for t in generate(0) if t.name.startswith("single-spike"))
    run = write_run(trace, tmp_path_factory.mktemp("outside"))
    files = {
        "trainer_log": (run / "output" / "trainer_log.jsonl").read_bytes(),
        "memory": (run / "memory.csv").read_bytes(),
        "config": (run / "train.yaml").read_bytes(),
        "log": (run / "output" / "train.log").read_bytes(),
    }
    imported = created(me.post("/api/runs/import", files=files, data={"name": "seed import"}))
    # The imported run must give the reads something to return.
    assert me.get(f"/api/jobs/{imported}/metrics").json()["points"]
    assert me.get(f"/api/jobs/{imported}/memory").json()["samples"]
    assert me.get(f"/api/jobs/{imported}/alerts").json()
    presets = [p["name"] for p in me.get("/api/presets").json()]
    assert presets

    def cancelled(name: str) -> dict:
        job = me.post("/api/jobs", json={"name": name, "config": demo_config(assets)}).json()
        return me.post(f"/api/jobs/{job['id']}/cancel").json()

    stocked = cancelled("seed-stocked")  # what a stopped run leaves: an adapter and a checkpoint
    out = Path(stocked["output_dir"])
    (out / "checkpoint-2").mkdir(parents=True)
    for name in ADAPTER_FILES:
        (out / name).write_bytes(b"{}")
    for name in CHECKPOINT_FILES:
        (out / "checkpoint-2" / name).write_bytes(b"{}")
    doomed = [cancelled(f"seed-doomed-{i}")["id"] for i in range(3)]
    team_presets = [f"seed-preset-{i}" for i in range(3)]
    for name in team_presets:
        saved = me.post("/api/presets", json={"name": name, "text": yaml.safe_dump(demo_config(assets))})
        assert saved.status_code == 201, saved.text
    return Seeds(
        jobs=[queued, from_yaml, theirs, ended, imported, stocked["id"]],
        imported=imported,
        presets=presets,
        stocked=stocked["id"],
        doomed=doomed,
        team_presets=team_presets,
    )


# ---------------------------------------------------------------- stateless: every operation


def variants(op, seeds: Seeds, assets: Path) -> list[st.SearchStrategy]:
    """Generated cases of `op`: as generated, naming seeded rows, and with valid bodies."""
    if op.label == DELETE:  # destructive: only ever the jobs made for it
        return [op.as_strategy(path_parameters={"job_id": j}) for j in seeds.doomed]
    if op.label == DELETE_PRESET:  # the team presets made for it, and the shipped ones (read-only)
        names = seeds.team_presets + seeds.presets
        return [op.as_strategy()] + [op.as_strategy(path_parameters={"name": n}) for n in names]
    out = [op.as_strategy()]
    if "{job_id}" in op.path and "{path}" in op.path:
        out += [op.as_strategy(path_parameters={"job_id": seeds.stocked, "path": p}) for p in ADAPTER_FILES]
    elif "{job_id}" in op.path:
        out += [op.as_strategy(path_parameters={"job_id": j}) for j in seeds.jobs]
    if op.label == CLONE:
        out.append(
            replaced(
                op,
                path_parameters=st.sampled_from([{"job_id": j} for j in seeds.jobs]),
                body=st.fixed_dictionaries({"overrides": st.just({})}, optional={"name": NAMES}),
            )
        )
    if "{name}" in op.path:
        out += [op.as_strategy(path_parameters={"name": n}) for n in seeds.presets]
    if "{node}" in op.path:  # refresh=false: one probe of the node, not one per case
        out.append(op.as_strategy(path_parameters={"node": "local"}, query={"refresh": "false"}))
    if op.label == STREAM:
        out += [op.as_strategy(query={"job": j}) for j in seeds.jobs]
    if op.label == COMPARE:  # ids in a text: generated ones seldom name two seeded jobs
        out += [op.as_strategy(query={"jobs": f"{a},{b}"}) for a, b in zip(seeds.jobs, seeds.jobs[1:])]
    return out + valid_variants(op, assets)


def test_every_operation_conforms_and_reaches_the_data(fuzz_server, schema, seeds, assets):
    """Every operation: generated cases, cases naming seeded rows, and valid bodies; every answer conforms
    to the schema, and each operation answers 2xx at least once (telemetry: see the runner test below)."""
    headers = headers_for(fuzz_server.tokens["fuzzer"])
    TALLY.phase = "every operation"
    labels = []
    for result in schema.get_all_operations():
        op = result.ok()
        labels.append(op.label)

        # An event stream is read for a second when it has nothing to say: fewer cases there.
        @given(case=st.one_of(*variants(op, seeds, assets)))
        @bounded(CASES // 3 if op.label == STREAM else CASES)
        def run(case) -> None:
            exercise(case, headers)

        run()
        if op.label == "POST /api/jobs":  # a body over the limit, once
            big = {"name": "big", "config": {"x": "x" * BODY_LIMIT}}
            exercise(op.Case(body=big, media_type="application/json"), headers)
    assert TALLY.failures_of(TALLY.phase) == [], "\n".join(TALLY.failures_of(TALLY.phase))
    assert [
        label
        for label in labels
        if label != TELEMETRY
        and label not in NEEDS_A_MODEL
        and label not in STACKS
        and not TALLY.two_xx(label)
    ] == []


# ---------------------------------------------------------------- stateful: submit → read → cancel


def test_job_lifecycle_state_machine(fuzz_server, schema, seeds, assets):
    """Submit valid jobs (JSON and YAML) and import runs, read them through every job route with generated
    parameters, cancel them; each answer conforms and agrees with what the machine did."""
    ops = {r.ok().label: r.ok() for r in schema.get_all_operations()}
    headers = headers_for(fuzz_server.tokens["fuzzer"])
    reads = [ops[label] for label in JOB_READS]
    TALLY.phase = "job lifecycle"

    IMPORTED: dict[tuple[str, str], int] = {}  # (trainer_log, name): its job, across examples

    class Lifecycle(RuleBasedStateMachine):
        jobs = Bundle("jobs")

        def __init__(self) -> None:
            super().__init__()
            self.status: dict[int, str] = {}

        def created(self, response, status: str) -> int:
            assert response.status_code == 201, response.text
            job = response.json()
            assert job["status"] == status
            self.status[job["id"]] = status
            return job["id"]

        @rule(target=jobs, spec=valid_specs(assets), as_yaml=st.booleans())
        def submit(self, spec: dict, as_yaml: bool) -> int:
            if as_yaml:
                case = ops["POST /api/jobs/yaml"].Case(
                    query={"name": spec["name"], "gpus": 0},
                    body=yaml.safe_dump(spec["config"]).encode(),
                    media_type="application/yaml",
                )
            else:
                case = ops["POST /api/jobs"].Case(body=spec, media_type="application/json")
            return self.created(exercise(case, headers), "queued")

        @rule(target=jobs, log=TRAINER_LOGS, name=NAMES)
        def import_run(self, log: str, name: str) -> int:
            case = ops["POST /api/runs/import"].Case(
                body={"trainer_log": log, "name": name}, media_type="multipart/form-data"
            )
            response = exercise(case, headers)
            # 200: the same import as before (an earlier example's, or the schema phase's), its job.
            if response.status_code == 200:
                job = response.json()["id"]
                assert IMPORTED.setdefault((log, name), job) == job, "the same import, another job"
                self.status[job] = response.json()["status"]
                return job
            assert (log, name) not in IMPORTED, "the same import again made a new job"
            IMPORTED[log, name] = self.created(response, "succeeded")
            return IMPORTED[log, name]

        @rule(job=jobs, op=st.sampled_from(reads), data=st.data())
        def read(self, job: int, op, data) -> None:
            if op.label == STREAM:  # from the start: the job's row comes first (bad cursors: the test above)
                strategy = op.as_strategy(
                    query={"job": job, "cursor": START}, headers={"last-event-id": START}
                )
            else:
                strategy = op.as_strategy(path_parameters={"job_id": job})
            case = data.draw(strategy)
            response = exercise(case, headers)
            assert response.status_code == 200, f"{op.label}, job {job}: {response.text}"
            if op.label == "GET /api/jobs/{job_id}":
                assert response.json()["status"] == self.status[job]

        @rule(job=jobs)
        def cancel(self, job: int) -> None:
            case = ops["POST /api/jobs/{job_id}/cancel"].Case(path_parameters={"job_id": job})
            response = exercise(case, headers)
            if self.status[job] == "queued":
                assert response.status_code == 200 and response.json()["status"] == "cancelled", response.text
                self.status[job] = "cancelled"
            else:
                assert response.status_code == 409, response.text

    run_state_machine_as_test(
        Lifecycle,
        settings=bounded(RUNS, stateful_step_count=STEPS),
    )
    assert TALLY.failures_of(TALLY.phase) == [], "\n".join(TALLY.failures_of(TALLY.phase))


# ---------------------------------------------------------------- the runner's route, with a live token


def test_runner_telemetry_conforms(server_factory, assets):
    """Telemetry needs a launched job's runner token: fuzz the route with one while the job runs."""
    server = server_factory(TUNEDECK_GPU_SLOTS="0")
    TALLY.phase = "runner telemetry"
    job = server.api.post(
        "/api/jobs", json={"name": "long", "config": demo_config(assets, max_steps=10**6)}, headers=WRITE
    ).json()
    token = runner_token(server, job["id"])
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=stream_config())
    op = schema["/api/jobs/{job_id}/telemetry"]["POST"]
    headers = headers_for(token)
    line = {"line": 10**6, "t": time.time(), "stream": "runner", "text": "fuzz"}
    first = op.Case(
        path_parameters={"job_id": job["id"]},
        media_type="application/json",
        body={"seq": 0, "metrics": [], "logs": [line]},
    )

    # the stacks routes first, while the job surely runs: a fuzzed batch may well report its exit
    fuzz_stacks(server, schema, job["id"], token)

    @given(
        case=st.one_of(
            op.as_strategy(),
            op.as_strategy(path_parameters={"job_id": job["id"]}),
            replaced(op, path_parameters=st.just({"job_id": job["id"]}), body=valid_batches()),
        )
    )
    @example(case=first)  # explicit cases run first: one valid batch while the job surely runs
    @bounded(CASES)
    def run(case) -> None:
        exercise(case, headers)

    run()
    server.api.post(f"/api/jobs/{job['id']}/cancel", headers=WRITE)
    assert TALLY.failures_of(TALLY.phase) == [], "\n".join(TALLY.failures_of(TALLY.phase))
    assert TALLY.two_xx(TELEMETRY) > 0
    assert [label for label in STACKS if not TALLY.two_xx(label)] == []


def fuzz_stacks(server, schema, job: int, token: str) -> None:
    """A dump asked of the running job, a node's report on it (the runner's token) and the dumps read back:
    each once by a valid case, then fuzzed for conformance."""
    ask, report, read = (schema[path][method] for method, path in (s.split(" ", 1) for s in STACKS))
    user = WRITE  # this server runs open: no sign-in, the CSRF header only
    asked = exercise(ask.Case(path_parameters={"job_id": job}), user)
    assert asked.status_code == 202, asked.text
    body = {"request": asked.json()["request"], "processes": [{"pid": 1, "rank": 0, "threads": []}]}
    case = report.Case(path_parameters={"job_id": job}, media_type="application/json", body=body)
    sent = exercise(case, headers_for(token))
    assert sent.status_code == 200, sent.text
    assert exercise(read.Case(path_parameters={"job_id": job}), user).status_code == 200
    for op, headers in ((ask, user), (report, headers_for(token)), (read, user)):

        @given(case=st.one_of(op.as_strategy(), op.as_strategy(path_parameters={"job_id": job})))
        @bounded(CASES // 3)
        def run(case) -> None:
            exercise(case, headers)

        run()


# ---------------------------------------------------------------- afterwards: the stored rows


def test_nothing_stored_is_garbage(fuzz_server, seeds):
    """Whatever the fuzzer got accepted is a well-formed row whose files sit inside the workspace."""
    from tunedeck.store.tables import JobStatus

    db = sqlite3.connect(f"file:{fuzz_server.workspace / 'tunedeck.db'}?mode=ro", uri=True)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    runs = (fuzz_server.workspace / "runs").resolve()
    rows = db.execute(
        "SELECT id, name, owner, status, gpus, spec, train_yaml, run_dir, output_dir, "
        "started_at, finished_at FROM jobs"
    ).fetchall()
    assert len(rows) >= len(seeds.jobs)
    problems = []
    for job_id, name, owner, status, gpus, spec, train_yaml, run_dir, output_dir, started, finished in rows:

        def bad(why: str, job_id=job_id) -> None:
            problems.append(f"job {job_id}: {why}")

        submitted = json.loads(spec)
        if status not in {s.value for s in JobStatus}:
            bad(f"status {status!r}")
        if not isinstance(submitted, dict) or not isinstance(submitted.get("config"), dict):
            bad(f"spec {spec[:80]!r} is not an object with a config object")
        if gpus < 0 or Path(run_dir).resolve().parent != runs or not Path(run_dir).is_dir():
            bad(f"gpus {gpus}, run_dir {run_dir!r}")
        if (finished is None) != (status in ("queued", "running")) or (status == "queued" and started):
            bad(f"{status} with started_at {started}, finished_at {finished}")
        if submitted.get("imported"):
            if status != "succeeded" or Path(output_dir) != Path(run_dir) / "output":
                bad(f"imported but {status}, output_dir {output_dir!r}")
            if not follows_name_rules(name):
                bad(f"imported with name {name!r} that breaks the name rules")
            if owner not in fuzz_server.tokens:
                bad(f"imported with owner {owner!r}")
            continue
        if not follows_name_rules(name):
            bad(f"name {name!r} breaks the name rules")
        if owner not in fuzz_server.tokens or status not in ("queued", "cancelled"):
            bad(f"owner {owner!r}, status {status} (launches are paused)")
        config = yaml.safe_load(train_yaml)
        # Where the job's command writes: output_dir (train, eval, predict), export_dir (export); a chat
        # job writes nothing of its own and names no folder.
        out_key = kinds.output_key(kinds.of(submitted.get("kind", "train")))
        if out_key is None:
            if isinstance(config, dict) and ({"output_dir", "export_dir"} & set(config)):
                bad(f"a {submitted.get('kind')} job's train.yaml names an output folder")
        else:
            written = Path(str(config.get(out_key))) if isinstance(config, dict) else None
            if written != Path(output_dir) or not written.resolve().is_relative_to(runs):
                bad(f"train.yaml {train_yaml[:80]!r} against output_dir {output_dir!r}")
    for (raw,) in db.execute("SELECT raw FROM metric_points"):
        if not isinstance(json.loads(raw), dict):
            problems.append(f"metric line {raw[:80]!r} is not an object")
    streams = {s for (s,) in db.execute("SELECT DISTINCT stream FROM log_lines")}
    severities = {s for (s,) in db.execute("SELECT DISTINCT severity FROM alerts")}
    tokens = db.execute("SELECT name, role, revoked_at FROM api_tokens ORDER BY id").fetchall()
    assert problems == [], "\n".join(problems)
    assert streams <= {"stdout", "stderr", "runner"} and severities <= {"info", "warning", "critical"}
    assert tokens == [("fuzzer", "submitter", None), ("rival", "submitter", None)]
    for name, owner, text in db.execute("SELECT name, owner, text FROM team_presets"):
        if not follows_name_rules(name) or owner not in fuzz_server.tokens:
            problems.append(f"team preset {name!r} of {owner!r}")
        elif not isinstance(yaml.safe_load(text), dict):
            problems.append(f"team preset {name!r} holds {text[:80]!r}, not a YAML mapping")
    assert problems == [], "\n".join(problems)
    assert db.execute("SELECT count(*) FROM metric_points").fetchone()[0] > 0
