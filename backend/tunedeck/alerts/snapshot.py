"""A `Run`'s detector state as bytes and back, so a restarted server takes up where it stopped instead
of feeding every stored sample to the detectors again (hours of a cluster's history took minutes).

The format is tagged JSON, compressed. Only data comes back: numbers, strings, lists, tuples, dicts,
deques, sets, numpy arrays and scalars of numeric dtypes, and objects of the classes defined in this
package's own modules (found by walking the package, not named by the bytes), made without calling
their constructors and given their saved attributes. Nothing is imported or called by name from the
bytes, so a damaged or hostile blob can fail to load (`BadSnapshot`) but cannot run code.

`CODE` fingerprints the detectors' source: a state saved by other detector code is refused
(`Stale`), and the caller builds the state from the stored series as before.

What a restored state finds is what the state it was saved from finds, fed the same samples after
(tests/alerts/test_snapshot.py holds both to that, sample by sample, over the labelled corpora).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import inspect
import json
import pkgutil
import zlib
from collections import deque
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

import tunedeck.alerts
from tunedeck.alerts.stream import Run

FORMAT = 1
DTYPES = frozenset({"float64", "float32", "int64", "int32", "int8", "uint8", "bool"})
SCALARS = {np.dtype(name).type: name for name in DTYPES}  # numpy scalar types, by their dtype's name
PLAIN = (int, float)
FLOATS_AT = 16  # a sequence of this many floats or more is written as bytes


class BadSnapshot(ValueError):
    """The bytes are not a snapshot this code can read."""


class Stale(BadSnapshot):
    """A snapshot of other detector code (or another format): build the state from the series."""


@cache
def code() -> str:
    """A fingerprint of the detectors' source files (this package's `.py` files)."""
    h = hashlib.sha256(str(FORMAT).encode())
    files = resources.files(tunedeck.alerts)
    for name in sorted(p.name for p in files.iterdir() if p.name.endswith(".py")):
        h.update(name.encode() + b"\0" + files.joinpath(name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


@cache
def _classes() -> dict[str, type]:
    """The classes this package's modules define, by `module:qualname`."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(tunedeck.alerts.__path__, tunedeck.alerts.__name__ + "."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                found[f"{cls.__module__}:{cls.__qualname__}"] = cls
    return found


def _name(cls: type) -> str:
    name = f"{cls.__module__}:{cls.__qualname__}"
    if _classes().get(name) is not cls:
        raise TypeError(f"a detector state holds a {name}, which a snapshot cannot keep")
    return name


def _slots(cls: type) -> list[str]:
    return [
        s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if s not in ("__dict__", "__weakref__")
    ]


class _Encoder:
    """Tags each value; a mutable value met again (by identity) is written as a reference to its
    first place, so what two detectors shared they share again after loading."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self.keep: list[Any] = []  # (held so that no id is reused while encoding)

    def ref(self, o: Any) -> dict | None:
        k = self.seen.get(id(o))
        if k is not None:
            return {"r": k}
        self.seen[id(o)] = len(self.keep)
        self.keep.append(o)
        return None

    def __call__(self, o: Any) -> Any:
        if o is None or isinstance(o, (bool, str)) or type(o) is int or type(o) is float:
            return o
        if (name := SCALARS.get(type(o))) is not None:
            return {"g": name, "v": o.item()}
        if isinstance(o, np.generic):
            raise TypeError(f"a numpy {o.dtype} scalar cannot be kept")
        if isinstance(o, tuple) and not hasattr(o, "_fields"):
            return {"t": self.items(o)}
        if isinstance(o, tuple):  # a NamedTuple of this package: made again from its fields
            return {"n": _name(type(o)), "v": [self(x) for x in o]}
        if (r := self.ref(o)) is not None:
            return r
        if type(o) is list:
            items = self.items(o)
            return items if type(items) is list else {"l": items}
        if type(o) is dict:
            return {"d": [[self(k), self(v)] for k, v in o.items()]}
        if type(o) is deque:
            return {"q": self.items(o), "m": o.maxlen}
        if type(o) is set:
            return {"s": [self(x) for x in o]}
        if type(o) is np.ndarray:
            if o.dtype.name not in DTYPES:
                raise TypeError(f"a numpy {o.dtype} array cannot be kept")
            return {"a": o.ravel().tolist(), "dt": o.dtype.name, "sh": list(o.shape)}
        cls = type(o)
        attrs = dict(getattr(o, "__dict__", {}))  # (each attribute's own value: no class defaults)
        attrs.update((s, getattr(o, s)) for s in _slots(cls) if hasattr(o, s))
        return {"o": _name(cls), "v": {k: self(v) for k, v in attrs.items()}}

    def items(self, seq: Any) -> list | dict:
        """A sequence's items: a long run of floats (times, levels) as their float64 bytes, which
        JSON would write as text at several times the size and cost; plain numbers as they are."""
        if len(seq) >= FLOATS_AT and all(type(x) is float for x in seq):
            return {"f": base64.b64encode(np.array(seq, dtype=np.float64).tobytes()).decode()}
        if all(type(x) in PLAIN for x in seq):
            return list(seq)
        return [self(x) for x in seq]


class _Decoder:
    def __init__(self) -> None:
        self.made: list[Any] = []

    def keep(self, o: Any) -> Any:
        self.made.append(o)
        return o

    def __call__(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, str, int, float)):
            return x
        if type(x) is list:
            out: list = self.keep([])
            out.extend(self(v) for v in x)
            return out
        if type(x) is not dict or len(x) == 0:
            raise BadSnapshot(f"unexpected {type(x).__name__} in a snapshot")
        if "r" in x:
            k = x["r"]
            if not isinstance(k, int) or not 0 <= k < len(self.made):
                raise BadSnapshot(f"a reference to {k!r}, which comes later or not at all")
            return self.made[k]
        if "t" in x:
            return tuple(self.items(x["t"]))
        if "l" in x:
            out = self.keep([])
            out.extend(self.items(x["l"]))
            return out
        if "g" in x:
            return np.dtype(self._dtype(x["g"])).type(x["v"])
        if "n" in x:
            cls = self._class(x["n"])
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise BadSnapshot(f"{x['n']} is not a named tuple")
            return cls(*(self(v) for v in self._list(x["v"])))
        if "d" in x:
            d: dict = self.keep({})
            for pair in self._list(x["d"]):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise BadSnapshot("a dict entry is not a [key, value] pair")
                k = self(pair[0])
                try:
                    d[k] = self(pair[1])
                except TypeError:  # an unhashable key
                    raise BadSnapshot("a dict key that cannot be one") from None
            return d
        if "q" in x:
            m = x.get("m")
            if m is not None and not (isinstance(m, int) and m >= 0):
                raise BadSnapshot(f"a deque's maxlen {m!r}")
            q: deque = self.keep(deque(maxlen=m))
            q.extend(self.items(x["q"]))
            return q
        if "s" in x:
            s: set = self.keep(set())
            try:
                s.update(self(v) for v in self._list(x["s"]))
            except TypeError:
                raise BadSnapshot("a set member that cannot be one") from None
            return s
        if "a" in x:
            dtype, shape = self._dtype(x["dt"]), x.get("sh")
            if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
                raise BadSnapshot(f"an array's shape {shape!r}")
            try:
                arr = np.array(self._list(x["a"]), dtype=dtype).reshape(shape)
            except (TypeError, ValueError) as e:
                raise BadSnapshot(f"an array: {e}") from None
            return self.keep(arr)
        if "o" in x:
            cls = self._class(x["o"])
            if issubclass(cls, (tuple, BaseException)):
                raise BadSnapshot(f"{x['o']} is not a state object")
            obj = self.keep(cls.__new__(cls))
            attrs = x.get("v")
            if type(attrs) is not dict:
                raise BadSnapshot(f"{x['o']}'s attributes are not an object")
            slots = set(_slots(cls))
            for k, v in attrs.items():
                if k not in slots and not hasattr(obj, "__dict__"):
                    raise BadSnapshot(f"{x['o']} has no attribute {k!r}")
                object.__setattr__(obj, k, self(v))
            return obj
        raise BadSnapshot(f"an unknown tag {sorted(x)[:3]}")

    def items(self, x: Any) -> list:
        """A sequence's items, as `_Encoder.items` wrote them."""
        if type(x) is dict and set(x) == {"f"}:
            try:
                raw = base64.b64decode(x["f"], validate=True)
                return np.frombuffer(raw, dtype=np.float64).tolist()
            except (TypeError, ValueError) as e:
                raise BadSnapshot(f"a run of floats: {e}") from None
        return [self(v) for v in self._list(x)]

    @staticmethod
    def _list(v: Any) -> list:
        if type(v) is not list:
            raise BadSnapshot(f"expected a list, got {type(v).__name__}")
        return v

    @staticmethod
    def _dtype(name: Any) -> str:
        if name not in DTYPES:
            raise BadSnapshot(f"the dtype {name!r} is not one a snapshot holds")
        return name

    @staticmethod
    def _class(name: Any) -> type:
        cls = _classes().get(name) if isinstance(name, str) else None
        if cls is None:
            raise BadSnapshot(f"{name!r} is not a class of tunedeck.alerts")
        return cls


def dump(state: Any) -> bytes:
    """A detector state (a `Run`, or anything made of what a Run holds) as compressed bytes."""
    body = json.dumps({"code": code(), "state": _Encoder()(state)}, separators=(",", ":"))
    return zlib.compress(body.encode(), 1)


def load(blob: bytes) -> Any:
    """The state `dump` wrote. Stale: saved by other detector code; BadSnapshot: not readable."""
    try:
        doc = json.loads(zlib.decompress(blob))
    except (zlib.error, ValueError, TypeError) as e:
        raise BadSnapshot(f"not a snapshot: {e}") from None
    if type(doc) is not dict or "state" not in doc:
        raise BadSnapshot("not a snapshot")
    if doc.get("code") != code():
        raise Stale(f"saved by other detector code ({doc.get('code')!r}, this is {code()!r})")
    try:
        return _Decoder()(doc["state"])
    except RecursionError:
        raise BadSnapshot("nested too deep") from None


def load_run(blob: bytes) -> Run:
    run = load(blob)
    if not isinstance(run, Run):
        raise BadSnapshot(f"a snapshot of a {type(run).__name__}, not of a Run")
    return run
