"""What a dataset file holds, in the shape LLaMA-Factory's dataset_info.json describes it: alpaca
(a prompt, an optional query and a response per row, under whatever column names the file uses) or
sharegpt (a list of turns per row, each with a role and a content tag).

Every row is read and checked, so a bad one is named (row N, column X, what is wrong) before any run
starts on it. JSON, JSON Lines and CSV are read here with the standard library; Parquet needs
pyarrow, which the server does not load: the trainer's Python reads its rows (register.py).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The file types LLaMA-Factory loads by extension (its FILEEXT2TYPE), as this server reads them.
SUFFIXES = {".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}
# Column names, best first, that play each alpaca part (LLaMA-Factory's defaults lead).
PROMPT = ("instruction", "prompt", "question", "query_text", "input_text")
QUERY = ("input", "context")
RESPONSE = ("output", "response", "answer", "completion", "target")
SYSTEM = ("system",)
HISTORY = ("history",)
MESSAGES = ("conversations", "messages", "conversation", "dialog")
# Role and content tag pairs a sharegpt turn may carry, with the role values for each side.
TAGS = (("from", "value"), ("role", "content"))
SYSTEM_ROLES = ("system",)
# The role pairs LLaMA-Factory's tags default to (sharegpt's) and OpenAI's, user side first; a tool's
# answer stands on the user's side and a function call on the assistant's (its observation/function tags).
KNOWN_ROLES = (("human", "gpt"), ("user", "assistant"))
TOOL_SIDES = ({"observation", "tool"}, {"function_call"})
SHOWN_ERRORS = 5  # problems named in one answer; the count says how many more


class FormatError(ValueError):
    """A file that cannot be registered; the message names the row and column."""


@dataclass
class Detected:
    """What a file holds: the dataset_info.json entry's formatting, columns and tags, and its rows."""

    formatting: str
    columns: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)
    rows: int = 0

    def entry(self, file_name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"file_name": file_name, "formatting": self.formatting, "columns": self.columns}
        if self.tags:
            out["tags"] = self.tags
        return out

    def says(self) -> str:
        """What was detected, in one sentence."""
        cols = ", ".join(f"{k} = {v!r}" for k, v in self.columns.items())
        tags = ", ".join(f"{k} = {v!r}" for k, v in self.tags.items())
        return f"{self.formatting}, {self.rows} rows ({cols}{'; ' + tags if tags else ''})"


def kind_of(name: str) -> str:
    """The file type its name says; FormatError for any other."""
    suffix = Path(name).suffix.lower()
    if suffix not in SUFFIXES:
        raise FormatError(f"{name!r}: a dataset file must end in {', '.join(SUFFIXES)}")
    return SUFFIXES[suffix]


# ---------------------------------------------------------------- reading rows


def read_rows(path: Path, kind: str) -> list[Any]:
    """Every row of a JSON, JSON Lines or CSV file (objects as the file has them). Lines and CSV
    records are read as they come: the file's text is never held whole beside its rows."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            if kind == "json":
                return _json_rows(fh.read())
            return _jsonl_rows(fh) if kind == "jsonl" else _csv_rows(fh)
    except UnicodeDecodeError as e:
        raise FormatError(f"not UTF-8 text (at byte {e.start} of a block)") from None
    except OSError as e:
        raise FormatError(f"cannot read the file: {e.strerror or e}") from None


def _json_rows(text: str) -> list[Any]:
    try:
        rows = json.loads(text)
    except ValueError as e:
        raise FormatError(f"not JSON: {e}") from None
    if not isinstance(rows, list):
        raise FormatError(f"a .json dataset must be a list of rows, not a {type(rows).__name__}")
    return rows


def _jsonl_rows(lines: Iterable[str]) -> list[Any]:
    out = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise FormatError(f"line {n}: not JSON: {e}") from None
    return out


def _csv_rows(fh: Iterable[str]) -> list[dict[str, Any]]:
    reader = csv.reader(fh)
    try:
        header = next(reader, None)
        if not header or not any(h.strip() for h in header):
            raise FormatError("a CSV dataset needs a header line naming its columns")
        if len(set(header)) != len(header):
            twice = sorted({h for h in header if header.count(h) > 1})
            raise FormatError(f"the CSV header names {', '.join(map(repr, twice))} twice")
        rows = []
        for n, cells in enumerate(reader, 1):
            if not cells:
                continue
            if len(cells) != len(header):
                raise FormatError(
                    f"row {n} (line {reader.line_num}): {len(cells)} fields, the header has {len(header)}"
                )
            rows.append(dict(zip(header, cells, strict=True)))
    except csv.Error as e:
        raise FormatError(f"not CSV (line {reader.line_num}): {e}") from None
    return rows


# ---------------------------------------------------------------- detecting the format


def detect(rows: list[Any]) -> Detected:
    """The format of these rows, every row checked against it; FormatError naming what is wrong."""
    if not rows:
        raise FormatError("the file holds no rows")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise FormatError(f"row {n}: must be an object of columns, not {_what(row)}")
    columns = list(dict.fromkeys(k for row in rows[:100] for k in row))
    messages = next((c for c in MESSAGES if c in columns), None)
    if messages is not None:
        found = _sharegpt(rows, messages, columns)
    else:
        found = _alpaca(rows, columns)
    found.rows = len(rows)
    return found


def _alpaca(rows: list[dict[str, Any]], columns: list[str]) -> Detected:
    prompt = _pick(PROMPT, columns)
    response = _pick(RESPONSE, columns)
    if prompt is None or response is None:
        raise FormatError(
            f"no format detected in the columns {', '.join(map(repr, columns[:20]))}: alpaca needs a prompt "
            f"column ({'/'.join(PROMPT)}) and a response column ({'/'.join(RESPONSE)}); sharegpt needs a list "
            f"of turns ({'/'.join(MESSAGES)})"
        )
    mapping = {"prompt": prompt, "response": response}
    if query := _pick(QUERY, columns, but=(prompt,)):
        mapping["query"] = query
    for part, names in (("system", SYSTEM), ("history", HISTORY)):
        if found := _pick(names, columns):
            mapping[part] = found
    problems = []
    for n, row in enumerate(rows, 1):
        for part, col in mapping.items():
            value = row.get(col)
            if part in ("prompt", "response") and col not in row:
                problems.append(f"row {n}, column {col!r}: missing")
            elif part == "history":
                if value is not None and not _is_history(value):
                    problems.append(f"row {n}, column {col!r}: must be a list of [prompt, response] pairs")
            elif value is not None and not isinstance(value, str):
                problems.append(f"row {n}, column {col!r}: must be text, not {_what(value)}")
        said = [row.get(mapping[p]) for p in ("prompt", "query") if p in mapping]
        if not problems and not any(isinstance(v, str) and v.strip() for v in said):
            problems.append(f"row {n}, column {prompt!r}: empty prompt")
        if len(problems) > SHOWN_ERRORS:
            break
    _raise(problems)
    return Detected("alpaca", mapping)


def _sharegpt(rows: list[dict[str, Any]], messages: str, columns: list[str]) -> Detected:
    first = next((t for row in rows for t in _turns(row.get(messages)) if isinstance(t, dict)), None)
    pair = next((p for p in TAGS if first is not None and p[0] in first and p[1] in first), None)
    if pair is None:
        keys = ", ".join(map(repr, first)) if first else "none"
        raise FormatError(
            f"row 1, column {messages!r}: turns need a role and a content tag "
            f"({' or '.join('/'.join(p) for p in TAGS)}); the first turn has {keys}"
        )
    role, content = pair
    # The roles a conversation alternates between: the first two non-system roles seen.
    seen: list[str] = []
    for row in rows[:100]:
        for turn in _turns(row.get(messages)):
            r = turn.get(role) if isinstance(turn, dict) else None
            if isinstance(r, str) and r not in SYSTEM_ROLES and r not in seen:
                seen.append(r)
        if len(seen) >= 2:
            break
    known = next((p for p in KNOWN_ROLES if any(r in p for r in seen)), None)
    if known is not None:
        user, assistant = known
    else:
        user, assistant = (seen + ["human", "gpt"])[:2]
    problems = []
    for n, row in enumerate(rows, 1):
        turns = row.get(messages)
        where = f"row {n}, column {messages!r}"
        if not isinstance(turns, list) or not turns:
            problems.append(f"{where}: must be a non-empty list of turns, not {_what(turns)}")
            continue
        body = turns[1:] if isinstance(turns[0], dict) and turns[0].get(role) in SYSTEM_ROLES else turns
        for i, turn in enumerate(body):
            want = (user, assistant)[i % 2]
            if not isinstance(turn, dict) or not isinstance(turn.get(content), str):
                problems.append(f"{where}, turn {i + 1}: needs {role!r} and a text {content!r}")
                break
            if turn.get(role) != want and turn.get(role) not in TOOL_SIDES[i % 2]:
                problems.append(f"{where}, turn {i + 1}: role {turn.get(role)!r} where {want!r} was expected")
                break
        else:
            if len(body) % 2:
                problems.append(f"{where}: {len(body)} turns; a conversation ends with a {assistant!r} turn")
        if len(problems) > SHOWN_ERRORS:
            break
    _raise(problems)
    mapping = {"messages": messages}
    if found := _pick(SYSTEM, columns):
        mapping["system"] = found
    if "tools" in columns:
        mapping["tools"] = "tools"
    tags = {"role_tag": role, "content_tag": content, "user_tag": user, "assistant_tag": assistant}
    first_turns = (t for row in rows[:100] for t in _turns(row.get(messages)))
    if any(isinstance(t, dict) and t.get(role) in SYSTEM_ROLES for t in first_turns):
        tags["system_tag"] = "system"
    return Detected("sharegpt", mapping, tags)


def _turns(value: Any) -> Iterator[Any]:
    if isinstance(value, list):
        yield from value


def _is_history(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in value
    )


def _pick(names: Iterable[str], columns: list[str], but: tuple[str, ...] = ()) -> str | None:
    lowered = {c.lower(): c for c in columns}
    return next((lowered[n] for n in names if n in lowered and lowered[n] not in but), None)


def _what(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__} ({json.dumps(value, default=str)[:40]})"


def _raise(problems: list[str]) -> None:
    if problems:
        more = " (and more)" if len(problems) > SHOWN_ERRORS else ""
        raise FormatError("; ".join(problems[:SHOWN_ERRORS]) + more)
