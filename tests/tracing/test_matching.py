"""`match_trainers`: who a trace request reaches, decided from plain values alone."""

from __future__ import annotations

from bpfdyno.core.identity import Requester
from bpfdyno.tracing.requests import SkippedProcess, TraceRequest, match_trainers
from bpfdyno.tracing.roles import Role
from bpfdyno.tracing.traces import OpenPart, ProcState
from bpfdyno.tracing.trainers import Trainer

FREE = 3  # the poll's config type: activities profiler free


def trainer(pid: int, job: int, uid: int = 1000, *parents: int, busy: bool = False) -> Trainer:
    return Trainer(f"\0t{pid}\0".encode(), (pid, *parents), job, 0.0, 0.0, 0.0, 1,
                   0 if busy else FREE, uid)  # fmt: skip


def test_workers_first_then_busy_limit_and_owners() -> None:
    launcher = trainer(10, 7)
    workers = [trainer(p, 7, 1000, 10) for p in (14, 16, 13)]
    busy = trainer(11, 7, 1000, 10, busy=True)
    held = trainer(12, 7, 1000, 10)
    other_job = trainer(20, 8)
    theirs = trainer(30, 7, 2000)
    trainers = [launcher, *workers, busy, held, other_job, theirs]
    roles = {t.address: Role.WORKER for t in trainers} | {launcher.address: Role.LAUNCHER}
    parts = {held.address: OpenPart("abc", ProcState.PENDING)}
    m = match_trainers(
        TraceRequest(job_id=7, process_limit=3),
        Requester(uid=1000, transport="in-process"),
        trainers,
        roles,
        parts,
    )
    assert [t.pid for t in m.matched] == [11, 12, 13, 14, 16, 10]
    # 11 and 12 are busy and take no slot; the launcher comes after the three workers.
    assert [t.pid for t in m.triggered] == [13, 14, 16]
    assert m.busy == (
        SkippedProcess(
            11, 7, "busy: its profiler is tracing (started by another request or by the job "
            "itself)"
        ),
        SkippedProcess(12, 7, "busy: trace abc is waiting for its next poll"),
    )  # fmt: skip
    assert m.over_limit == (
        SkippedProcess(
            10, 7, "over the process limit of 3 (a launcher of other trainers, so it came after "
            "them)"
        ),
    )  # fmt: skip
    assert [s.pid for s in m.not_matched] == [20, 30]
    assert m.not_theirs == ((30, 2000),)
