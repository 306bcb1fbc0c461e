"""The one mapping between the API's records and its protobuf messages, by field name.

Every message a client uses has a record in `bpfdyno.rpc` with the message's field names: a
frozen dataclass declared with `record`, or a NamedTuple (the pairs ``Label`` and ``Point``)
declared with `message`. `to_pb` and `from_pb` translate any of them, driven by the record's type
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
import operator
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast, dataclass_transform

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


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(pb_class: type[Message], *, zero_is_default: bool = False) -> Callable[[T], T]:
    """Declare a class as a record of ``pb_class``: a frozen dataclass with the message's
    fields (a class decorator; see `message`)."""

    def declare(cls: T) -> T:
        data: Any = dataclasses.dataclass(frozen=True, slots=True)(cls)
        return message(pb_class, zero_is_default=zero_is_default)(cast(T, data))

    return declare


def message_class(cls: type) -> type[Message]:
    """The protobuf message class of a record class."""
    return _MESSAGES[cls][0]


def is_record(cls: type) -> bool:
    """Whether ``cls`` is one of the API's records (declared with `message`)."""
    return cls in _MESSAGES


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
    return _MESSAGES[cls][0](**_encoder(cls)(record))


def from_pb(cls: type[R], msg: Message) -> R:
    """The record of a message; unset optional fields become None or NaN (unknown)."""
    return cast(R, _decoder(cast(type, cls))(msg))


# Each record class's two converters are built once from its plan: one small function per
# field that is not copied as it is. A record goes out as the keyword arguments of its
# message, nested records as dicts: protobuf builds nested messages from dicts faster than
# Python builds them one by one (see docs/performance.md, "The API's records").

#: A field's converted value that is left out (unset on the wire, the default in a record).
_SKIP = object()
_Convert = Callable[[Any], Any]


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """Every named attribute of an object, as a tuple (even for one name)."""
    if len(names) == 1:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    return operator.attrgetter(*names)


@functools.cache
def _encoder(cls: type) -> Callable[[Any], dict[str, Any]]:
    """The function that turns a record into its message's field values."""
    plan = _plan(cls)
    names = tuple(f.name for f in plan)
    get = _getter(names)
    steps = tuple(_encode_step(f) for f in plan)
    if all(step is None for step in steps):
        return lambda record: dict(zip(names, get(record), strict=True))

    def encode(record: Any) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, step, value in zip(names, steps, get(record), strict=True):
            if step is not None:
                value = step(value)
                if value is _SKIP:
                    continue
            values[name] = value
        return values

    return encode


def _encode_step(f: _Field) -> _Convert | None:
    """How one field goes on the wire (None: as it is)."""
    k = f.kind
    if k is _Kind.COPY:
        return None
    if k is _Kind.ZERO_IS_NAN:
        return lambda v: 0.0 if v != v else v
    if k is _Kind.OPTIONAL:
        return lambda v: _SKIP if v is None or v != v else v
    if k is _Kind.SCALARS:
        return list
    if k is _Kind.MAP:
        return dict
    if k is _Kind.ENUM:
        prefix = f.prefix
        return lambda v: _SKIP if v is None else prefix + v.name
    if k is _Kind.RECORDS:
        records = _encoder(f.cls)
        return lambda v: [records(x) for x in v]
    if k is _Kind.RECORD:
        record = _encoder(f.cls)
        return lambda v: _SKIP if v is None else record(v)
    assert f.oneof is not None
    by_type = f.oneof[2]
    return lambda v: {key: _oneof_value(by_type, x) for key, x in v.items()}


@functools.cache
def _decoder(cls: type) -> Callable[[Message], Any]:
    _, zero_is_default = _MESSAGES[cls]
    plan = _plan(cls)
    names = tuple(f.name for f in plan)
    steps = tuple(_decode_step(f, zero_is_default) for f in plan)
    if all(step is None for step in steps):
        get = _getter(names)
        return lambda msg: cls(*get(msg))

    def decode(msg: Message) -> Any:
        values: dict[str, Any] = {}
        for name, step in zip(names, steps, strict=True):
            value = getattr(msg, name) if step is None else step(msg)
            if value is not _SKIP:
                values[name] = value
        return cls(**values)

    return decode


def _decode_step(f: _Field, zero_is_default: bool) -> _Convert | None:
    """How one field comes off the wire (None: as it is)."""
    k, name, default = f.kind, f.name, f.default
    if k is _Kind.OPTIONAL:
        # Unset: the record's default (None or NaN: unknown), None when it has none.
        return lambda m: getattr(m, name) if m.HasField(name) else default
    if k is _Kind.COPY:
        # proto3: zero and unset are one and the same; a request reads either as its default.
        return (lambda m: getattr(m, name) or _SKIP) if zero_is_default else None
    if k is _Kind.ZERO_IS_NAN:
        return lambda m: getattr(m, name) or math.nan
    if k is _Kind.SCALARS:
        if zero_is_default:
            return lambda m: tuple(getattr(m, name)) or _SKIP
        return lambda m: tuple(getattr(m, name))
    if k is _Kind.MAP:
        return lambda m: {key: v[key] for v in (getattr(m, name),) for key in sorted(v)}
    if k is _Kind.ENUM:
        assert f.enum_type is not None
        words = {v.number: v.name.removeprefix(f.prefix) for v in f.enum_type.values}
        # Unspecified, or a state this client does not know yet: the record's default.
        members = {n: f.cls[w] for n, w in words.items() if w in f.cls.__members__}
        return lambda m: members.get(getattr(m, name), _SKIP)
    if k is _Kind.RECORDS:
        records = _decoder(f.cls)
        return lambda m: tuple(map(records, getattr(m, name)))
    if k is _Kind.RECORD:
        record = _decoder(f.cls)
        return lambda m: record(getattr(m, name)) if m.HasField(name) else _SKIP
    assert f.oneof is not None
    which = f.oneof[1]
    return lambda m: {
        key: getattr(v[key], v[key].WhichOneof(which) or "string_value")
        for v in (getattr(m, name),)
        for key in sorted(v)
    }


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
