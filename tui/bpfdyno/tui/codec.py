"""Recordings <-> JSON-ready values.

A recording holds the API's own records (`bpfdyno.rpc`), written as their messages' JSON
(`bpfdyno.rpc.wire.record_dict`: the .proto field names, unknown values left out) inside the
recording's own frames. Generic over the recording's frozen dataclasses: field types drive
the decoding, so a frame gains a field without touching this module.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

from bpfdyno.rpc.wire import WireError, is_record, record_dict, record_from_dict

T = TypeVar("T")


class RecordingError(ValueError):
    """A recording that does not decode; the message names the field and what is wrong."""


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def encode(value: Any) -> Any:
    """A JSON-ready copy of a recording, a frame, a record, a tuple or a scalar."""
    if is_record(type(value)):
        return record_dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [encode(v) for v in value]
    return value


def decode(cls: type[T], obj: Any, where: str = "") -> T:
    """Build a recording (or one of its parts) of type ``cls`` from what `encode` wrote.

    Missing fields take the defaults.

    Raises:
        RecordingError: a field has the wrong type, or a required field is missing.
    """
    where = where or cls.__name__
    if not isinstance(obj, dict):
        raise RecordingError(f"{where}: expected an object, got {type(obj).__name__}")
    hints = _hints(typing.cast(Any, cls))
    kwargs = {
        f.name: _value(hints[f.name], obj[f.name], f"{where}.{f.name}")
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name in obj
    }
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise RecordingError(f"{where}: {e}") from None


def _value(tp: Any, v: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        return _value(next(a for a in args if a is not type(None)), v, where)
    if isinstance(tp, type) and is_record(tp):
        try:
            return record_from_dict(tp, v, where)
        except WireError as e:
            raise RecordingError(str(e)) from None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return decode(tp, v, where)
    if origin is tuple:
        if not isinstance(v, list):
            raise RecordingError(f"{where}: expected a list, got {type(v).__name__}")
        return tuple(_value(args[0], x, f"{where}[{i}]") for i, x in enumerate(v))
    if origin is dict:
        if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
            raise RecordingError(f"{where}: expected an object of texts")
        return dict(v)
    if tp is float and isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    if tp is not float and isinstance(v, tp) and not (tp is int and isinstance(v, bool)):
        return v
    raise RecordingError(f"{where}: expected {tp.__name__}, got {v!r}")
