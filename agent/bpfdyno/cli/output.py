"""What the client commands print: ``--json`` documents and failed calls.

``--json`` output is stable: its field names are the API's (see each command), and numbers
are JSON numbers. protobuf's own JSON mapping writes 64-bit integers as strings (JavaScript
numbers are not exact beyond 2**53); every ``--json`` here turns them back into numbers, field
by field from the message's descriptors, so ``"rss_bytes": 1048576`` never reads
``"rss_bytes": "1048576"``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, cast

import grpc
import orjson
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from bpfdyno.client.connection import EXIT_FAIL, explain_rpc_error

_INT64 = frozenset({FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64})


def message_dict(
    msg: Message, *, proto_names: bool = True, with_defaults: bool = False
) -> dict[str, Any]:
    """A message as a JSON-ready dict, 64-bit integers as numbers.

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
    # The C (upb) and the pure-Python descriptors have the same interface; the stubs type
    # them apart.
    descriptor = cast(Descriptor, msg.DESCRIPTOR)
    _int64_as_numbers(descriptor.fields, out, proto_names)
    return out


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


def print_json(obj: Any, *, indent: bool = True) -> None:
    """Write one JSON document on stdout (indented, or on one line for streams)."""
    option = orjson.OPT_INDENT_2 if indent else 0
    sys.stdout.write(orjson.dumps(obj, option=option).decode() + "\n")
    sys.stdout.flush()


def report_rpc_error(e: grpc.RpcError, target: str) -> int:
    """Say on stderr why a call to the agent at ``target`` failed; returns the exit status."""
    print(f"bpfdyno: {explain_rpc_error(e, target)}", file=sys.stderr)
    return EXIT_FAIL
