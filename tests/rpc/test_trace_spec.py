"""The trace request's one vocabulary: `TraceSpec`, its protobuf mapping, and what the agent
makes of it (proto3: zero or unset means the default)."""

from __future__ import annotations

import dataclasses

from bpfdyno.rpc.traces import DEFAULT_PROCESS_LIMIT, TraceSpec, spec_from_pb, spec_to_pb
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.server.tracing import request_from_pb
from bpfdyno.tracing.requests import TraceRequest


def test_spec_fields_are_the_proto_fields() -> None:
    ours = {f.name for f in dataclasses.fields(TraceSpec)}
    assert ours == set(pb.StartTraceRequest.DESCRIPTOR.fields_by_name)


def test_round_trip() -> None:
    spec = TraceSpec(
        log_file="/tmp/t.json",
        duration_ms=750,
        iterations=4,
        profile_start_time_ms=1_700_000_000_000,
        profile_start_iteration_roundup=10,
        record_shapes=True,
        profile_memory=True,
        with_stacks=True,
        with_flops=True,
        with_modules=True,
        process_limit=0,
        pids=(12, 34),
        job_id=5678,
        timeout_seconds=30.0,
    )
    assert spec_from_pb(spec_to_pb(spec)) == spec
    assert spec_from_pb(spec_to_pb(TraceSpec())) == TraceSpec()


def test_zero_or_unset_means_the_default() -> None:
    assert spec_from_pb(pb.StartTraceRequest()) == TraceSpec()
    assert TraceSpec().process_limit == DEFAULT_PROCESS_LIMIT
    spec = spec_from_pb(pb.StartTraceRequest(duration_ms=0, iterations=-4, process_limit=0))
    assert (spec.duration_ms, spec.iterations, spec.process_limit) == (500, -1, 0)


def test_the_agent_reads_a_message_as_before() -> None:
    """request_from_pb keeps its proto3 semantics, now through the shared mapping."""
    msg = pb.StartTraceRequest(
        job_id=7,
        pids=[1, 2],
        log_file="/tmp/x.json",
        iterations=3,
        profile_start_iteration_roundup=0,
        with_flops=True,
        timeout_seconds=9.0,
    )
    assert request_from_pb(msg) == TraceRequest(
        job_id=7,
        pids=(1, 2),
        process_limit=3,
        options=TraceSpec(  # the request as it is: its profiler options build the config
            log_file="/tmp/x.json",
            duration_ms=500,
            iterations=3,
            profile_start_time_ms=0,
            profile_start_iteration_roundup=1,
            with_flops=True,
            pids=(1, 2),
            job_id=7,
            timeout_seconds=9.0,
        ),
        timeout_s=9.0,
    )
    assert request_from_pb(pb.StartTraceRequest(process_limit=0)).process_limit == 0
