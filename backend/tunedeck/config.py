"""One Settings object for every tunable. Each field comes from a `TUNEDECK_<NAME>` variable."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# What a Slurm name (partition, account, QOS) and a time limit may look like: checked before any of
# them reaches a batch script (the executor quotes them too).
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
SLURM_TIME = r"^(\d{1,7}(:\d{1,2}){0,2}|\d{1,5}-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$"
SLURM_CONSTRAINT = r"^[A-Za-z0-9_.&|,()\[\]*:-]{1,256}$"

# What an emptied WAL is cut back to (journal_size_limit, every connection); past it, the server
# checkpoints and empties it (`wal_limit_bytes`, services/ingest/upkeep.py).
WAL_LIMIT_BYTES = 64 << 20


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNEDECK_", extra="ignore")

    workspace: Path = Field(
        Path("./tunedeck-workspace"),
        description="Folder that holds the database, the job run folders and the demo assets.",
    )
    database: Path | None = Field(
        None, description="SQLite file of the server; default `<workspace>/tunedeck.db`."
    )
    host: str = Field("127.0.0.1", description="Address `tunedeck serve` binds to.")
    port: int = Field(
        8420, description="Port `tunedeck serve` binds to; 0: a free one, named in every URL printed."
    )
    server_url: str | None = Field(
        None,
        description="URL runners and the CLI use to reach the server; default `http://<host>:<port>`.",
    )
    allowed_roots: list[Path] = Field(
        default_factory=list,
        description="Extra folders user paths (model, dataset_dir, ...) may point into; "
        "the workspace is always allowed. JSON list in the environment.",
    )
    allow_hub: bool = Field(
        False,
        description="Runs may download from the Hugging Face Hub (HF_HUB_OFFLINE is not set) and hub ids "
        "need not be in the local cache. Off: runs are offline and a hub id must already be in the HF cache.",
    )
    allow_network_keys: bool = Field(
        False,
        description="Accept keys that reach the network or push results out: push_to_hub and hub_* keys, "
        "credentials (*_token, *_api_key), report_to other than none/tensorboard, URLs as paths, "
        "DeepSpeed wandb/comet monitors.",
    )
    allow_remote_code: bool = Field(
        False,
        description="Accept `trust_remote_code: true` for a model that ships Python (auto_map, .py files); "
        "that code runs as the server's user. Off: refused (models without code are always accepted).",
    )
    allow_pickles: bool = Field(
        False,
        description="Accept keys whose loader unpickles (torch.load) files no tunedeck run wrote: "
        "`resume_from_checkpoint` outside a tunedeck run's `checkpoint-N`, `.bin` weights or adapters with no "
        "safetensors beside them. Unpickling runs code as the server's user. Off: refused (tunedeck's own runs "
        "and safetensors weights are always accepted).",
    )
    scratch_root: Path | None = Field(
        None,
        description="Folder for large temporary files (DeepSpeed `nvme_path` swap on a local NVMe): a key the "
        "trainer writes may name an absolute path inside it, which lands in the job's own folder there "
        "(`<scratch_root>/<id>-<name>/...`). Unset: such keys take paths relative to the job's run folder only.",
    )
    cpu_slots: int = Field(1, ge=1, description="How many CPU-only jobs run at once on a node with no GPU.")
    gpu_slots: int | None = Field(
        None,
        ge=0,
        description="Number of GPUs to schedule on; default: what the SMI libraries detect.",
    )
    executor: Literal["local", "ray", "slurm"] = Field(
        "local",
        description="Where jobs run: `local` starts runners on this host; `ray` places them on a Ray "
        "cluster (the `.[ray]` extra), one runner per node of the job; `slurm` submits each job to a "
        "Slurm cluster with sbatch (srun starts one runner per node).",
    )
    slurm_partition: str | None = Field(
        None,
        pattern=SLURM_NAME,
        description="Slurm partition for jobs that name none (their `slurm.partition`); unset: the "
        "cluster's default partition.",
    )
    slurm_account: str | None = Field(
        None, pattern=SLURM_NAME, description="Slurm account (`--account`) for jobs that name none."
    )
    slurm_qos: str | None = Field(
        None, pattern=SLURM_NAME, description="Slurm QOS (`--qos`) for jobs that name none."
    )
    slurm_time: str | None = Field(
        None,
        pattern=SLURM_TIME,
        description="Slurm time limit (`--time`, e.g. `4:00:00` or `1-12`) for jobs that name none; "
        "unset: the partition's default.",
    )
    slurm_warn_s: int = Field(
        120,
        ge=0,
        le=3600,
        description="Seconds before a Slurm job's time limit that Slurm warns its runners (`--signal=USR1@N`): "
        "each rank stops after the step and saves a checkpoint, and the job is resumed from it "
        "(`auto_resume_attempts`). 0: no warning (the time limit kills the run where it is).",
    )
    auto_resume_attempts: int = Field(
        5,
        ge=0,
        le=100,
        description="How many times in a row a train job stopped by its allocation's time limit (a runner "
        "warned with SIGUSR1, on any executor) is resumed from the checkpoint it saved, each attempt a "
        "new job whose `parent_id` is the last; 0: never.",
    )
    ray_address: str = Field(
        "auto",
        description="Address of the Ray cluster the `ray` executor joins (`ray.init(address=...)`); "
        "`auto` finds the one started on this host.",
    )
    train_python: Path = Field(
        Path(sys.executable),
        description="Python of the training environment; runners and `llamafactory-cli` come from it.",
    )
    launch_paused: bool = Field(
        False, description="Hold queued jobs (maintenance, draining a node); running jobs are still watched."
    )
    backfill_max_wait_s: float = Field(
        1800.0,
        ge=0,
        description="How long a queued job asking for a GPU count lets later, smaller jobs start on idle GPUs "
        "before it keeps every GPU that frees until it can start (0: no overtaking it).",
    )
    scheduler_interval_s: float = Field(1.0, gt=0, description="How often the scheduler looks at the queue.")
    cancel_abort_grace_s: float = Field(
        60.0,
        ge=0,
        description="After SIGABRT (LLaMA-Factory's graceful stop) how long to wait before SIGTERM.",
    )
    cancel_term_grace_s: float = Field(
        15.0, ge=0, description="After SIGTERM how long to wait before SIGKILL."
    )
    telemetry_flush_s: float = Field(
        0.5,
        gt=0,
        description="How long a runner holds output lines before sending them (trainer_log lines "
        "and memory samples go at once, and take waiting output lines along).",
    )
    telemetry_batch_max: int = Field(
        2000, ge=1, description="Most items (metric points + log lines) a runner puts in one batch."
    )
    runner_poll_s: float = Field(
        0.2,
        gt=0,
        description="How often a runner that polls (see `runner_watch`) looks for new trainer_log.jsonl lines.",
    )
    runner_watch: Literal["auto", "poll"] = Field(
        "auto",
        description="How a runner notices new trainer_log.jsonl lines: `auto` is inotify (each line is sent as it "
        "is written), polling every `runner_poll_s` where inotify cannot be had; `poll` always polls (a network "
        "file system written from another host).",
    )
    runner_transport: Literal["http", "files"] = Field(
        "http",
        description="How runners report: `http` posts each batch to the server (`server_url`); `files` only "
        "appends it to the runner's outbox in the run folder, and the server reads the outboxes from there "
        "every `outbox_poll_s`: for compute nodes that cannot reach the server (behind an HPC login node) "
        "but share its file system. Stack dumps go through the run folder too.",
    )
    outbox_poll_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="With `runner_transport=files`: how often the server reads each running job's outboxes.",
    )
    runner_retry_max_s: float = Field(
        10.0, gt=0, description="Longest wait between a runner's retries while the server is away."
    )
    runner_give_up_s: float = Field(
        3600.0,
        gt=0,
        description="After training ends, how long a runner keeps trying to deliver its buffer while the "
        "server answers (a full disk) before it exits (the server also reads the buffer from the run folder).",
    )
    runner_unreachable_s: float = Field(
        120.0,
        gt=0,
        description="After training ends, how long a runner keeps retrying while no server answers at all "
        "(refused or timed out) before it exits; one stopped with SIGTERM tells its runners, which then exit "
        "at once. Its outbox stays in the run folder, replayed when the server finds the runner gone.",
    )
    open_read: bool = Field(
        True,
        description="Reading needs no token; false: any valid token (a viewer's for a wall screen). Unset, "
        "reads are open on a loopback address only: off loopback they need a token unless this is set "
        "explicitly, and the start then warns that anyone who can reach the port reads everything.",
    )
    open_write: bool = Field(
        True,
        description="Submitting and cancelling need no token. Only allowed on a loopback address: "
        "the server refuses to start on another address with writes open.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names the server answers to besides its bind address, localhost and IP addresses "
        "(a guard against DNS rebinding); list the names people use when binding 0.0.0.0. JSON list; "
        '`["*"]` answers any name.',
    )
    admin_token_file: Path | None = Field(
        None,
        description="File holding an admin token: at start, when no admin token is active, the token in it is "
        "registered, or a new one is created and written there (mode 0600). For containers.",
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Largest request body the server reads (413 beyond)."
    )
    import_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Largest body of `POST /api/runs/import` (its files stream to disk; 413 beyond). A "
        "200k-step trainer_log.jsonl is about 50 MB.",
    )
    dataset_max_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1024,
        description="Largest dataset file `POST /api/datasets` registers, uploaded or named by path (413 "
        "beyond); every row of it is read and checked.",
    )
    token: str | None = Field(None, description="Bearer token the CLI sends to the server.")
    memory_raw_retention_days: float | None = Field(
        30.0,
        gt=0,
        description="Days after a job ends (an imported run: after its import, if later) before its raw memory "
        "samples are dropped (each GPU's highest and newest stay; charts draw from the kept chart tiles); "
        "unset or empty keeps raw samples forever.",
    )
    memory_rollup_s: float = Field(
        60.0,
        gt=0,
        description="Finest memory chart resolution kept after retention, in seconds: narrower chart tiles "
        "go with the raw samples.",
    )
    retention_check_s: float = Field(
        3600.0, gt=0, description="How often the server looks for jobs due for retention."
    )
    wal_limit_bytes: int = Field(
        WAL_LIMIT_BYTES,
        ge=1 << 20,
        description="The database's WAL file is checkpointed and emptied when it grows past this (open team "
        "streams keep SQLite's own checkpoint from rewinding it).",
    )
    storage_survey_s: float = Field(
        6 * 3600.0,
        ge=0,
        description="How often the server measures what a day of telemetry costs on disk (/api/health "
        "`storage.day`; it reads every page of the file, beside serving, in a thread at the lowest CPU and I/O "
        "priorities); 0 never.",
    )
    page_limit: int = Field(1000, ge=1, description="Default page size of history endpoints.")
    page_limit_max: int = Field(20000, ge=1, description="Largest page a client may ask for.")
    # memory telemetry, alerts, webhooks
    memory_sample_s: float = Field(
        1.0,
        ge=0.1,
        description="Interval of a runner's memory samples (each keeps the maximum seen inside it).",
    )
    memory_polls: int = Field(4, ge=1, le=100, description="SMI polls per memory sample interval.")
    trainer_rlimit_as_bytes: int | None = Field(
        None,
        ge=1 << 26,
        description="Address-space limit (RLIMIT_AS) for the trainer on CPU nodes: a run that needs more fails "
        "with an out-of-memory error instead of swapping the host.",
    )
    estimate_cpu_runtime_bytes: int = Field(
        475 * 2**20,
        ge=0,
        description="Memory a CPU fine-tune holds before any tensor: the RSS of `train_python` after importing "
        "torch, transformers and LLaMA-Factory's trainer. The default was read with torch 2 (CPU build); "
        "measure it in your training environment for a closer CPU estimate.",
    )
    alert_interval_s: float = Field(
        2.0,
        gt=0,
        description="Shortest time between two alert evaluations of a job; a sample that spikes or reaches "
        "the near-OOM share is judged at once.",
    )
    alert_near_oom_share: float = Field(
        0.95, gt=0, le=1, description="Share of device memory that, sustained, raises `vram_near_oom`."
    )
    alert_stall_min_s: float = Field(
        120.0,
        gt=0,
        description="No step progress for at least this long (and 10 usual step times) is a `stall`.",
    )
    alert_hold_s: float = Field(
        300.0, gt=0, description="A spike alert stays open this long after its last occurrence."
    )
    alert_state_save_s: float = Field(
        600.0,
        ge=0,
        description="How often a running job's detector state is saved (and at shutdown): a restarted server "
        "resumes it from the rows stored after it instead of feeding the detectors every stored sample "
        "again (0: never saved).",
    )
    webhook_urls: list[str] = Field(
        default_factory=list,
        description="URLs that get a JSON POST (Slack-compatible `text`) on alerts and job ends.",
    )
    webhook_min_severity: str = Field(
        "warning", pattern="^(info|warning|critical)$", description="Least alert severity sent to webhooks."
    )
    webhook_retries: int = Field(
        3, ge=0, le=20, description="Retries of a failed webhook POST (backing off)."
    )
    nodes_cache_s: float = Field(
        3.0, ge=0, description="How long `GET /api/nodes` reuses its reading of the host GPUs."
    )
    preflight_ttl_s: float = Field(
        600.0, ge=0, description="How long a preflight of the training environment is reused."
    )
    stream_ping_s: float = Field(
        15.0, gt=0, description="Keep-alive comment interval of the live (SSE) streams."
    )
    stream_poll_s: float = Field(
        0.5, gt=0, description="How often the stream watcher looks for job changes made outside ingest."
    )
    stream_batch_max: int = Field(2000, ge=1, description="Most rows of one kind in one live-stream event.")
    stream_team_every_s: float = Field(
        0.5,
        ge=0,
        description="Shortest time between two wake-ups of the team streams: the job rows changed "
        "meanwhile go out together, in their newest state (0: at every change).",
    )
    chart_points: int = Field(2000, ge=10, description="Default `max_points` of the chart series endpoint.")
    spec_max_keys: int = Field(
        1000,
        ge=10,
        description="Most keys and list items (nested ones counted, DeepSpeed config included) a job spec or "
        "train YAML may have; lint, preview and YAML parsing refuse larger ones before doing the work.",
    )
    ingest_process: bool = Field(
        True,
        description="Store runners' telemetry in a process of its own, started with the first runner: "
        "inserts and chart tiles use a second core instead of taking turns for the server's GIL. "
        "Off: in a thread of the server's process.",
    )
    integrity_check: Literal["background", "start"] = Field(
        "background",
        description="When the database's full integrity check (SQLite's quick_check, 1–5 s of CPU per GiB) runs: "
        "`background` checks the header and schema at start and the whole file beside the serving server, "
        "in a thread at the lowest CPU and I/O priorities "
        "(`/api/health` says when it ran and what it found; damage found is refused at every later start "
        "until `tunedeck db restore`); `start`: the whole file before the server answers.",
    )
    db_busy_timeout_s: float = Field(
        30.0,
        gt=0,
        description="How long a request waits for another writer's lock on the database before it is "
        "answered 503 `database busy, retry` (with Retry-After).",
    )
    preflight_refresh_min_s: float = Field(
        5.0,
        ge=0,
        description="A preflight refresh asked within this long of the last probe gets that probe's result; "
        "refreshes asked while a probe runs always share it.",
    )
    chat_idle_s: float = Field(
        900.0,
        gt=0,
        description="A chat job (`llamafactory-cli api`) that gets no completion through tunedeck for this long "
        "(counted from its server's first answer: loading the model is not idleness) is stopped, and its GPU or "
        "CPU slot freed.",
    )

    @field_validator(
        "workspace", "database", "train_python", "admin_token_file", "scratch_root", mode="after"
    )
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        # Runners run in other folders: every stored path is absolute.
        return None if v is None else Path(v).expanduser().absolute()

    @model_validator(mode="after")
    def _scratch_outside_runs(self) -> Settings:
        # A job's scratch folder inside the runs folder would be inside some job's run folder.
        if self.scratch_root is not None and self.scratch_root.resolve().is_relative_to(
            self.runs_dir.resolve()
        ):
            raise ValueError(
                f"scratch_root {self.scratch_root} must lie outside the runs folder {self.runs_dir}"
            )
        return self

    @property
    def open_read_given(self) -> bool:
        """TUNEDECK_OPEN_READ was set (environment or argument), not left at its default."""
        return "open_read" in self.model_fields_set

    @property
    def db_path(self) -> Path:
        return self.database or self.workspace / "tunedeck.db"

    @property
    def runs_dir(self) -> Path:
        return self.workspace / "runs"

    @property
    def url(self) -> str:
        if self.server_url:
            return self.server_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def roots(self) -> list[Path]:
        """Folders user paths must resolve into (symlinks resolved)."""
        return [self.workspace.resolve(), *(Path(p).expanduser().resolve() for p in self.allowed_roots)]


@lru_cache
def get_settings() -> Settings:
    return Settings()
