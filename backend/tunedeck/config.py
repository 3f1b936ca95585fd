"""One Settings object for every tunable. Each field comes from a `TUNEDECK_<NAME>` variable."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    port: int = Field(8420, description="Port `tunedeck serve` binds to.")
    server_url: str | None = Field(
        None,
        description="URL runners and the CLI use to reach the server; default `http://<host>:<port>`.",
    )
    allowed_roots: list[Path] = Field(
        default_factory=list,
        description="Extra folders user paths (model, dataset_dir, ...) may point into; "
        "the workspace is always allowed. JSON list in the environment.",
    )
    cpu_slots: int = Field(1, ge=1, description="How many CPU-only jobs run at once on a node with no GPU.")
    gpu_slots: int | None = Field(
        None,
        ge=0,
        description="Number of GPUs to schedule on; default: what the SMI libraries detect.",
    )
    train_python: Path = Field(
        Path(sys.executable),
        description="Python of the training environment; runners and `llamafactory-cli` come from it.",
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
        0.5, gt=0, description="How often a runner sends its telemetry batch to the server."
    )
    telemetry_batch_max: int = Field(
        2000, ge=1, description="Most items (metric points + log lines) a runner puts in one batch."
    )
    runner_poll_s: float = Field(
        0.2, gt=0, description="How often a runner reads new trainer_log.jsonl lines and output."
    )
    runner_retry_max_s: float = Field(
        10.0, gt=0, description="Longest wait between a runner's retries while the server is away."
    )
    runner_give_up_s: float = Field(
        3600.0,
        gt=0,
        description="After training ends, how long a runner keeps trying to deliver its buffer "
        "before it exits (the server also reads the buffer from the run folder).",
    )
    page_limit: int = Field(1000, ge=1, description="Default page size of history endpoints.")
    page_limit_max: int = Field(20000, ge=1, description="Largest page a client may ask for.")

    @field_validator("workspace", "database", "train_python", mode="after")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        # Runners run in other folders: every stored path is absolute.
        return None if v is None else Path(v).expanduser().absolute()

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
