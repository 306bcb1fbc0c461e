"""The trace request's vocabulary, shared by the agent and every client.

`TraceSpec` is what a client asks a trace to be — which processes, for how long, what the
profiler records — with the field names of ``StartTraceRequest`` in ``tracing.proto`` and the
defaults of ``dyno gputrace``. `spec_to_pb` and `spec_from_pb` are the one mapping to and from
the message: ``bpfdyno gputrace`` and ``bpfdyno top`` send with the first, the agent's
servicer reads with the second.

proto3 cannot tell a field set to zero from one not set, so on the wire zero (or an unset
``optional`` field) means the default; an ``iterations`` of zero or less means a duration
trace.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bpfdyno.rpc.v1 import tracing_pb2

#: Length of a duration trace when none is given (dyno's default).
DEFAULT_DURATION_MS = 500
#: Most processes triggered when no limit is given (dyno's default).
DEFAULT_PROCESS_LIMIT = 3
#: ``iterations`` of a duration trace.
NO_ITERATIONS = -1
#: Kineto warms up this long before a timed trace (``profile_start_time_ms``): a start time
#: closer than this when the process receives the request is not traced, so the agent
#: refuses one closer than this when it gets the request.
KINETO_WARMUP_S = 5.0


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """A trace request: who to trace, for how long, and what to record.

    Attributes:
        log_file: absolute path of the trace file; Kineto inserts ``_<pid>``. Empty: a name
            under the agent's trace directory.
        duration_ms: length of a duration trace.
        iterations: > 0 traces this many optimizer steps instead of a duration.
        profile_start_time_ms: duration trace: epoch ms to start at; 0 = about 7 s after the
            process gets the request.
        profile_start_iteration_roundup: iteration trace: start at a multiple of this step.
        record_shapes, profile_memory, with_stacks, with_flops, with_modules: profiler
            options, as the ``dyno gputrace`` switches of the same names.
        process_limit: most processes to trigger (workers before launchers and DataLoader
            workers).
        pids: processes to trace (a process matches when its pid or an ancestor's is listed);
            empty: every process of the job.
        job_id: the SLURM job to trace; 0: processes without one, or any job when ``pids``
            are given.
        timeout_seconds: how long the agent follows the trace; 0 = its default.
        kernel_tracks: the kernel tracks merged into each file (`bpfdyno.rpc.kernel_tracks`:
            ``net,sched,nccl,gpu``, ``all`` or ``none``); "" = the agent's default.
        pre_window_seconds: rare network events from this long before the request are
            added; None = the agent's default.
    """

    log_file: str = ""
    duration_ms: int = DEFAULT_DURATION_MS
    iterations: int = NO_ITERATIONS
    profile_start_time_ms: int = 0
    profile_start_iteration_roundup: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stacks: bool = False
    with_flops: bool = False
    with_modules: bool = False
    process_limit: int = DEFAULT_PROCESS_LIMIT
    pids: tuple[int, ...] = ()
    job_id: int = 0
    timeout_seconds: float = 0.0
    kernel_tracks: str = ""
    pre_window_seconds: float | None = None

    @property
    def iteration_mode(self) -> bool:
        """Whether the trace counts optimizer steps rather than milliseconds."""
        return self.iterations > 0


def _field_names() -> tuple[str, ...]:
    """The fields of `TraceSpec`, checked against ``StartTraceRequest``.

    Raises:
        TypeError: the dataclass and ``tracing.proto`` disagree (a programming error).
    """
    ours = [f.name for f in dataclasses.fields(TraceSpec)]
    wire = tracing_pb2.StartTraceRequest.DESCRIPTOR.fields_by_name.keys()
    if set(ours) != set(wire):
        raise TypeError(
            "TraceSpec and tracing.proto's StartTraceRequest must have the same fields; only "
            f"in the dataclass: {sorted(set(ours) - set(wire))}, only in the proto: "
            f"{sorted(set(wire) - set(ours))}"
        )
    return tuple(ours)


_FIELDS = _field_names()


def spec_to_pb(spec: TraceSpec) -> tracing_pb2.StartTraceRequest:
    """The StartTrace message for a request (every field set, defaults included)."""
    values: dict[str, Any] = {
        name: getattr(spec, name) for name in _FIELDS if getattr(spec, name) is not None
    }
    values["pids"] = list(spec.pids)
    return tracing_pb2.StartTraceRequest(**values)


def spec_from_pb(msg: tracing_pb2.StartTraceRequest) -> TraceSpec:
    """The request a StartTrace message states: zero or unset fields take the defaults."""
    wire = msg.DESCRIPTOR.fields_by_name
    values: dict[str, Any] = {}
    for name in _FIELDS:
        value = getattr(msg, name)
        if wire[name].has_presence:
            if msg.HasField(name):
                values[name] = value
        elif value:  # proto3: zero and unset are one and the same
            values[name] = tuple(value) if wire[name].is_repeated else value
    spec = TraceSpec(**values)
    if not spec.iteration_mode and spec.iterations != NO_ITERATIONS:
        spec = dataclasses.replace(spec, iterations=NO_ITERATIONS)
    return spec
