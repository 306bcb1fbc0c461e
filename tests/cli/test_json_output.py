"""`--json` output: protobuf messages as JSON with 64-bit integers as numbers, field names kept."""

from __future__ import annotations

import orjson
import pytest
from google.protobuf.json_format import MessageToDict

from bpfdyno.cli.output import print_json
from bpfdyno.rpc.v1 import agent_pb2, kernel_pb2, tracing_pb2
from bpfdyno.rpc.wire import message_dict

BIG = 2**53 + 1  # not exact as a double: must travel as an integer


def test_int64_fields_are_numbers_everywhere_in_a_message() -> None:
    resp = kernel_pb2.ListProcessesResponse(
        processes=[kernel_pb2.ProcessRow(pid=1, rss_bytes=4096, tcp_tx_bytes=BIG)],
        total_processes=9,
        unavailable={"net": "not running"},
    )
    obj = message_dict(resp, with_defaults=True)
    row = obj["processes"][0]
    assert row["tcp_tx_bytes"] == BIG and type(row["tcp_tx_bytes"]) is int
    assert row["rss_bytes"] == 4096 and type(row["rss_bytes"]) is int
    assert "oncpu_ns" not in row and row["ppid"] == 0  # unknown left out, zero written
    assert obj["unavailable"] == {"net": "not running"}
    # Everything else is protobuf's own JSON mapping.
    expected = MessageToDict(
        resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    expected["processes"][0] |= {"rss_bytes": 4096, "tcp_tx_bytes": BIG}
    assert obj == expected


def test_maps_of_messages_repeated_messages_and_json_names() -> None:
    events = kernel_pb2.GetEventsResponse(evicted_age=BIG, oldest_unix_ns=-5)
    events.events.add(unix_ns=BIG, kind="exec").attrs["n"].int_value = -BIG
    obj = message_dict(events)
    assert obj["evicted_age"] == BIG and obj["oldest_unix_ns"] == -5
    assert obj["events"][0]["unix_ns"] == BIG
    assert obj["events"][0]["attrs"]["n"] == {"int_value": -BIG}
    status = agent_pb2.Status(version="1")
    status.collectors.add(name="host", collections=BIG, errors=2)
    obj = message_dict(status, proto_names=False)
    assert obj["collectors"][0] == {"name": "host", "collections": BIG, "errors": 2}
    trace = tracing_pb2.TraceStatus(trace_id="t")
    trace.processes.add(pid=3, job_id=BIG, size_bytes=19)
    obj = message_dict(trace)
    assert obj["processes"][0]["size_bytes"] == 19 and obj["processes"][0]["job_id"] == BIG


def test_print_json_writes_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    print_json({"a": BIG})
    print_json({"b": 1}, indent=False)
    out = capsys.readouterr().out
    first, second = out.split("\n}\n")
    assert orjson.loads(first + "}") == {"a": BIG}
    assert second == '{"b":1}\n'
