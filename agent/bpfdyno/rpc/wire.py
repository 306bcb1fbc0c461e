"""The one mapping between the API's records and its protobuf messages, by field name.

Every message a client uses has a record in `bpfdyno.rpc` (a frozen dataclass, or a
NamedTuple for the pairs ``Label`` and ``Point``) with the message's field names, declared
with `message`. `to_pb` and `from_pb` translate any of them, driven by the record's type
hints and the message's descriptor; nothing is copied field by field anywhere else:

- scalars are copied; repeated fields are tuples; maps are dicts (a map whose values are a
  message of one ``oneof``, such as ``EventAttrValue``, holds the plain values);
- a nested message is its record; a protobuf enum is a Python enum with the same member
  names, its prefix left out (``COLLECTOR_STATE_OK`` is ``CollectorState.OK``): any enum
  with those member names maps, the agent's own ones included;
- a value that is not known is None (counts, records) or NaN (floats). On the wire it is an
  unset ``optional`` field, except for a plain ``double`` whose record default is NaN:
  proto3 cannot leave it unset, so there 0 means unknown.

A record declared with ``zero_is_default=True`` (a request) reads a zero or unset field as
its default, since proto3 cannot tell them apart.

`message_dict` writes any message as JSON-ready values (what ``--json`` and recordings hold).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import Message

R = TypeVar("R")
T = TypeVar("T", bound=type)

#: Each record class, its message class and whether zero means its default.
_MESSAGES: dict[type, tuple[type[Message], bool]] = {}


def message(pb_class: type[Message], *, zero_is_default: bool = False) -> Callable[[T], T]:
    """Declare a record as the Python side of ``pb_class`` (a class decorator).

    Raises:
        TypeError: the record's fields and the message's differ (a programming error).
    """

    def declare(cls: T) -> T:
        ours = _field_names(cls)
        wire = list(_descriptor(pb_class).fields_by_name)
        if set(ours) != set(wire):
            raise TypeError(
                f"{cls.__name__} must have the fields of {pb_class.__name__}; only in the record: "
                f"{sorted(set(ours) - set(wire))}, only in the message: "
                f"{sorted(set(wire) - set(ours))}"
            )
        _MESSAGES[cls] = (pb_class, zero_is_default)
        return cls

    return declare


def message_class(cls: type) -> type[Message]:
    """The protobuf message class of a record class."""
    return _MESSAGES[cls][0]


class _Kind(enum.Enum):
    COPY = "sent as it is"
    ZERO_IS_NAN = "plain double, NaN default: 0 on the wire means unknown"
    OPTIONAL = "optional scalar: unset means the default (None or NaN)"
    ENUM = "a Python enum with the protobuf enum's member names"
    RECORD = "a nested message: its record"
    RECORDS = "repeated messages: a tuple of records"
    SCALARS = "repeated scalars: a tuple"
    MAP = "a map of scalars: a dict"
    MAP_ONEOF = "a map of one-of messages: a dict of their set values"


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kind: _Kind
    default: Any
    #: The record class of a nested or repeated message, or the Python enum of an enum.
    cls: Any = None
    #: An enum's value prefix (``COLLECTOR_STATE_``) and descriptor.
    prefix: str = ""
    enum_type: EnumDescriptor | None = None
    #: A one-of message class (map values), with its field name per Python type.
    oneof: tuple[type[Message], str, dict[type, str]] | None = None


def _descriptor(pb_class: type[Message]) -> Descriptor:
    # The C (upb) and pure-Python descriptors share an interface; the stubs type them apart.
    return cast(Descriptor, pb_class.DESCRIPTOR)


def _field_names(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cast(Any, cls)._fields)  # a NamedTuple


def _defaults(cls: type) -> dict[str, Any]:
    if not dataclasses.is_dataclass(cls):
        return dict(cast(Any, cls)._field_defaults)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _enum_prefix(e: EnumDescriptor) -> str:
    """``CollectorState`` -> ``COLLECTOR_STATE_``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", e.name).upper() + "_"


def _strip_none(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


@functools.cache
def _plan(cls: type) -> tuple[_Field, ...]:
    """How each field of a record goes to and from its message (worked out once)."""
    pb_class, _ = _MESSAGES[cls]
    fields = _descriptor(pb_class).fields_by_name
    hints = typing.get_type_hints(cls)
    defaults = _defaults(cls)
    plan = []
    for name in _field_names(cls):
        fd: FieldDescriptor = fields[name]
        hint = _strip_none(hints[name])
        default = defaults.get(name)
        sub = fd.message_type
        if sub is not None and sub.GetOptions().map_entry:
            value_fd = sub.fields_by_name["value"]
            if value_fd.message_type is None:
                plan.append(_Field(name, _Kind.MAP, default))
                continue
            value_desc = value_fd.message_type
            (oneof,) = value_desc.oneofs
            by_type = {_PY_TYPES.get(f.cpp_type, int): f.name for f in oneof.fields}
            value_msg = _message_class_of(pb_class, value_desc)
            plan.append(
                _Field(name, _Kind.MAP_ONEOF, default, oneof=(value_msg, oneof.name, by_type))
            )
        elif sub is not None:
            if fd.is_repeated:
                (item,) = typing.get_args(hint)[:1]
                plan.append(_Field(name, _Kind.RECORDS, default, cls=item))
            else:
                plan.append(_Field(name, _Kind.RECORD, default, cls=hint))
        elif fd.enum_type is not None:
            prefix = _enum_prefix(fd.enum_type)
            plan.append(_Field(name, _Kind.ENUM, default, hint, prefix, fd.enum_type))
        elif fd.is_repeated:
            plan.append(_Field(name, _Kind.SCALARS, default))
        elif fd.has_presence:
            plan.append(_Field(name, _Kind.OPTIONAL, default))
        elif _is_nan(default):
            plan.append(_Field(name, _Kind.ZERO_IS_NAN, default))
        else:
            plan.append(_Field(name, _Kind.COPY, default))
    return tuple(plan)


#: The Python type of each scalar protobuf type that is not an integer.
_PY_TYPES = {FieldDescriptor.CPPTYPE_DOUBLE: float, FieldDescriptor.CPPTYPE_STRING: str}


def _message_class_of(owner: type[Message], desc: Descriptor) -> type[Message]:
    """The class of a message declared in the same generated module as ``owner``."""
    return cast(type[Message], getattr(sys.modules[owner.__module__], desc.name))


def _oneof_value(by_type: dict[type, str], value: Any) -> dict[str, Any]:
    """The one-of field that holds ``value`` (a bool is an integer)."""
    kind = float if isinstance(value, float) else str if isinstance(value, str) else int
    return {by_type[kind]: value}


def to_pb(record: Any, cls: type | None = None) -> Message:
    """The message of ``record``; unknown values become unset fields.

    Args:
        record: a record, or any object with the record's field names as attributes (an
            agent-side object that already speaks the API's words).
        cls: the record class to send it as (default: the record's own class).
    """
    cls = cls or type(record)
    pb_class, _ = _MESSAGES[cls]
    values: dict[str, Any] = {}
    for f in _plan(cls):
        v = getattr(record, f.name)
        k = f.kind
        if k is _Kind.COPY:
            values[f.name] = v
        elif k is _Kind.ZERO_IS_NAN:
            values[f.name] = 0.0 if math.isnan(v) else v
        elif k is _Kind.OPTIONAL:
            if v is not None and not _is_nan(v):
                values[f.name] = v
        elif k is _Kind.RECORDS:
            values[f.name] = [to_pb(x, f.cls) for x in v]
        elif k is _Kind.SCALARS:
            values[f.name] = list(v)
        elif k is _Kind.ENUM:
            if v is not None:
                values[f.name] = f.prefix + v.name
        elif k is _Kind.RECORD:
            if v is not None:
                values[f.name] = to_pb(v, f.cls)
        elif k is _Kind.MAP:
            values[f.name] = dict(v)
        else:
            assert f.oneof is not None
            value_msg, _, by_type = f.oneof
            values[f.name] = {key: value_msg(**_oneof_value(by_type, x)) for key, x in v.items()}
    return pb_class(**values)


def from_pb(cls: type[R], msg: Message) -> R:
    """The record of a message; unset optional fields become None or NaN (unknown)."""
    _, zero_is_default = _MESSAGES[cls]
    values: dict[str, Any] = {}
    for f in _plan(cast(type, cls)):
        k = f.kind
        if k is _Kind.OPTIONAL:
            if msg.HasField(f.name):
                values[f.name] = getattr(msg, f.name)
            continue  # else: the record's default, None or NaN
        v = getattr(msg, f.name)
        if k is _Kind.COPY:
            if v or not zero_is_default:
                values[f.name] = v
        elif k is _Kind.ZERO_IS_NAN:
            values[f.name] = v or math.nan
        elif k is _Kind.RECORDS:
            values[f.name] = tuple(from_pb(f.cls, x) for x in v)
        elif k is _Kind.SCALARS:
            if v or not zero_is_default:
                values[f.name] = tuple(v)
        elif k is _Kind.ENUM:
            assert f.enum_type is not None
            word = f.enum_type.values_by_number[v].name.removeprefix(f.prefix)
            if word in f.cls.__members__:
                values[f.name] = f.cls[word]  # else (unspecified, newer): the default
        elif k is _Kind.RECORD:
            if msg.HasField(f.name):
                values[f.name] = from_pb(f.cls, v)
        elif k is _Kind.MAP:
            values[f.name] = {key: v[key] for key in sorted(v)}
        else:
            assert f.oneof is not None
            which = f.oneof[1]
            values[f.name] = {
                key: getattr(v[key], v[key].WhichOneof(which) or "string_value")
                for key in sorted(v)
            }
    return cls(**values)


# -- JSON ------------------------------------------------------------------------------------

_INT64 = frozenset({FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64})


class WireError(ValueError):
    """JSON that is not the message it should be; the message says which field is wrong."""


def message_dict(
    msg: Message, *, proto_names: bool = True, with_defaults: bool = False
) -> dict[str, Any]:
    """A message as a JSON-ready dict, 64-bit integers as numbers.

    protobuf's own JSON mapping writes 64-bit integers as strings (JavaScript numbers are
    not exact beyond 2**53); they are turned back into numbers, field by field from the
    message's descriptors, so ``"rss_bytes": 1048576`` never reads ``"rss_bytes": "1048576"``.

    Args:
        msg: the protobuf message.
        proto_names: keys are the .proto field names (``rss_bytes``); False: protobuf's
            JSON names (``rssBytes``).
        with_defaults: also write fields that hold their default (0, "", false, empty lists);
            unset ``optional`` fields stay out either way (unknown is not 0).
    """
    out: dict[str, Any] = MessageToDict(
        msg,
        preserving_proto_field_name=proto_names,
        always_print_fields_with_no_presence=with_defaults,
    )
    _int64_as_numbers(_descriptor(type(msg)).fields, out, proto_names)
    return out


def record_dict(record: Any, *, with_defaults: bool = False) -> dict[str, Any]:
    """A record as JSON-ready values with the .proto field names (see `message_dict`)."""
    return message_dict(to_pb(record), with_defaults=with_defaults)


def record_from_dict(cls: type[R], obj: Any, where: str = "") -> R:
    """The record of what `record_dict` wrote.

    Raises:
        WireError: not an object of the message's fields and types (the message says which).
    """
    where = where or cls.__name__
    if not isinstance(obj, dict):
        raise WireError(f"{where}: expected an object, got {type(obj).__name__}")
    try:
        msg = ParseDict(obj, message_class(cls)())
    except ParseError as e:
        raise WireError(f"{where}: {e}") from None
    return from_pb(cls, msg)


def _int64_as_numbers(
    fields: Sequence[FieldDescriptor], obj: dict[str, Any], proto_names: bool
) -> None:
    """Replace, in place, the strings MessageToDict wrote for a message's 64-bit integers."""
    for field in fields:
        key = field.name if proto_names else field.json_name
        if key not in obj:
            continue
        value = obj[key]
        sub = field.message_type
        if sub is not None and sub.full_name.startswith("google.protobuf."):
            continue  # well-known types have JSON forms of their own (a Timestamp is a string)
        if sub is not None and sub.GetOptions().map_entry:
            value_field = sub.fields_by_name["value"]
            if value_field.message_type is not None:
                for item in value.values():
                    _int64_as_numbers(value_field.message_type.fields, item, proto_names)
            elif value_field.cpp_type in _INT64:
                obj[key] = {k: int(v) for k, v in value.items()}
        elif sub is not None:
            for item in value if field.is_repeated else [value]:
                _int64_as_numbers(sub.fields, item, proto_names)
        elif field.cpp_type in _INT64:
            obj[key] = [int(v) for v in value] if field.is_repeated else int(value)
