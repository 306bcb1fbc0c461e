"""A job trace tried again after a rank's Kineto dropped its config: the names of the next
try's files, and how the report and ``--json`` say what happened (records built by hand;
the whole thing against a real SLURM job is tests/cluster/test_job_trace.py)."""

from __future__ import annotations

import pytest

from bpfdyno.cli.cluster import Cluster, format_job_again, format_job_files, job_trace_dict
from bpfdyno.client.cluster.jobtrace import (
    HostRequest,
    HostTrace,
    JobTraceResult,
    retry_log_file,
)
from bpfdyno.client.cluster.nodes import Node
from bpfdyno.rpc.traces import (
    ProcessTrace,
    ProcessTraceState,
    TraceSpec,
    TraceStart,
    TraceStatus,
    TriggeredProcess,
)


@pytest.mark.parametrize(
    ("log_file", "attempt", "name"),
    [
        ("/t/r.pt.trace.json", 2, "/t/r-try2.pt.trace.json"),  # Kineto's pid goes before .pt
        ("/t/r.json", 2, "/t/r-try2.json"),
        ("/t/r.json.gz", 3, "/t/r-try3.json.gz"),
        ("/t/plain", 2, "/t/plain-try2"),  # no .json: Kineto writes the name as it is
        ("", 2, ""),  # the agent's default names carry the request's time
    ],
)
def test_each_try_writes_files_of_its_own(log_file: str, attempt: int, name: str) -> None:
    assert retry_log_file(log_file, attempt) == name


NODES = (Node("n1", "10.0.0.1:1778", (7,)), Node("n2", "10.0.0.2:1778", (7,)))


def host(node: Node, pid: int, path: str, state: ProcessTraceState, dropped: bool) -> HostTrace:
    start = TraceStart(f"t-{node.name}", (pid,), (TriggeredProcess(pid, 7, path),))
    final = TraceStatus(
        f"t-{node.name}",
        processes=(ProcessTrace(pid, 7, path, state, "why", config_dropped=dropped),),
        done=True,
    )
    return HostTrace(node, requests=(HostRequest(7, start, final),), waited=True)


def test_the_report_and_the_json_keep_the_first_try_and_say_why_it_was_tried_again() -> None:
    written, failed = ProcessTraceState.WRITTEN, ProcessTraceState.FAILED
    first = JobTraceResult(
        TraceSpec(log_file="/t/d.json", profile_start_time_ms=1000),
        (
            host(NODES[0], 11, "/t/d_11.json", written, False),
            host(NODES[1], 12, "/t/d_12.json", failed, True),
        ),
        waited=True,
    )
    second = JobTraceResult(
        TraceSpec(log_file="/t/d-try2.json", profile_start_time_ms=2000),
        (
            host(NODES[0], 11, "/t/d-try2_11.json", written, False),
            host(NODES[1], 12, "/t/d-try2_12.json", written, False),
        ),
        waited=True,
        attempt=2,
        earlier=(first,),
    )
    assert [f.pid for f in first.dropped()] == [12]
    assert format_job_again(second) == (
        "try 1: Kineto dropped the config of n2 pid 12 (it never started tracing: stalled or "
        "too busy at its warm-up tick), so the ranks share no window; tracing the whole job "
        "again (try 2 of at most 2) with a new common start"
    )
    assert format_job_files(first).splitlines()[0] == "Trace files (try 1):"
    assert format_job_files(second).splitlines()[0] == "Trace files (try 2):"
    doc = job_trace_dict(Cluster(NODES, "7", 7, "SLURM"), second)
    assert (doc["outcome"], doc["attempt"]) == ("all", 2)
    [before] = doc["earlier_attempts"]
    assert (before["attempt"], before["outcome"]) == (1, "some_failed")
    assert before["request"]["log_file"] == "/t/d.json"
    assert before["request"]["profile_start_time_ms"] == 1000
    assert [f["config_dropped"] for h in before["hosts"] for f in h["files"]] == [False, True]
    assert [f["path"] for h in doc["hosts"] for f in h["files"]] == [
        "/t/d-try2_11.json",
        "/t/d-try2_12.json",
    ]
