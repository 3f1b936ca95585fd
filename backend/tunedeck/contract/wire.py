"""The packed telemetry batch runners send: memory samples as binary columns after a JSON header.

    b"TDB1" | header length (uint32, little-endian) | header (UTF-8 JSON) | packed columns

The header is the batch as JSON (seq, metrics, logs, states and any other batch-level field), with
`memory` as {"n": samples, "columns": [the packed fields, in order], and each text field sent (TEXT:
"name": [...], ...)}. Each
packed column is n little-endian values of its field's fixed type; a reading a sample lacks is NaN
in a float column and -1 in total_bytes (neither is a valid reading). The server reads the columns
with numpy straight from the body and checks them per column: no parsing and no Python object per
value before the insert (the list the insert binds), and fewer bytes than JSON. JSON batches stay
accepted.

The runner encodes with the standard library only; the server decodes (numpy).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Annotated, Any

from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from tunedeck.contract.protocol import SAMPLES_MAX, Strict, TelemetryBatch

MEDIA_TYPE = "application/vnd.tunedeck.batch"
MAGIC = b"TDB1"
# field -> struct code (numpy reads the same little-endian type); gpu -1 is host memory, not "absent"
PACKED = {
    "line": "q",
    "t": "d",
    "gpu": "i",
    "used_bytes": "q",
    "total_bytes": "q",
    "util": "d",
    "power_w": "d",
    "temp_c": "d",
    "temp_junction_c": "d",
    "temp_hbm_c": "d",
    "power_shared_with": "i",
    "ecc_correctable": "q",
    "ecc_uncorrectable": "q",
    "throttle_power": "d",
    "throttle_thermal": "d",
    "throttle_hbm": "d",
    "clock_mhz": "d",
    "xgmi_read_bytes": "q",
    "xgmi_write_bytes": "q",
}
# Text fields travel in the header, one list each (None where a sample lacks it).
TEXT = ("name", "serial", "uuid", "partition", "ecc_blocks")
REQUIRED = ("line", "t", "gpu", "used_bytes")
INT_BOUNDS = {
    "line": (0, 2**62),
    "gpu": (-1, 1_000_000),
    "used_bytes": (0, 2**62),
    "total_bytes": (0, 2**62),
    "power_shared_with": (0, 1_000_000),
    "ecc_correctable": (0, 2**62),
    "ecc_uncorrectable": (0, 2**62),
    "xgmi_read_bytes": (0, 2**62),
    "xgmi_write_bytes": (0, 2**62),
}
ABSENT_INT = -1  # the integer columns that are not REQUIRED


class Unpackable(ValueError):
    """The batch cannot be packed (a value of the wrong type or out of its column's range)."""


def encode(batch: dict[str, Any]) -> bytes:
    """A batch (memory as columns, as runner.report builds it) packed; raises Unpackable."""
    head = {k: v for k, v in batch.items() if k != "memory"}
    parts = []
    mem = batch.get("memory")
    if mem:
        n = len(mem["line"])
        names = [k for k in PACKED if mem.get(k) is not None]
        head["memory"] = {"n": n, "columns": names}
        for k in TEXT:
            if mem.get(k) is not None:
                if len(mem[k]) != n:
                    raise Unpackable(f"memory.{k} has {len(mem[k])} values where line has {n}")
                head["memory"][k] = mem[k]
        for k in names:
            col = mem[k]
            if len(col) != n:
                raise Unpackable(f"memory.{k} has {len(col)} values where line has {n}")
            if k not in REQUIRED:
                absent = ABSENT_INT if k in INT_BOUNDS else math.nan
                col = [absent if v is None else v for v in col]
            try:
                parts.append(struct.pack(f"<{n}{PACKED[k]}", *col))
            except (struct.error, TypeError, OverflowError) as e:
                raise Unpackable(f"memory.{k}: {e}") from None
    header = json.dumps(head, allow_nan=False, separators=(",", ":")).encode()
    return b"".join((MAGIC, struct.pack("<I", len(header)), header, *parts))


class PackedMemory(Strict):
    n: int = Field(ge=0, le=SAMPLES_MAX)
    columns: list[str] = Field(max_length=len(PACKED))
    name: list[str | None] | None = Field(None, max_length=SAMPLES_MAX)
    serial: list[Annotated[str, Field(max_length=200)] | None] | None = Field(None, max_length=SAMPLES_MAX)
    uuid: list[Annotated[str, Field(max_length=200)] | None] | None = Field(None, max_length=SAMPLES_MAX)
    partition: list[Annotated[str, Field(max_length=200)] | None] | None = Field(None, max_length=SAMPLES_MAX)
    ecc_blocks: list[Annotated[str, Field(max_length=2000)] | None] | None = Field(
        None, max_length=SAMPLES_MAX
    )


def _error(loc: tuple[int | str, ...], kind: str, msg: str, **ctx: Any) -> InitErrorDetails:
    return {"type": PydanticCustomError(kind, msg, ctx), "loc": loc, "input": None}


def _under_memory(err: ErrorDetails) -> InitErrorDetails:
    """An error of the memory header, placed under `memory` (its message follows from type and ctx)."""
    moved: InitErrorDetails = {"type": err["type"], "loc": ("memory", *err["loc"]), "input": err["input"]}
    if "ctx" in err:
        moved["ctx"] = err["ctx"]
    return moved


def _refuse(errors: list[InitErrorDetails]) -> ValidationError:
    return ValidationError.from_exception_data("TelemetryBatch", errors)


def decode(body: bytes) -> tuple[TelemetryBatch, dict[str, list]]:
    """A packed batch: its validated header (memory empty) and its memory columns as lists (None
    where a sample lacks a reading; a column nobody sent left out). Raises ValidationError with the
    locations of JSON's (memory.util.7)."""
    import numpy as np

    if body[:4] != MAGIC or len(body) < 8:
        raise _refuse([_error((), "packed_magic", "a packed batch starts with TDB1 and its header length")])
    (size,) = struct.unpack_from("<I", body, 4)
    try:
        head = json.loads(body[8 : 8 + size])
    except (ValueError, UnicodeDecodeError) as e:
        raise _refuse([_error((), "packed_header", "the header is not JSON: {why}", why=str(e))]) from None
    if not isinstance(head, dict):
        raise _refuse([_error((), "packed_header", "the header is not a JSON object")])
    desc = head.pop("memory", None)
    batch = TelemetryBatch.model_validate(head)
    if desc is None:
        if len(body) != 8 + size:
            raise _refuse(
                [_error(("memory",), "packed_length", "bytes after the header, and no memory in it")]
            )
        return batch, {}
    try:
        mem = PackedMemory.model_validate(desc)
    except ValidationError as e:
        raise _refuse([_under_memory(err) for err in e.errors()]) from None
    errors = [
        _error(("memory", "columns"), "packed_column", "`{field}` is not a packed column", field=k)
        for k in mem.columns
        if k not in PACKED
    ]
    errors += [_error(("memory", k), "missing", "Field required") for k in REQUIRED if k not in mem.columns]
    if len(set(mem.columns)) != len(mem.columns):
        errors.append(_error(("memory", "columns"), "packed_column", "a column is named twice"))
    for k in TEXT:
        values = getattr(mem, k)
        if values is not None and len(values) != mem.n:
            errors.append(
                _error(
                    ("memory", k),
                    "column_length",
                    "`{field}` has {got} values where `n` is {want}: one per sample",
                    field=k,
                    got=len(values),
                    want=mem.n,
                )
            )
    if errors:
        raise _refuse(errors)
    want = sum(mem.n * struct.calcsize(PACKED[k]) for k in mem.columns)
    if len(body) - 8 - size != want:
        raise _refuse(
            [
                _error(
                    ("memory",),
                    "packed_length",
                    "the packed columns hold {got} bytes where `n` and `columns` make {want}",
                    got=len(body) - 8 - size,
                    want=want,
                )
            ]
        )
    cols: dict[str, list] = {}
    at = 8 + size
    for k in mem.columns:
        arr = np.frombuffer(body, dtype=f"<{PACKED[k]}", count=mem.n, offset=at)
        at += arr.nbytes
        bad, absent = _checked(k, arr)
        errors += bad
        if absent is None:
            cols[k] = arr.tolist()
        elif not absent.all():
            out = arr.astype(object)
            out[absent] = None
            cols[k] = out.tolist()
    for k in TEXT:
        values = getattr(mem, k)
        if values is not None and any(v is not None for v in values):
            cols[k] = values
    if errors:
        raise _refuse(errors)
    return batch, cols


def _checked(k: str, arr) -> tuple[list[InitErrorDetails], Any]:
    """A packed column's faults (its first bad value, per kind) and where it holds no reading."""
    import numpy as np

    errors: list[InitErrorDetails] = []
    absent = None
    if k in INT_BOUNDS:
        lo, hi = INT_BOUNDS[k]
        if k not in REQUIRED:
            absent = arr == ABSENT_INT
            lo = min(lo, ABSENT_INT)
        for cut, kind, msg in (
            (arr < lo, "greater_than_equal", "Input should be greater than or equal to {ge}"),
            (arr > hi, "less_than_equal", "Input should be less than or equal to {le}"),
        ):
            if cut.any():
                i = int(np.argmax(cut))
                bound = {"ge": lo} if kind == "greater_than_equal" else {"le": hi}
                errors.append(_error(("memory", k, i), kind, msg, **bound))
    else:
        nan = np.isnan(arr)
        bad = ~np.isfinite(arr) if k in REQUIRED else np.isinf(arr)
        if k not in REQUIRED and nan.any():
            absent = nan
        if bad.any():
            i = int(np.argmax(bad))
            errors.append(_error(("memory", k, i), "finite_number", "Input should be a finite number"))
    return errors, (absent if absent is not None and absent.any() else None)
