"""Job specs as clients send them: a train YAML read safely into a JobSpec, the 422 error they
raise, and the environment a job is launched with. Checking and rendering a spec is
tunedeck/checks/submission.py's work."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import ValidationError

from tunedeck import schemas, tree
from tunedeck.checks import jobenv
from tunedeck.problems import SpecError, detail
from tunedeck.schemas import JobSpec

MAX_YAML_BYTES = schemas.MAX_YAML_BYTES


class _TooMany(Exception):
    """More keys and list items than allowed: ends the parse at once."""


@cache
def _bounded_loader() -> type:
    # Built by the first parse: PyYAML is loaded when a spec is read, not by every server start.
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """SafeLoader without aliases (no "billion laughs"), with a nesting limit and, when given, a limit
        on keys and list items that stops the parse as soon as it is passed (a parse costs ~30 µs a node)."""

        max_depth = 32
        max_items: int | None = None

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("YAML aliases (*name) are not accepted in job configs")
            # A mapping's keys come with index None, a sequence's items with their position.
            if (
                self.max_items is not None
                and parent is not None
                and (index is None or isinstance(parent, yaml.SequenceNode))
            ):
                self._items = getattr(self, "_items", 0) + 1
                if self._items > self.max_items:
                    raise _TooMany(f"more than {self.max_items} keys and list items (TUNEDECK_SPEC_MAX_KEYS)")
            self._depth = getattr(self, "_depth", 0) + 1
            try:
                if self._depth > self.max_depth:
                    raise yaml.YAMLError(f"YAML nested deeper than {self.max_depth} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return BoundedLoader


def load_yaml(text: str, *, max_items: int | None = None) -> dict[str, Any]:
    if len(text.encode(errors="replace")) > MAX_YAML_BYTES:
        raise SpecError([detail(["config"], f"YAML is larger than {MAX_YAML_BYTES} bytes")])
    import yaml

    loader = _bounded_loader()(text)
    loader.max_items = max_items
    try:
        data = loader.get_single_data()
    except _TooMany as e:
        raise SpecError([detail(["config"], f"has {e}")]) from None
    except yaml.YAMLError as e:
        raise SpecError([detail(["config"], f"not valid YAML: {e}")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SpecError([detail(["config"], "a LLaMA-Factory train YAML must be a mapping of keys")])
    if bad := tree.problems(data, ["config"]):
        raise SpecError([detail(loc, reason) for loc, reason in bad])
    return data


def spec_from_yaml(
    text: str,
    *,
    name: str,
    gpus: int | None = None,
    max_items: int | None = None,
    kind: str = "train",
    nodes: int = 1,
) -> JobSpec:
    """A LLaMA-Factory YAML as-is: its `deepspeed:` path becomes the job's DeepSpeed config."""
    config = load_yaml(text, max_items=max_items)
    ds = config.pop("deepspeed", None)
    try:
        # Validated, not constructed: `kind` is the caller's text, which JobSpec refuses if unknown.
        return JobSpec.model_validate(
            {"name": name, "kind": kind, "config": config, "deepspeed": ds, "gpus": gpus, "nodes": nodes}
        )
    except ValidationError as e:  # e.g. `deepspeed: 5`: located at the YAML key, like every other error
        where = {
            "deepspeed": ("config", "deepspeed"),
            "name": ("query", "name"),
            "gpus": ("query", "gpus"),
            "nodes": ("query", "nodes"),
        }
        msgs: dict[tuple, list[str]] = {}
        for x in e.errors():  # a union's alternatives fail one by one: one message per key
            msgs.setdefault(where.get(str(x["loc"][0]) if x["loc"] else "", ("config",)), []).append(x["msg"])
        raise SpecError([detail(list(loc), " or ".join(m)) for loc, m in msgs.items()]) from None


def launch_env(
    *,
    gpus: int,
    devices: list[int],
    deepspeed: bool,
    offline: bool = True,
    job_env: dict[str, str] | None = None,
    cpu_threads: int | None = None,
    nodes: int = 1,
) -> dict[str, str]:
    """Environment for `llamafactory-cli train` beyond the runner's own (which adds the stop signal):
    ours, then the job's own variables (checked at submit), which win over a default thread count and
    the collective check a multi-node job runs (TUNEDECK_COLLECTIVE_CHECK=0 turns it off, =1 asks it of
    a one-node multi-GPU job)."""
    visible = ",".join(map(str, devices))
    env = {
        "RECORD_VRAM": "1",
        # HIP honours CUDA_VISIBLE_DEVICES too; ROCR_VISIBLE_DEVICES alone is refused by Ray.
        "CUDA_VISIBLE_DEVICES": visible,
        "HIP_VISIBLE_DEVICES": visible,
    }
    if offline:  # unless TUNEDECK_ALLOW_HUB: hub ids were checked against the local cache at submit
        env["HF_HUB_OFFLINE"] = "1"
    if deepspeed or gpus > 1:
        env["FORCE_TORCHRUN"] = "1"
        env["NPROC_PER_NODE"] = str(max(gpus, 1))
    if nodes > 1:  # every rank meets the others and times one all-reduce before training (lf_train)
        env["TUNEDECK_COLLECTIVE_CHECK"] = "1"
    if gpus == 0 and cpu_threads:
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    env.update(jobenv.launch(job_env or {}))
    return env
