"""TracingService: matching, process limits, busy processes, delivery and trace tracking.

Polls are fed as the decoded requests the IPC endpoint would hand over; time comes from a
controllable clock so expiry and timeouts are exact.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bpfdyno.core.budget import REQUESTED, REQUESTED_RULE
from bpfdyno.core.errors import InvalidArgument, NotFound, PermissionDenied, Unavailable
from bpfdyno.core.identity import Requester
from bpfdyno.rpc.traces import TraceSpec, TraceStatus
from bpfdyno.rpc.wire import to_pb
from bpfdyno.services.tracing import (
    TraceRequest,
    TracingService,
)
from bpfdyno.tracing.ipc.sender import SenderCreds
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.roles import Role
from bpfdyno.tracing.traces import (
    MAX_DELIVERIES,
    MISSING_FILE_POLLS,
    NEVER_STARTED_POLLS,
    ProcState,
    TrainerState,
)
from bpfdyno.tracing.trainers import TrainerRegistry

IDLE, BUSY = 3, 1


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def wall(self) -> float:
        return 1_800_000_000.0 + self.t

    def mono(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def svc(tmp_path: Path, clock: Clock) -> TracingService:
    (tmp_path / "proc").mkdir()
    return TracingService(
        allowed_dirs=[str(tmp_path)],
        default_timeout_s=60.0,
        registry=TrainerRegistry(max_entries=16, expire_after_s=60.0),
        wall=clock.wall,
        mono=clock.mono,
        proc_root=tmp_path / "proc",
    )


def addr(pid: int) -> bytes:
    return f"\0dynoconfigclient-{pid}\0".encode()


def poll(svc: TracingService, pids: list[int], job: int = 0, ctype: int = IDLE) -> str:
    return svc.on_request(addr(pids[0]), KinetoRequest(ctype, job, tuple(pids)))


def iters(tmp_path: Path, n: int = 3, name: str = "t.pt.trace.json") -> TraceSpec:
    return TraceSpec(log_file=str(tmp_path / name), iterations=n)


def test_registration_and_listing(svc: TracingService, clock: Clock) -> None:
    assert poll(svc, [200, 100, 50], job=7) == ""
    clock.t += 1
    poll(svc, [200, 100, 50], job=7)
    poll(svc, [100, 50], job=7)
    views = {v.pid: v for v in svc.list_trainers()}
    assert views[200].ancestors == (100, 50)
    assert views[200].polls == 2
    assert views[200].first_poll == 1_800_001_000.0
    assert views[200].last_poll == 1_800_001_001.0
    assert views[200].state is TrainerState.IDLE
    assert views[200].role is Role.WORKER
    assert views[100].role is Role.LAUNCHER
    assert views[200].endpoint == "@dynoconfigclient-200"
    assert [v.pid for v in svc.list_trainers(job_id=8)] == []


def test_job_id_matching_explains_mismatches(svc: TracingService, tmp_path: Path) -> None:
    poll(svc, [10], job=4242)
    poll(svc, [11], job=999)
    res = svc.start_trace(TraceRequest(job_id=4242, options=iters(tmp_path)))
    assert res.matched == (10,)
    assert [p.pid for p in res.triggered] == [10]
    assert [(s.pid, s.reason) for s in res.not_matched] == [
        (11, "its job id is 999, the request asked for job 4242; pass --job-id 999 to trace it")
    ]
    res = svc.start_trace(TraceRequest(job_id=0, options=iters(tmp_path, name="u.json")))
    assert res.matched == ()
    assert {s.pid for s in res.not_matched} == {10, 11}


def test_pids_match_ancestors_and_any_job_when_job_is_zero(
    svc: TracingService, tmp_path: Path
) -> None:
    poll(svc, [21, 20, 1000], job=55)
    poll(svc, [22, 20, 1000], job=55)
    poll(svc, [30, 1000], job=0)
    res = svc.start_trace(TraceRequest(pids=(20,), options=iters(tmp_path)))
    assert res.matched == (21, 22)
    res = svc.start_trace(
        TraceRequest(job_id=56, pids=(30,), options=iters(tmp_path, name="b.json"))
    )
    assert res.matched == ()
    assert "asked for job 56" in {s.pid: s.reason for s in res.not_matched}[30]


def test_limit_prefers_workers_over_launchers(svc: TracingService, tmp_path: Path) -> None:
    # A torchrun agent (100) and its two ranks.
    poll(svc, [100, 90])
    poll(svc, [101, 100, 90])
    poll(svc, [102, 100, 90])
    res = svc.start_trace(TraceRequest(pids=(100,), process_limit=2, options=iters(tmp_path)))
    assert res.matched == (101, 102, 100)
    assert [p.pid for p in res.triggered] == [101, 102]
    assert [p.output_path for p in res.triggered] == [
        str(tmp_path / "t_101.pt.trace.json"),
        str(tmp_path / "t_102.pt.trace.json"),
    ]
    assert [(s.pid, s.reason) for s in res.over_limit] == [
        (100, "over the process limit of 2 (a launcher of other trainers, so it came after them)")
    ]


def test_dataloader_workers_come_last(svc: TracingService, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid in (301, 302):  # spawn-context DataLoader workers of trainer 300
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "comm").write_text("pt_data_worker\n")
        (proc / str(pid) / "stat").write_text(f"{pid} (pt_data_worker) S 300 1 1 0 -1\n")
    poll(svc, [300, 1])
    poll(svc, [301, 300, 1])
    poll(svc, [302, 300, 1])
    roles = {v.pid: v.role for v in svc.list_trainers()}
    assert roles == {300: Role.WORKER, 301: Role.DATA_WORKER, 302: Role.DATA_WORKER}
    res = svc.start_trace(TraceRequest(pids=(300,), process_limit=1, options=iters(tmp_path)))
    assert [p.pid for p in res.triggered] == [300]
    assert [s.pid for s in res.over_limit] == [301, 302]
    assert "DataLoader worker" in res.over_limit[0].reason


def test_config_waits_for_a_free_poll_and_is_delivered_once(
    svc: TracingService, tmp_path: Path
) -> None:
    poll(svc, [40])
    res = svc.start_trace(TraceRequest(pids=(40,), options=iters(tmp_path)))
    assert svc.list_trainers()[0].state is TrainerState.CONFIG_PENDING
    assert poll(svc, [40], ctype=BUSY) == ""  # never hand a config to a busy profiler
    text = poll(svc, [40], ctype=IDLE)
    assert text.endswith(f"\nREQUEST_TRACE_ID={res.trace_id}")
    assert text.startswith(f"ACTIVITIES_LOG_FILE={tmp_path}/t.pt.trace.json\n")
    assert poll(svc, [40]) == ""
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.DELIVERED


def test_busy_process_gets_nothing_until_its_trace_ends(
    svc: TracingService, tmp_path: Path
) -> None:
    poll(svc, [50])
    first = svc.start_trace(TraceRequest(pids=(50,), options=iters(tmp_path)))
    second = svc.start_trace(TraceRequest(pids=(50,), options=iters(tmp_path, name="x.json")))
    assert second.triggered == ()
    assert [(s.pid, s.reason) for s in second.busy] == [
        (50, f"busy: trace {first.trace_id} is waiting for its next poll")
    ]
    assert poll(svc, [50]) != ""  # delivered
    # It has not started yet (or reads replies one poll late): still busy for new requests.
    assert poll(svc, [50]) == ""
    third = svc.start_trace(TraceRequest(pids=(50,), options=iters(tmp_path, name="y.json")))
    assert [s.reason for s in third.busy] == [
        f"busy: it is still working on trace {first.trace_id}"
    ]
    poll(svc, [50], ctype=BUSY)
    assert svc.tracing_pids() == {50}
    assert svc.list_trainers()[0].state is TrainerState.TRACING
    out = tmp_path / "t_50.pt.trace.json"
    out.write_text("{}")
    poll(svc, [50])  # idle again, and the file is there
    view = svc.get_trace(first.trace_id)
    assert view.processes[0].state is ProcState.WRITTEN
    assert view.processes[0].size_bytes == 2
    assert view.done
    fourth = svc.start_trace(TraceRequest(pids=(50,), options=iters(tmp_path, name="z.json")))
    assert [p.pid for p in fourth.triggered] == [50]


def test_tmp_file_means_tracing_and_only_the_final_name_means_written(
    svc: TracingService, tmp_path: Path
) -> None:
    poll(svc, [60])
    res = svc.start_trace(TraceRequest(pids=(60,), options=iters(tmp_path)))
    poll(svc, [60])
    (tmp_path / "t_60.pt.trace.json.tmp").write_text("")
    svc.tracker.check()
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.TRACING
    os.rename(tmp_path / "t_60.pt.trace.json.tmp", tmp_path / "t_60.pt.trace.json")
    svc.tracker.check()
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.WRITTEN


def test_duration_trace_that_never_starts_is_handed_out_again_then_fails(
    svc: TracingService, tmp_path: Path
) -> None:
    """Kineto drops a config whose warm-up its profiler thread began late (a stalled or
    starved trainer); the request still means "now", so the same config goes out again at
    the poll that shows the drop, up to MAX_DELIVERIES times in all."""
    poll(svc, [70])
    opts = TraceSpec(log_file=str(tmp_path / "d.json"))
    res = svc.start_trace(TraceRequest(pids=(70,), options=opts))
    config = poll(svc, [70])  # delivered
    assert f"ACTIVITIES_LOG_FILE={tmp_path}/d.json" in config.splitlines()
    for delivery in range(2, MAX_DELIVERIES + 1):
        replies = [poll(svc, [70]) for _ in range(NEVER_STARTED_POLLS)]
        assert replies == [""] * (NEVER_STARTED_POLLS - 1) + [config]
        p = svc.get_trace(res.trace_id).processes[0]
        assert p.state is ProcState.DELIVERED
        assert p.reason == (
            f"config delivered again ({delivery} of {MAX_DELIVERIES}); waiting for tracing to start"
        )
    replies = [poll(svc, [70]) for _ in range(NEVER_STARTED_POLLS)]
    assert replies == [""] * NEVER_STARTED_POLLS
    p = svc.get_trace(res.trace_id).processes[0]
    assert p.state is ProcState.FAILED and p.config_dropped
    assert p.reason.startswith(
        f"the process never started tracing ({NEVER_STARTED_POLLS} polls after delivery, "
        f"handed out {MAX_DELIVERIES} times); Kineto dropped the config"
    )
    # The guard is lifted: the process can take the next request.
    assert svc.start_trace(TraceRequest(pids=(70,), options=iters(tmp_path))).triggered


def test_a_config_handed_out_again_is_traced_once_the_process_starts_it(
    svc: TracingService, tmp_path: Path
) -> None:
    poll(svc, [74])
    opts = TraceSpec(log_file=str(tmp_path / "g.json"))
    res = svc.start_trace(TraceRequest(pids=(74,), options=opts))
    poll(svc, [74])  # delivered
    for _ in range(NEVER_STARTED_POLLS):
        poll(svc, [74])  # dropped; delivered again by the last of them
    poll(svc, [74], ctype=BUSY)
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.TRACING
    (tmp_path / "g_74.json").write_text("{}")
    poll(svc, [74])
    p = svc.get_trace(res.trace_id).processes[0]
    assert (p.state, p.reason) == (ProcState.WRITTEN, "trace file written")


def test_a_dropped_trace_that_left_an_empty_tmp_is_handed_out_again_too(
    svc: TracingService, tmp_path: Path
) -> None:
    """Kineto 2.13 drops a duration config it has no time to warm up for, and leaves an empty
    <name>.tmp: the process never turns busy, so the config goes out again after the same
    polls (it used to count as tracing until its timeout). The .tmp left behind is no sign
    that the next delivery is traced; a .tmp written again is."""
    poll(svc, [72])
    opts = TraceSpec(log_file=str(tmp_path / "e.json"))
    res = svc.start_trace(TraceRequest(pids=(72,), options=opts))
    poll(svc, [72])  # delivered
    tmp = tmp_path / "e_72.json.tmp"
    tmp.write_text("")
    for _ in range(NEVER_STARTED_POLLS - 1):
        poll(svc, [72])
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.TRACING
    poll(svc, [72])  # the drop seen: delivered again
    p = svc.get_trace(res.trace_id).processes[0]
    assert p.state is ProcState.DELIVERED, p.reason
    svc.tracker.check()
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.DELIVERED
    os.utime(tmp, ns=(tmp.stat().st_atime_ns, tmp.stat().st_mtime_ns + 1_000_000_000))
    svc.tracker.check()  # Kineto opened it again for this delivery
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.TRACING
    for _ in range(NEVER_STARTED_POLLS):
        poll(svc, [72])  # and dropped it again
    for _ in range(NEVER_STARTED_POLLS):
        poll(svc, [72])
    p = svc.get_trace(res.trace_id).processes[0]
    assert p.state is ProcState.FAILED
    assert "never started tracing" in p.reason and "left an unfinished .tmp" in p.reason


def test_duration_trace_with_a_start_time_may_stay_idle_until_its_warm_up(
    svc: TracingService, tmp_path: Path, clock: Clock
) -> None:
    poll(svc, [73])
    start_s = clock.wall() + 20  # Kineto warms up 5 s before: idle for ~15 s is healthy
    opts = TraceSpec(log_file=str(tmp_path / "s.json"), profile_start_time_ms=int(start_s * 1000))
    res = svc.start_trace(TraceRequest(pids=(73,), options=opts))
    poll(svc, [73])  # delivered
    for _ in range(14):
        clock.t += 1
        poll(svc, [73])
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.DELIVERED
    clock.t += 1  # the warm-up has begun: from now on, idle polls count
    for _ in range(NEVER_STARTED_POLLS - 1):
        poll(svc, [73])
        clock.t += 1
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.DELIVERED
    poll(svc, [73])
    p = svc.get_trace(res.trace_id).processes[0]
    assert p.state is ProcState.FAILED and p.config_dropped
    assert "never started tracing" in p.reason
    # The flag travels: a job trace decides on it whether to trace the job again.
    [wire] = to_pb(svc.get_trace(res.trace_id), TraceStatus).processes
    assert wire.config_dropped


def test_trace_that_ends_without_a_file_fails(svc: TracingService, tmp_path: Path) -> None:
    poll(svc, [71])
    res = svc.start_trace(TraceRequest(pids=(71,), options=iters(tmp_path)))
    poll(svc, [71])
    poll(svc, [71], ctype=BUSY)
    for _ in range(MISSING_FILE_POLLS):
        poll(svc, [71])
    p = svc.get_trace(res.trace_id).processes[0]
    assert p.state is ProcState.FAILED
    assert not p.config_dropped  # it traced: another try would not help
    assert "never appeared" in p.reason


def test_iteration_trace_waits_then_times_out(
    svc: TracingService, tmp_path: Path, clock: Clock
) -> None:
    poll(svc, [72])
    res = svc.start_trace(TraceRequest(pids=(72,), options=iters(tmp_path), timeout_s=30))
    for _ in range(10):  # waiting for its round-up iteration: idle, but not failed
        clock.t += 1
        poll(svc, [72])
    assert svc.get_trace(res.trace_id).processes[0].state is ProcState.DELIVERED
    clock.t += 25
    svc.tracker.check()
    p = svc.get_trace(res.trace_id).processes[0]
    assert p.state is ProcState.TIMED_OUT
    assert "optimizer steps" in p.reason


def test_silent_trainer_expires_and_its_trace_fails(
    svc: TracingService, tmp_path: Path, clock: Clock
) -> None:
    poll(svc, [73])
    res = svc.start_trace(TraceRequest(pids=(73,), options=iters(tmp_path)))
    clock.t += 61
    svc.sweep()
    assert svc.list_trainers() == []
    p = svc.get_trace(res.trace_id).processes[0]
    assert p.state is ProcState.FAILED
    assert "stopped polling" in p.reason


def test_requests_that_would_lose_data_are_rejected(svc: TracingService, tmp_path: Path) -> None:
    poll(svc, [80])
    poll(svc, [81])
    (tmp_path / "t_80.pt.trace.json").write_text("old trace")
    with pytest.raises(InvalidArgument) as info:
        svc.start_trace(TraceRequest(options=iters(tmp_path)))
    assert info.value.rule == "would_overwrite"
    with pytest.raises(InvalidArgument) as info:
        svc.start_trace(TraceRequest(options=iters(tmp_path, name="trace")))
    assert info.value.rule == "no_pid_in_name"
    # Nothing was stored by the rejected requests.
    assert all(v.state is TrainerState.IDLE for v in svc.list_trainers())


@pytest.mark.parametrize(
    ("req", "rule"),
    [
        (TraceRequest(job_id=-1, config="A=1"), "bad_job_id"),
        (TraceRequest(pids=(-3,), config="A=1"), "bad_pid"),
        (TraceRequest(process_limit=-1, config="A=1"), "bad_process_limit"),
        (TraceRequest(), "bad_request"),
        (TraceRequest(config="ACTIVITIES_LOG_FILE=/etc/passwd.json"), "outside_allowed_dirs"),
    ],
)
def test_bad_requests(svc: TracingService, req: TraceRequest, rule: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        svc.start_trace(req)
    assert info.value.rule == rule


def test_default_log_file_and_unknown_trace(
    svc: TracingService, tmp_path: Path, clock: Clock
) -> None:
    poll(svc, [90])
    res = svc.start_trace(TraceRequest(options=TraceSpec(log_file="", iterations=2)))
    # A timestamped name (the wall clock's local time) in the first allowed directory.
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(clock.wall()))
    assert res.triggered[0].output_path == str(tmp_path / f"trace_{stamp}_90.pt.trace.json")
    with pytest.raises(NotFound):
        svc.get_trace("nope")


def test_unavailable_endpoint_is_reported(svc: TracingService, tmp_path: Path) -> None:
    svc.unavailable_reason = "the Kineto IPC endpoint is not running: @dynolog@ is taken"
    with pytest.raises(Unavailable, match="@dynolog@ is taken"):
        svc.start_trace(TraceRequest(options=iters(tmp_path)))


def test_registry_is_bounded_and_keeps_live_trainers(clock: Clock) -> None:
    reg = TrainerRegistry(max_entries=2, expire_after_s=60.0)
    req = KinetoRequest(IDLE, 0, (1000,))
    assert reg.observe(b"a", req, clock.wall(), clock.mono()) is not None
    assert reg.observe(b"b", req, clock.wall(), clock.mono()) is not None
    assert reg.observe(b"c", req, clock.wall(), clock.mono()) is None  # both are live
    assert reg.stats.refused_full == 1
    clock.t += 11
    assert reg.observe(b"b", req, clock.wall(), clock.mono()) is not None
    assert reg.observe(b"c", req, clock.wall(), clock.mono()) is not None  # evicts quiet "a"
    assert reg.get(b"a") is None
    assert reg.stats.evicted == 1


def test_one_user_cannot_fill_the_registry(clock: Clock) -> None:
    """A user binding many sockets (each poll with its own, true pid) gets its quota only."""
    reg = TrainerRegistry(max_entries=10, expire_after_s=60.0, max_per_uid=3)
    req = KinetoRequest(IDLE, 0, (1000,))
    now = clock.wall(), clock.mono()
    for i in range(3):
        assert reg.observe(f"m{i}".encode(), req, *now, uid=1001, host_pid=1000) is not None
    assert reg.observe(b"m3", req, *now, uid=1001, host_pid=1000) is None
    assert reg.stats.refused_uid_quota == 1
    assert reg.observe(b"other", req, *now, uid=1002, host_pid=2000) is not None
    assert reg.observe(b"root", req, *now, uid=0, host_pid=3000) is not None
    reg.forget(b"m0")  # a slot of its own comes back when one of its trainers goes
    assert reg.observe(b"m3", req, *now, uid=1001, host_pid=1000) is not None
    clock.t += 61
    assert {t.address for t in reg.expire(clock.mono())} == {b"m1", b"m2", b"m3", b"other", b"root"}
    assert reg.observe(b"m4", req, clock.wall(), clock.mono(), uid=1001) is not None


def test_file_is_checked_again_just_before_delivery(svc: TracingService, tmp_path: Path) -> None:
    """A link planted after the request (the issue's attack, one step later) stops delivery."""
    poll(svc, [40])
    res = svc.start_trace(TraceRequest(options=iters(tmp_path, name="late.json")))
    assert [p.pid for p in res.triggered] == [40]
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "late_40.json.tmp").symlink_to(victim)
    assert poll(svc, [40]) == ""  # not handed out
    [proc] = svc.get_trace(res.trace_id).processes
    assert proc.state is ProcState.FAILED
    assert proc.reason.startswith("not delivered: trace file rejected by rule 'tmp_exists'")
    record = svc.audit.records(None)[-1]
    assert (record.action, record.decision, record.rule) == (
        "deliver_trace",
        "refused",
        "tmp_exists",
    )
    assert victim.read_text() == "precious"


def test_a_file_of_someone_else_at_the_final_name_is_not_the_trace(
    svc: TracingService, tmp_path: Path
) -> None:
    sender = SenderCreds(50, 0, 0)  # root, itself: its claims are taken as they are
    svc.on_request(addr(50), KinetoRequest(IDLE, 0, (50,)), sender)
    res = svc.start_trace(TraceRequest(options=iters(tmp_path, name="f.json")))
    assert svc.on_request(addr(50), KinetoRequest(IDLE, 0, (50,)), sender) != ""  # delivered
    planted = tmp_path / "f_50.json"
    planted.write_text('{"traceEvents": []}')
    os.chown(planted, 51001, 51001)
    svc.on_request(addr(50), KinetoRequest(BUSY, 0, (50,)), sender)
    [proc] = svc.get_trace(res.trace_id).processes
    assert proc.state is ProcState.FAILED
    assert "owned by uid 51001, not by the traced process's owner (uid 0)" in proc.reason


def test_a_user_whose_requested_work_is_spent_is_refused_kernel_tracks(
    svc: TracingService, tmp_path: Path
) -> None:
    """Recording a trace's kernel tracks is its requester's work, bounded per user like reads:
    a user who has had the agent spend their allowance is refused a trace with kernel tracks
    (rule ``requested_work_limit``, with when to retry), before anything is matched."""
    poll(svc, [10], job=7)
    user = Requester(uid=64999, transport="grpc-unix", peer="pid 1", pid=1)
    REQUESTED.charge(["uid 64999"], 2_000_000_000)  # 2 s of a core: 4 x what 10 s allow
    with pytest.raises(Unavailable) as refused:
        svc.start_trace(
            TraceRequest(job_id=7, options=iters(tmp_path), kernel_tracks=("sched",)), user
        )
    assert refused.value.rule == REQUESTED_RULE
    assert "uid 64999 has had the agent spend more than 5 % of a core" in str(refused.value)
    # Without kernel tracks nothing is recorded for them: that rule does not apply (the
    # process is root's, which is what refuses them then).
    with pytest.raises(PermissionDenied) as other:
        svc.start_trace(TraceRequest(job_id=7, options=iters(tmp_path), kernel_tracks=()), user)
    assert other.value.rule != REQUESTED_RULE
