"""The one mapping between the API's records and protobuf, by field name: every record maps
to its message and back, unknown stays unknown, and a record that drifts from its message
is refused when it is declared."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from bpfdyno.core.metrics import MetricKind as CoreKind
from bpfdyno.core.metrics import MetricSpec as CoreSpec
from bpfdyno.rpc import agent, audit, detection, kernel, traces
from bpfdyno.rpc.processes import ProcessRow
from bpfdyno.rpc.v1 import agent_pb2, kernel_pb2, tracing_pb2
from bpfdyno.rpc.wire import from_pb, message, record_dict, record_from_dict, to_pb

RECORDS = [
    agent.AgentStatus(
        version="1.2",
        agent_uptime_seconds=12.5,
        pid=7,
        collectors=(
            agent.CollectorStatus("gpu", agent.CollectorState.UNAVAILABLE, "no NVML"),
            agent.CollectorStatus("host", interval_seconds=1.0, collections=9),
        ),
        started_unix_seconds=1.7e9,
    ),
    agent.MetricsSnapshot(
        5.0,
        "host",
        (
            agent.Series(
                "cpu_utilization_ratio",
                (agent.Label("cpu", "0"),),
                (agent.Point(5.0, 1.0),),
            ),
        ),
    ),
    kernel.KernelEvent(1, "tcp_retransmit", 3, 4, "py", {"dport": 80, "rtt_s": 0.5, "d": "x"}),
    traces.Trainer(9, (1, 2), 5678, uid=None, role=traces.TrainerRole.DATA_WORKER),
    traces.Trainer(9, uid=0, state=traces.TrainerState.CONFIG_PENDING),
    traces.TraceStatus(
        "t",
        processes=(
            traces.ProcessTrace(
                1,
                state=traces.ProcessTraceState.TIMED_OUT,
                kernel_tracks=traces.KernelTracks(("net",), "not merged", reason="full"),
            ),
        ),
        done=True,
    ),
    traces.ProcessSummary("/t.json", pid=3, blocked_seconds_by_cause={"lock": 0.25}),
    audit.AuditRecord(4, uid=None, processes=(audit.AuditedProcess(1, 0, None, "/t_1.json"),)),
    detection.DetectionEvent(
        detection.DetectionKind.HANG,
        "7",
        2,
        41,
        "node-a",
        1.7e9,
        "job 7 hangs",
        (detection.SignalEvidence("cpu_wait_share", 0.5, 0.01),),
        "stopped",
        (detection.ThreadReport(41, "python", "T", offcpu_seconds=30.0),),
    ),
    detection.RankSignal("7", 3, 42, "node-b", 1.7e9, 5.0, 0.5, 1.25, 4.0, 0.0, 1 << 33, None, 0.5),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_each_record_maps_to_its_message_and_back(record: object) -> None:
    assert from_pb(type(record), to_pb(record)) == record
    assert record_from_dict(type(record), record_dict(record)) == record


def test_unknown_values_are_unset_fields_and_come_back_unknown() -> None:
    row = traces.Trainer(9)
    msg = to_pb(row)
    assert isinstance(msg, tracing_pb2.Trainer)
    assert not msg.HasField("uid") and msg.role == tracing_pb2.TRAINER_ROLE_UNSPECIFIED
    assert from_pb(traces.Trainer, msg).uid is None and from_pb(traces.Trainer, msg).role is None
    assert not to_pb(kernel.TcpConnection(1)).HasField("srtt_seconds")  # type: ignore[attr-defined]
    # A plain double proto3 cannot leave unset: 0 there means unknown (NaN).
    row = ProcessRow(1)
    assert to_pb(row).start_unix_seconds == 0.0  # type: ignore[attr-defined]
    assert math.isnan(from_pb(ProcessRow, kernel_pb2.ProcessRow(pid=1)).start_unix_seconds)
    assert record_dict(agent.CollectorStatus("x")) == {
        "name": "x",
        "state": "COLLECTOR_STATE_OK",
    }


def test_the_agent_s_own_objects_go_out_by_field_and_member_name() -> None:
    # The catalog's specs have the API's field names and an enum with its member names.
    spec = CoreSpec("x_ratio", CoreKind.RATIO, "ratio", "help", ("cpu",), "host")
    assert to_pb(spec, agent.MetricSpec) == agent_pb2.MetricSpec(
        name="x_ratio",
        kind=agent_pb2.METRIC_KIND_RATIO,
        unit="ratio",
        help="help",
        labels=["cpu"],
        source="host",
    )


def test_a_request_reads_zero_as_its_default() -> None:
    spec = traces.spec_from_pb(tracing_pb2.StartTraceRequest(log_file="/t.json"))
    assert (spec.duration_ms, spec.process_limit, spec.iterations) == (500, 3, -1)
    assert traces.spec_from_pb(traces.spec_to_pb(spec)) == spec


def test_a_record_must_have_its_message_s_fields() -> None:
    with pytest.raises(TypeError) as e:

        @message(agent_pb2.Label)
        @dataclass(frozen=True)
        class Label:
            name: str
            text: str

    assert str(e.value) == (
        "Label must have the fields of Label; only in the record: ['text'], only in the "
        "message: ['value']"
    )
