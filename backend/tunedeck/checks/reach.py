"""What a job may reach beyond its run folder: paths, the network, Python shipped with a model.

A submitter must not make the trainer read outside the workspace (and `TUNEDECK_ALLOWED_ROOTS`),
write outside the job's own run folder (writes.py), read the server's own files, send results or
credentials to a service, or run code that came with a model or sits in a pickle (pickles.py),
unless the server's settings allow it. The keys that take a path or reach the network are found in
the captured LLaMA-Factory and DeepSpeed key tables by name, type and help text, so a key that a new
version adds is covered without a list to keep up to date.

Its codes depend on the server's `TUNEDECK_ALLOW_*` settings (a path outside the roots, or written
outside the job's own folders, is a plain 422 at the key, with no code):

| code  | sev     | what                                                                        |
|-------|---------|-----------------------------------------------------------------------------|
| LF009 | info    | trust_remote_code: true, but the model carries no code (no effect)          |
| LF010 | error   | trust_remote_code would run the model's code (ALLOW_REMOTE_CODE)            |
| LF011 | warning | the model's code runs as the server's user (allowed by the server)          |
| LF012 | error   | key reaches the network / pushes results out (ALLOW_NETWORK_KEYS)           |
| LF013 | error   | hub id not in the local HF cache and runs are offline (ALLOW_HUB)           |
| LF017 | error   | a loader would unpickle a checkpoint or .bin weights no tunedeck run wrote  |
| LF018 | warning | such pickles are loaded as the server's user (allowed by the server)        |
| DS010 | error   | a monitor that sends to a service: wandb, comet (ALLOW_NETWORK_KEYS)        |
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tunedeck.checks import hubcache, pickles, writes
from tunedeck.checks.findings import Finding, finding
from tunedeck.checks.lint import truthy
from tunedeck.checks.tables import ds_table, lf_table
from tunedeck.config import Settings

# A key takes a path when its name says so, or when a text-typed key's help talks of one.
PATH_NAME = re.compile(r"(_dir|_path|_folder|_file|_logdir|_or_path|_adapters)$")
PATH_HELP = re.compile(r"\b(paths?|file|folder|directory)\b", re.IGNORECASE)
TEXT_KINDS = ("str", "dict", "any", "list")
# ... and it may instead name a hub repository when its help says so (or names a model to load).
HUB_HELP = re.compile(
    r"identifier|huggingface\.co/models|\bmodel id\b|\bdataset name\b|"
    r"\bpath to the (\w+ )?model\b",
    re.IGNORECASE,
)
# Keys that carry a credential, or push results to the hub.
CREDENTIAL = re.compile(r"(^|_)(token|api_key|secret|password|webhook_url)$")
PUSH = re.compile(r"^push_to_hub|^hub_|_hub_model_id$")
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
# report_to values and DeepSpeed monitors that stay on this host; anything else is a service.
LOCAL_REPORTS = {"none", "tensorboard", "csv_monitor"}
LOCAL_MODES = {"local", "offline", "disabled"}
# tunedeck sets output_dir itself and reads `deepspeed` itself (submission.py confines that file).
OWNED = {"output_dir", "deepspeed"}
# LLaMA-Factory joins this one onto the adapter's path (a subfolder), not onto the working folder.
SUBFOLDER_KEYS = {"adapter_folder"}
# `dataset_dir: ONLINE` makes these names hub ids or any local path (load_dataset decides).
DATASET_NAME_KEYS = ("dataset", "eval_dataset")
# Files looked at for .py in one model folder: a bound on the cost of a check that fails closed (a
# bigger folder is refused unchecked), so 19999 or 20001 would serve as well as the round number.
CODE_SCAN_MAX = 20000  # pragma: no mutate
CONFIG_JSON_MAX = 16 << 20  # a *config.json larger than this is refused unread


@dataclass(frozen=True)
class PathKey:
    hub: bool  # may also name a hub repository
    dataset: bool  # ... a dataset repository rather than a model


@lru_cache
def lf_path_keys() -> dict[str, PathKey]:
    """Every LLaMA-Factory argument that takes a path, from the captured table."""
    out = {}
    for key, info in lf_table()["args"].items():
        help_text = info.get("help") or ""
        if info.get("type") in TEXT_KINDS and (PATH_NAME.search(key) or PATH_HELP.search(help_text)):
            hub = bool(HUB_HELP.search(help_text))
            out[key] = PathKey(hub=hub, dataset=hub and "dataset" in help_text.lower())
    return out


@lru_cache
def lf_write_keys() -> dict[str, bool]:
    """The path keys the trainer writes to (by their help) → True for "save or load" ones (written only
    while the folder is absent or empty: LLaMA-Factory's has_tokenized_data)."""
    args = lf_table()["args"]
    return {
        k: writes.when_absent(args[k].get("help") or "")
        for k in lf_path_keys()
        if k not in OWNED and writes.is_write(args[k].get("help"))
    }


@lru_cache
def lf_pickle_keys() -> dict[str, pickles.Loads]:
    """The path keys whose loader unpickles (by their help): checkpoints and weights."""
    args = lf_table()["args"]
    found = {k: pickles.loads(args[k].get("help") or "") for k in lf_path_keys() if k not in lf_write_keys()}
    return {k: v for k, v in found.items() if v is not None}


@lru_cache
def ds_path_keys() -> list[tuple[str, ...]]:
    """Where a DeepSpeed config takes a path (`("zero_optimization", "offload_param", "nvme_path")`)."""
    table = ds_table()
    out = []
    for model, fields in table["models"].items():
        where = tuple(table.get("locations", {}).get(model, model).split("."))
        out += [
            (*where, k) for k, info in fields.items() if info["type"] in TEXT_KINDS and PATH_NAME.search(k)
        ]
    return sorted(out)


@lru_cache
def lf_network_keys() -> dict[str, str]:
    """LLaMA-Factory arguments that reach the network when set, each with what they do."""
    args = lf_table()["args"]
    out = {}
    for key in args:
        if CREDENTIAL.search(key):
            out[key] = "a credential for a remote service"
            prefix = CREDENTIAL.sub("", key)
            if f"use_{prefix}" in args:  # the switch that turns that service on
                out[f"use_{prefix}"] = f"turns on {prefix}, a remote service"
        elif PUSH.search(key):
            out[key] = "pushes results to the Hugging Face Hub"
    return out


def ds_remote_monitors() -> list[str]:
    """DeepSpeed monitor sections that send to a service (wandb, comet, ...)."""
    return [m for m in ds_table().get("monitors", []) if m not in LOCAL_REPORTS]


@dataclass
class Checked:
    errors: list[dict[str, Any]] = field(default_factory=list)  # 422 items: paths outside the roots
    findings: list[Finding] = field(default_factory=list)  # network, hub, remote-code and pickle findings
    writes: list[writes.Placed] = field(default_factory=list)  # placed in the run folder at render


def server_files(settings: Settings) -> set[Path]:
    """The server's own files (its database with its journals, the admin token): no key reaches them."""
    db = settings.db_path
    found = [db, *(db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal"))]
    if settings.admin_token_file is not None:
        found.append(settings.admin_token_file)
    return {p.resolve() for p in found}


def confine(value: str, settings: Settings) -> Path | None:
    """Resolve a user path against the workspace; None when it falls outside every allowed root."""
    p = Path(os.path.expanduser(value))  # "~nobody/x" stays as written (Path.expanduser would raise)
    if not p.is_absolute():
        p = settings.workspace / p
    p = p.resolve()
    return p if any(p == r or p.is_relative_to(r) for r in settings.roots) else None


def is_pathlike(value: str, settings: Settings) -> bool:
    """A local path rather than a hub id (a relative folder that exists in the workspace wins)."""
    if not HUB_ID.fullmatch(value) or ".." in value.split("/"):
        return True
    return (settings.workspace / value).exists()


def read_json(path: Path) -> Any:
    """A JSON file's content; OSError or ValueError when it cannot be read."""
    return json.loads(path.read_text())


class _Checker:
    def __init__(self, settings: Settings, read: Callable[[Path], Any]):
        self.s = settings
        self.read = read
        self.out = Checked()
        self.cache_dir: Path | None = None
        self.own_cache: str | None = None  # a cache_dir the job writes: its own fresh folder, empty now
        self.server_files = server_files(settings)

    def path_error(self, loc: list[Any], msg: str) -> None:
        self.out.errors.append({"loc": loc, "msg": msg, "type": "value_error"})

    def refused(self, loc: list[Any]) -> bool:
        return any(e["loc"] == loc for e in self.out.errors)

    def snapshot(self, repo: str, *, kind: str = "model") -> Path | None:
        """A hub id's local copy where the run will look for it (none in a cache the job writes itself)."""
        if self.own_cache is not None:
            return None
        return hubcache.snapshot(repo, kind=kind, cache_dir=self.cache_dir)

    def network(self, loc: list[Any], what: str, *, code: str = "LF012") -> None:
        if self.s.allow_network_keys:
            return
        self.out.findings.append(
            finding(
                code=code,
                severity="error",
                path=".".join(map(str, loc)),
                message=f"`{loc[-1]}` {what}: this server does not let jobs reach the network",
                fix=f"remove `{loc[-1]}`, or set TUNEDECK_ALLOW_NETWORK_KEYS=true on the server",
            )
        )

    def hub(self, loc: list[Any], repo: str, *, dataset: bool) -> None:
        """A hub id: fine when it is in the local cache or the server lets runs download."""
        kind = "dataset" if dataset else "model"
        if self.s.allow_hub or self.snapshot(repo, kind=kind) is not None:
            return
        where = self.own_cache or self.cache_dir or hubcache.hub_cache()
        folder = self.s.workspace / ("datasets" if dataset else "models") / repo.rsplit("/", 1)[-1]
        fix = (
            f"download it into the workspace (`hf download {repo} --{'repo-type dataset --' if dataset else ''}"
            f"local-dir {folder}`) and point `{loc[-1]}` to that folder, or point it to a folder that "
            f"already holds the {kind}; or put it in the server's HF cache, or set TUNEDECK_ALLOW_HUB=true "
            "on the server"
        )
        self.out.findings.append(
            finding(
                code="LF013",
                severity="error",
                path=".".join(map(str, loc)),
                message=f"{repo!r} is a hub {kind} id that is not in the local Hugging Face cache ({where}); runs are "
                "offline (HF_HUB_OFFLINE=1), so it cannot load",
                fix=fix,
            )
        )

    def place(
        self, value: str, loc: list[Any], *, key: PathKey | None = None, subfolder: bool = False
    ) -> str:
        """One path (or hub id) value: checked, and rewritten to an absolute path inside the roots."""
        if URL.match(value):
            self.network(loc, f"is a URL ({value.split('://')[0]}://...)")
            return value
        if key is not None and key.hub and not is_pathlike(value, self.s):
            self.hub(loc, value, dataset=key.dataset)
            return value
        if subfolder and not Path(value).is_absolute():
            if ".." in Path(value).parts or value.startswith("~"):
                self.path_error(loc, f"subfolder {value!r} must not climb out of its folder")
            return value
        resolved = confine(value, self.s)
        if resolved is None:
            roots = ", ".join(map(str, self.s.roots))
            self.path_error(loc, f"path {value!r} is outside the allowed roots ({roots})")
            return value
        if resolved in self.server_files:
            self.path_error(loc, f"{value!r} is one of the server's own files; no key may point at it")
            return value
        if key is not None and key.hub and not resolved.exists():
            # What the run loads (a model, an adapter, a dataset): a missing one fails only at load time.
            self.path_error(loc, f"{value!r} does not exist (looked for {resolved})")
        return str(resolved)

    def write(self, value: str, loc: list[Any], *, when_absent: bool = False) -> str:
        """A path the trainer writes: placed in the job's run folder (or its scratch folder) at render;
        until then the value reads `<run folder>/...`."""
        if URL.match(value):
            self.network(loc, f"is a URL ({value.split('://')[0]}://...)")
            return value
        if when_absent and Path(value).is_absolute():
            found = confine(value, self.s)
            if found is not None and found.is_dir() and any(found.iterdir()):
                # It holds something: the trainer loads it (tokenized data) and writes nothing there.
                return str(found)
        placed = writes.place(value, tuple(loc), self.s)
        if isinstance(placed, str):
            why = f"{value!r} does not hold anything yet, so " if when_absent else f"{value!r}: "
            self.path_error(loc, why + placed)
            return value
        self.out.writes.append(placed)
        return placed.shown()

    def place_list(self, value: str, loc: list[Any], **kw: Any) -> str:
        # LLaMA-Factory splits several of these on commas: every part must be inside.
        return ",".join(self.place(part.strip(), loc, **kw) for part in value.split(","))

    def nested(self, obj: Any, loc: list[Any], helps: dict[tuple[str, ...], str] | None = None) -> Any:
        """Path-named keys at any depth of a mapping (DeepSpeed sections, dict-valued arguments). A
        key whose help (`helps`, by its place below the top) does not say the trainer writes it is
        read; one without help is taken as written (fail closed)."""
        if isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(v, str) and PATH_NAME.search(str(k)) and v not in ("", "auto"):
                    help_text = (helps or {}).get(tuple(map(str, [*loc[1:], k])))
                    if writes.is_write(help_text):
                        obj[k] = self.write(v, [*loc, k])
                    else:
                        obj[k] = self.place(v, [*loc, k])
                elif isinstance(v, (dict, list)):
                    obj[k] = self.nested(v, [*loc, k], helps)
        elif isinstance(obj, list):
            return [self.nested(v, [*loc, i], helps) for i, v in enumerate(obj)]
        return obj

    # ------------------------------------------------------------------ LLaMA-Factory arguments
    def lf_paths(self, config: dict[str, Any]) -> None:
        keys, args = lf_path_keys(), lf_table()["args"]
        for name in sorted(config, key=lambda n: n != "cache_dir"):  # hub ids are looked up in cache_dir
            value, key, loc = config[name], keys.get(name), ["config", name]
            if name in OWNED or value is None:
                continue
            if (
                isinstance(value, str)
                and value.lstrip().startswith("{")
                and args.get(name, {}).get("type") == "dict"
            ):
                try:  # transformers reads a dict-typed argument given as JSON text as that JSON
                    value = config[name] = json.loads(value)
                except ValueError:
                    pass
            if isinstance(value, (dict, list)):
                config[name] = self.nested(value, loc)
            elif key is None:
                continue
            elif (
                name == "dataset_dir"
                and isinstance(value, str)
                and (value == "ONLINE" or value.startswith("REMOTE:"))
            ):
                self.dataset_names(config, value)
            elif isinstance(value, str) and name in lf_write_keys():
                config[name] = self.write(value, loc, when_absent=lf_write_keys()[name])
                if name == "cache_dir":
                    self.own_cache = config[name]
            elif isinstance(value, str):
                config[name] = self.place_list(value, loc, key=key, subfolder=name in SUBFOLDER_KEYS)
                if name == "cache_dir":
                    self.cache_dir = Path(config[name])
            else:
                self.path_error(loc, f"must be a path (a string); got {type(value).__name__}")
        self.subfolders(config)

    def subfolders(self, config: dict[str, Any]) -> None:
        """A subfolder joined onto a local adapter must stay inside too (a symlink could lead out)."""
        adapters = config.get("adapter_name_or_path")
        for name in (k for k in SUBFOLDER_KEYS if isinstance(config.get(k), str)):
            for base in adapters.split(",") if isinstance(adapters, str) else []:
                if Path(base).is_absolute() and confine(str(Path(base) / config[name]), self.s) is None:
                    self.path_error(
                        ["config", name], f"{config[name]!r} inside {base!r} leads outside the allowed roots"
                    )

    def dataset_names(self, config: dict[str, Any], dataset_dir: str) -> None:
        """`ONLINE`: each dataset name is a hub id or a local path; `REMOTE:org/repo`: a hub dataset."""
        if dataset_dir.startswith("REMOTE:"):
            self.hub(["config", "dataset_dir"], dataset_dir[len("REMOTE:") :], dataset=True)
            return
        for name in DATASET_NAME_KEYS:
            if isinstance(config.get(name), str):
                config[name] = self.place_list(
                    config[name], ["config", name], key=PathKey(hub=True, dataset=True)
                )
            elif config.get(name) is not None:
                self.path_error(["config", name], f"must be a string; got {type(config[name]).__name__}")

    def lf_network(self, config: dict[str, Any]) -> None:
        args = lf_table()["args"]
        for name, what in lf_network_keys().items():
            value = config.get(name)
            info = args.get(name, {})
            used = (
                truthy(value) if info.get("type") == "bool" else value not in (None, "", info.get("default"))
            )
            if name.startswith("use_") and config.get(f"{name[4:]}_mode") in LOCAL_MODES:
                used = False  # the service's own local mode
            if used:
                self.network(["config", name], what)
        if truthy(config.get("push_to_hub")) and self.s.allow_network_keys and not self.s.allow_hub:
            self.out.findings.append(
                finding(
                    code="LF012",
                    severity="error",
                    path="config.push_to_hub",
                    message="`push_to_hub` needs the hub, and runs are offline (HF_HUB_OFFLINE=1)",
                    fix="set TUNEDECK_ALLOW_HUB=true on the server as well",
                )
            )
        report = config.get("report_to")
        items = report.split(",") if isinstance(report, str) else report if isinstance(report, list) else []
        remote = [str(v).strip() for v in items if str(v).strip().lower() not in LOCAL_REPORTS]
        if remote:
            self.network(["config", "report_to"], f"sends metrics to {', '.join(remote)}")

    # ------------------------------------------------------------------ DeepSpeed
    def ds(self, ds: dict[str, Any]) -> None:
        self.nested(ds, ["deepspeed"], writes.ds_helps())
        self.ds_subfolders(ds)
        for section in ds_remote_monitors():
            part = ds.get(section)
            if isinstance(part, dict) and truthy(part.get("enabled")):
                self.network(["deepspeed", section, "enabled"], f"sends metrics to {section}", code="DS010")

    def ds_subfolders(self, ds: dict[str, Any]) -> None:
        """A name DeepSpeed joins onto a written path (`job_name` inside `output_path`, or inside the
        run folder when that is empty) must stay inside it."""
        for where, base in writes.ds_subfolder_keys().items():
            section: Any = ds
            for part in where[:-1]:
                section = section.get(part) if isinstance(section, dict) else None
            if not isinstance(section, dict) or section.get(where[-1]) is None:
                continue
            value, loc = section[where[-1]], ["deepspeed", *where]
            if not isinstance(value, str):
                self.path_error(loc, f"must be a folder name (a string); got {type(value).__name__}")
                continue
            if Path(value).is_absolute() or value.startswith("~"):
                self.path_error(
                    loc, f"{value!r} must be a folder name inside `{base}`, not a path of its own"
                )
                continue
            placed = [w for w in self.out.writes if w.loc == ("deepspeed", *where[:-1], base)]
            if ".." in Path(value).parts:
                why = "must not climb out of it (`..`)"
            elif placed and placed[0].scratch is not None:
                why = None  # the job's own scratch folder holds nothing tunedeck keeps
            else:
                why = writes.relative_problem(f"{placed[0].rel}/{value}" if placed else value)
            if why:
                self.path_error(loc, f"{value!r} inside `{base}` {why}")

    # ------------------------------------------------------------------ pickles
    def pickles(self, config: dict[str, Any]) -> None:
        """Keys whose loader unpickles: only what tunedeck's own runs wrote, or safetensors, unless allowed."""
        adapter_folder = config.get("adapter_folder")
        for name, kind in lf_pickle_keys().items():
            value, loc = config.get(name), ["config", name]
            if name in SUBFOLDER_KEYS or not isinstance(value, str) or self.refused(loc):
                continue
            reasons = []
            for part in filter(None, (v.strip() for v in value.split(","))):
                if URL.match(part):
                    continue
                # A hub id the run downloads (TUNEDECK_ALLOW_HUB) is not here to look at.
                folder = Path(part) if Path(part).is_absolute() else self.snapshot(part)
                if folder is None:
                    continue
                if name == "adapter_name_or_path" and isinstance(adapter_folder, str) and adapter_folder:
                    folder = folder / adapter_folder  # LLaMA-Factory loads the adapter from that subfolder
                why = pickles.why(folder, self.s, kind)
                if why:
                    reasons.append(why)
            if not reasons:
                continue
            what = "; ".join(reasons)
            if self.s.allow_pickles:
                self.out.findings.append(
                    finding(
                        code="LF018",
                        severity="warning",
                        path=f"config.{name}",
                        message=f"unpickles files no tunedeck run wrote, as the server's user ({what})",
                        fix="load only pickles whose source you trust",
                    )
                )
            else:
                self.out.findings.append(
                    finding(
                        code="LF017",
                        severity="error",
                        path=f"config.{name}",
                        message=f"a pickle is code, run as the server's user when loaded: {what}",
                        fix=(
                            "resume a tunedeck run (POST /api/jobs/<id>/resume) or name one of its checkpoint-N "
                            "folders"
                            if kind == "checkpoint"
                            else f"point `{name}` to a tunedeck run's output or checkpoint, or to weights "
                            "saved as safetensors"
                        )
                        + "; or set TUNEDECK_ALLOW_PICKLES=true on the server",
                    )
                )

    # ------------------------------------------------------------------ code shipped with the model
    def remote_code(self, config: dict[str, Any]) -> None:
        if not truthy(config.get("trust_remote_code")):
            return
        seen, code, unknown = [], [], []
        for name in lf_path_keys():
            value = config.get(name)
            if (
                name in SUBFOLDER_KEYS
                or not isinstance(value, str)
                or not ("model" in name or "adapter" in name)
            ):
                continue
            for part in filter(None, (v.strip() for v in value.split(","))):
                if Path(part).is_absolute() and confine(part, self.s) is None:
                    # Refused at its key as "outside the allowed roots", and that is all it is told:
                    # what is inside (a file's name, an auto_map) is no business of whoever asks.
                    continue
                folder = Path(part) if Path(part).is_absolute() else self.snapshot(part)
                if folder is None:
                    unknown.append(f"{name}: {part} (not in the local cache)")
                    continue
                seen.append(str(folder))
                why = code_in(folder, self.read)
                if why:
                    code.append(f"{name}: {why}")
        loc = "config.trust_remote_code"
        if code or unknown:
            what = "; ".join(code + [f"cannot check {u}" for u in unknown])
            if self.s.allow_remote_code:
                self.out.findings.append(
                    finding(
                        code="LF011",
                        severity="warning",
                        path=loc,
                        message=f"runs Python shipped with the model as the server's user ({what})",
                        fix="use it only with models whose code you have read",
                    )
                )
            else:
                self.out.findings.append(
                    finding(
                        code="LF010",
                        severity="error",
                        path=loc,
                        message=f"`trust_remote_code: true` would import Python shipped with the model "
                        f"and run it as the server's user ({what})",
                        fix="use a model without custom code, or set TUNEDECK_ALLOW_REMOTE_CODE=true on the server",
                    )
                )
        elif seen:
            self.out.findings.append(
                finding(
                    code="LF009",
                    severity="info",
                    path=loc,
                    message=f"`trust_remote_code: true` has no effect: {', '.join(seen)} carries no code "
                    "to import (no auto_map, no .py files)",
                    fix="none needed; `trust_remote_code: false` says the same",
                )
            )


def code_in(
    folder: Path, read: Callable[[Path], Any] = read_json, *, max_files: int = CODE_SCAN_MAX
) -> str | None:
    """Why transformers would import Python from this model folder, or None when it would not."""
    if not folder.is_dir():
        return None  # nothing to import; loading fails on its own
    try:
        for cfg in sorted(folder.glob("*config.json")):
            if not cfg.is_file():
                continue
            if cfg.stat().st_size > CONFIG_JSON_MAX:  # transformers would still read its auto_map
                return f"{cfg} is larger than {CONFIG_JSON_MAX} bytes; it was not checked"
            try:
                data = read(cfg)
            except (OSError, ValueError):
                continue  # transformers cannot read it either, so it loads no code from it
            if isinstance(data, dict) and data.get("auto_map"):
                return f"{cfg} has auto_map"
        seen = 0
        for root, dirs, files in os.walk(folder):
            for f in files:
                if f.endswith(".py"):
                    return f"{Path(root) / f} is Python"
            seen += len(files) + len(dirs)
            if seen > max_files:
                return f"{folder} holds more than {max_files} files; not all were checked"
    except OSError as e:
        return f"{folder} could not be read ({e.strerror or e})"
    return None


def check(
    config: dict[str, Any],
    ds: dict[str, Any] | None,
    settings: Settings,
    *,
    read: Callable[[Path], Any] = read_json,
) -> Checked:
    """Confine every path (rewritten in place: a read to an absolute path inside the roots, a write to
    `<run folder>/...`, placed by `Checked.writes` at render), and find network keys, hub ids the run
    cannot load, remote code and pickles that the settings do not allow.
    `read` opens the model's JSON files (a submission passes its own, which reads each once)."""
    c = _Checker(settings, read)
    c.lf_paths(config)
    c.lf_network(config)
    if isinstance(ds, dict):
        c.ds(ds)
    c.remote_code(config)
    c.pickles(config)
    return c.out
