"""Records <-> JSON-ready values, for recordings of a live agent.

Generic over the frozen dataclasses in `bpfdyno.tui.records`: field types drive the decoding,
so a record gains a field without touching this module. NaN (unknown) is written as ``null``
(strict JSON has no NaN) and read back as NaN for float fields. Fields of key/value pairs
(labels, event attributes) are written as JSON objects, which is how a person editing a
recording expects them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, TypeVar

#: The type of fields holding ``((key, value), ...)`` pairs, written as JSON objects.
_PAIRS = tuple[tuple[str, str], ...]

T = TypeVar("T")


class RecordingError(ValueError):
    """A recording that does not decode; the message names the field and what is wrong."""


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def encode(value: Any, pairs: bool = False) -> Any:
    """A JSON-ready copy of a record, tuple, or scalar."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = _hints(type(value))
        return {
            f.name: encode(getattr(value, f.name), hints[f.name] == _PAIRS)
            for f in dataclasses.fields(value)
        }
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, tuple):
        if pairs:
            return {str(k): v for k, v in value}
        return [encode(v) for v in value]
    return value


def decode(cls: type[T], obj: Any, where: str = "") -> T:
    """Build a record of type ``cls`` from what `encode` wrote.

    Missing fields take the record's defaults.

    Raises:
        RecordingError: a field has the wrong type, or a required field is missing.
    """
    where = where or cls.__name__
    if not isinstance(obj, dict):
        raise RecordingError(f"{where}: expected an object, got {type(obj).__name__}")
    hints = _hints(typing.cast(Any, cls))
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in obj:
            kwargs[f.name] = _value(hints[f.name], obj[f.name], f"{where}.{f.name}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise RecordingError(f"{where}: {e}") from None


def _value(tp: Any, v: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        real = [a for a in args if a is not type(None)]
        return _value(real[0], v, where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return decode(tp, v, where)
    if origin is tuple:
        if tp == _PAIRS:
            if not isinstance(v, dict):
                raise RecordingError(f"{where}: expected an object of key/value pairs")
            return tuple((str(k), str(x)) for k, x in v.items())
        if not isinstance(v, list):
            raise RecordingError(f"{where}: expected a list, got {type(v).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], x, f"{where}[{i}]") for i, x in enumerate(v))
        if len(args) != len(v):
            raise RecordingError(f"{where}: expected {len(args)} items, got {len(v)}")
        return tuple(
            _value(a, x, f"{where}[{i}]") for i, (a, x) in enumerate(zip(args, v, strict=True))
        )
    return _scalar(tp, v, where)


def _scalar(tp: Any, v: Any, where: str) -> Any:
    if tp is float:
        if v is None:
            return math.nan
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    elif tp is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    elif tp is bool:
        if isinstance(v, bool):
            return v
    elif tp is str:
        if isinstance(v, str):
            return v
    else:
        return v
    raise RecordingError(f"{where}: expected {tp.__name__}, got {v!r}")
