"""Local privilege safety: each attack found on main, tried by an unprivileged local user.

The user is created for the test (useradd) and runs everything through ``setpriv``: the
``bpfdyno`` CLI (gRPC through the agent's Unix front), the dyno CLI's exact frames on the
legacy port, fake Kineto clients, and real PyTorch trainers. Each attack gets a refusal
naming its rule, nothing outside the user's reach changes, and the legitimate requests —
a user tracing its own trainer into its own directory, root tracing anything into a safe
directory — keep working on every entry point.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import orjson
import pytest
from local_user import local_user
from security_site import MAX_DURATION_MS, USER_CLIENT, VICTIM_BYTES, Site, idle, registered
from tracing_harness import (
    Harness,
    KinetoClient,
    dyno_gputrace_bytes,
    frame,
    legacy_call,
    make_config,
    trace_json,
    unframe,
)

from bpfdyno.app.daemon import Daemon
from bpfdyno.app.tracing import TracingComponent
from bpfdyno.core.config import load
from bpfdyno.core.status import PartState
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.server.tracing import servicer_factory
from bpfdyno.services.agent import AgentService
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.traces import ProcState

pytestmark = [pytest.mark.root, pytest.mark.slow]


def owner_of(path: Path) -> int:
    return os.lstat(path).st_uid


@pytest.mark.usefixtures("torch_ready")
async def test_planted_link_cannot_make_a_root_trainer_overwrite_a_file(site: Site) -> None:
    """Found on main: a user plants <name>_<pid>.json.tmp -> a root file in a directory of
    theirs, asks for a trace of a root trainer there, and Kineto (as root) overwrites it."""
    h, user = site.h, site.user
    root_pid = await registered(site, h.spawn_script("linear.py"))
    [t] = h.service.list_trainers()
    assert (t.uid, t.host_pid) == (0, root_pid)  # the kernel's word, not the poll's
    link = site.user_dir / f"t_{root_pid}.json.tmp"
    r = await site.as_user("ln", "-s", str(site.victim), str(link))
    assert r.returncode == 0, r.stderr
    target = str(site.user_dir / "t.json")

    # 1. The dyno CLI's exact bytes (every process of job 0), from the user.
    reply = await site.user_frame(dyno_gputrace_bytes(target))
    assert (reply["status"], reply["rule"]) == ("failed", "not_process_owner")
    assert f"pid {root_pid} (uid 0 (root))" in str(reply["error"])
    assert f"uid {user.uid} ({user.name}) may trace only its own processes" in str(reply["error"])
    assert reply["activityProfilersTriggered"] == []
    # 2. bpfdyno gputrace from the user (gRPC through the front), naming the pid.
    r = await site.user_cli("gputrace", "--pids", str(root_pid), "--log-file", target)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "bpfdyno: permission denied: refused by rule 'not_process_owner'" in r.stderr
    # 3. Not even root may send a trace there: the directory is the user's.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await site.stub().StartTrace(
            pb.StartTraceRequest(pids=[root_pid], log_file=target, iterations=2)
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "unsafe_directory" in str(info.value.details())
    assert f"belongs to uid {user.uid}" in str(info.value.details())
    assert h.service.list_trainers()[0].trace_id == ""  # nothing was handed out

    # The legitimate request still works: root's trainer into root's directory.
    raw = await legacy_call(h.legacy_port, dyno_gputrace_bytes(str(h.trace_dir / "r.json")))
    ok = unframe(raw)
    assert ok["activityProfilersTriggered"] == [root_pid]
    view = await h.wait_done(str(ok["traceId"]), timeout=60)
    assert view.processes[0].state is ProcState.WRITTEN
    written = h.trace_dir / f"r_{root_pid}.json"
    assert owner_of(written) == 0 and trace_json(str(written))["trace_id"] == ok["traceId"]

    # Nothing outside the user's reach was touched.
    assert site.victim.read_bytes() == VICTIM_BYTES
    assert os.listdir(site.user_dir) == [link.name]
    assert os.readlink(link) == str(site.victim)

    # Every request is in the audit trail, with who, from where and the decision.
    records = [orjson.loads(line) for line in (h.base / "audit.log").read_bytes().splitlines()]
    assert [(r["uid"], r["transport"], r["decision"], r["rule"]) for r in records] == [
        (user.uid, "legacy-rpc", "refused", "not_process_owner"),
        (user.uid, "grpc-unix", "refused", "not_process_owner"),
        (0, "grpc-unix", "refused", "unsafe_directory"),
        (0, "legacy-rpc", "accepted", ""),
    ]
    assert records[0]["user"] == user.name and records[0]["peer"].startswith("127.0.0.1:")
    assert records[1]["requester_pid"] > 0 and records[1]["request"]["pids"] == [root_pid]
    assert records[3]["processes"] == [
        {"pid": root_pid, "host_pid": root_pid, "uid": 0, "output_path": str(written)}
    ]
    # Over gRPC each user sees their own records; root sees all.
    r = await site.user_cli("audit", "--json")
    mine = orjson.loads(r.stdout)["records"]
    assert [(x["seq"], x["uid"]) for x in mine] == [(1, user.uid), (2, user.uid)]


@pytest.mark.usefixtures("torch_ready")
async def test_user_traces_own_trainer_on_every_entry_point(site: Site) -> None:
    h, user = site.h, site.user
    pid = await registered(site, site.spawn_user_trainer())
    [t] = h.service.list_trainers()
    assert t.uid == user.uid and t.host_pid == pid
    # bpfdyno gputrace --wait (gRPC through the front) into the user's own directory.
    r = await site.user_cli(
        "gputrace", "--pids", str(pid), "--iterations", "2", "--wait", "--timeout", "60",
        "--log-file", str(site.user_dir / "g.json"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    written = site.user_dir / f"g_{pid}.json"
    assert "written" in r.stdout and str(written) in r.stdout
    assert owner_of(written) == user.uid
    await idle(site, pid)
    # The dyno CLI's frames from the user.
    reply = await site.user_frame(dyno_gputrace_bytes(str(site.user_dir / "d.json")))
    assert reply["activityProfilersTriggered"] == [pid], reply
    view = await h.wait_done(str(reply["traceId"]), timeout=60)
    assert view.processes[0].state is ProcState.WRITTEN, view.processes[0].reason
    assert owner_of(site.user_dir / f"d_{pid}.json") == user.uid
    await idle(site, pid)
    # Root may trace the user's trainer too, into the user's directory (its owner's).
    res = h.service.start_trace(
        TraceRequest(options=TraceSpec(log_file=str(site.user_dir / "r.json"), iterations=2))
    )
    assert [p.pid for p in res.triggered] == [pid]
    assert (await h.wait_done(res.trace_id, timeout=60)).processes[0].state is ProcState.WRITTEN
    # A directory the trainer cannot write is refused before anything is handed out.
    r = await site.user_cli("gputrace", "--log-file", str(h.trace_dir / "x.json"))
    assert r.returncode == 1 and "directory_not_writable" in r.stderr
    assert sorted(os.listdir(site.user_dir)) == [f"d_{pid}.json", f"g_{pid}.json", f"r_{pid}.json"]
    # The trainer list names the owner.
    r = await site.user_cli("trainers")
    assert r.stdout.splitlines()[1].split()[5] == user.name  # after PID and NS PID


@pytest.mark.usefixtures("torch_ready")
async def test_duration_limit_bounds_what_a_trace_can_record(site: Site) -> None:
    """Found on main: ACTIVITIES_DURATION_MSECS=2147483647 with stacks and shapes grew the
    trainer ~10 MB/s until it was killed. Now refused; a trace at the limit stops there."""
    h, user = site.h, site.user
    pid = await registered(site, site.spawn_user_trainer())
    target = site.user_dir / "m.json"

    def config(*lines: str) -> bytes:
        text = "\n".join([f"ACTIVITIES_LOG_FILE={target}", *lines])
        body = {"fn": "setKinetOnDemandRequest", "config": text, "job_id": 0, "pids": [pid]}
        return frame(body)

    stacks = ("PROFILE_WITH_STACK=true", "PROFILE_REPORT_INPUT_SHAPES=true")
    reply = await site.user_frame(config("ACTIVITIES_DURATION_MSECS=2147483647", *stacks))
    assert (reply["status"], reply["rule"]) == ("failed", "duration_too_long")
    assert "[tracing] max_duration_ms" in str(reply["error"])
    far = "PROFILE_START_TIME=" + str((int(time.time()) + 365 * 86400) * 1000)
    reply = await site.user_frame(config(far))
    assert reply["rule"] == "start_too_late"
    reply = await site.user_frame(config("ACTIVITIES_ITERATIONS=101"))
    assert reply["rule"] == "too_many_iterations"
    assert h.service.list_trainers()[0].trace_id == ""  # nothing was handed out
    # At the limit, with stacks and shapes: written, and the recording spans no more.
    reply = await site.user_frame(config(f"ACTIVITIES_DURATION_MSECS={MAX_DURATION_MS}", *stacks))
    assert reply["activityProfilersTriggered"] == [pid], reply
    view = await h.wait_done(str(reply["traceId"]), timeout=60)
    assert view.processes[0].state is ProcState.WRITTEN
    events = trace_json(str(site.user_dir / f"m_{pid}.json"))["traceEvents"]
    assert isinstance(events, list)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert any("Input Dims" in e.get("args", {}) for e in ops)  # shapes were recorded
    assert any(e.get("cat") == "python_function" for e in events)  # and stacks
    span_ms = (max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)) / 1000
    assert span_ms <= MAX_DURATION_MS + 100
    audit = h.service.audit.records(user.uid)
    assert [r.rule for r in audit] == [
        "duration_too_long",
        "start_too_late",
        "too_many_iterations",
        "",
    ]


@pytest.mark.usefixtures("torch_ready")
async def test_a_poll_claiming_another_pid_is_ignored(site: Site) -> None:
    """Found on main: a user polling as a root trainer's pid blocked its traces ("two matched
    processes would write the same file") or, with a process limit of 1, got its config."""
    h, user = site.h, site.user
    root_pid = await registered(site, h.spawn_script("linear.py"))
    sock = str(h.socket_dir)
    impostors = [
        asyncio.to_thread(
            user.run, [sys.executable, USER_CLIENT, "impostor", sock, str(root_pid), "8"]
        ),
        asyncio.to_thread(
            subprocess.run,
            user.wrap([sys.executable, USER_CLIENT, "impostor", sock, str(root_pid), "8"], True),
            capture_output=True,
            text=True,
            env=user.env(),
        ),  # the same from another pid namespace
    ]
    running = asyncio.gather(*impostors)
    async with asyncio.timeout(30):
        while h.service.false_claims[user.uid] < 4:
            await asyncio.sleep(0.1)
    assert [(t.pid, t.uid) for t in h.service.list_trainers()] == [(root_pid, 0)]
    res = h.service.start_trace(
        TraceRequest(
            pids=(root_pid,),
            process_limit=1,
            options=TraceSpec(log_file=str(h.trace_dir / "i.json"), iterations=2),
        )
    )
    assert [p.pid for p in res.triggered] == [root_pid] and res.busy == ()
    assert (await h.wait_done(res.trace_id, timeout=60)).processes[0].state is ProcState.WRITTEN
    events = trace_json(str(h.trace_dir / f"i_{root_pid}.json"))["traceEvents"]
    assert isinstance(events, list)
    assert {e.get("pid") for e in events if e.get("cat") == "cpu_op"} == {root_pid}
    for r in await running:
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["replies"] > 0 and out["configs"] == []  # answered, never given a config
    status = h.comp.statuses()[0]
    assert f"polls claiming another process's pid ignored (uid {user.uid})" in status.reason


async def test_legacy_port_cannot_be_locked_by_one_user(short_tmp: Path) -> None:
    """Found on main: 64 idle connections (closed only after 5 s each) made every other
    request fail with "too many connections"."""
    os.chmod(short_tmp, 0o755)
    h = Harness(short_tmp, overrides=[("legacy_rpc.idle_timeout_s", "3")])
    await h.comp.start()
    legacy = h.comp.legacy
    assert legacy is not None
    port = str(h.legacy_port)
    try:
        with local_user() as mallory, local_user() as bob:
            key = f"uid {mallory.uid}"
            hold = asyncio.create_task(
                asyncio.to_thread(mallory.run, [sys.executable, USER_CLIENT, "hold", port, "64"])
            )
            async with asyncio.timeout(30):  # refused ones linger briefly, then only 8 stay
                while legacy.refused_peer_limit < 56 or legacy.limits.held(key) != 8:
                    await asyncio.sleep(0.05)
            r = await asyncio.to_thread(
                bob.run,
                [
                    sys.executable,
                    USER_CLIENT,
                    "frame",
                    port,
                    b'\x12\x00\x00\x00{"fn":"getStatus"}'.hex(),
                ],
            )
            assert bytes.fromhex(json.loads(r.stdout)["reply"]) == b'\x0c\x00\x00\x00{"status":1}'
            assert legacy.limits.held(key) == 8  # bob got in while they were held
            held = json.loads((await hold).stdout)
            replies = [orjson.loads(x["reply"]) for x in held]
            refused = [x for x in replies if x.get("rule") == "peer_connection_limit"]
            idle = [x for x in replies if "nothing received within 3 s" in str(x.get("error"))]
            assert (len(refused), len(idle)) == (56, 8)
            assert f"uid {mallory.uid} already has 8 connections" in refused[0]["error"]
    finally:
        await h.comp.stop()


@pytest.mark.usefixtures("torch_ready")
async def test_trainer_in_its_own_pid_namespace(site: Site) -> None:
    """A container's trainer reports pids of its namespace; the kernel's credentials map
    them to this one, and the user traces it like any trainer of theirs."""
    h, user = site.h, site.user
    proc = site.spawn_user_trainer(job_id=4711, pid_namespace=True)
    [ns_pid] = await proc.wait_ready()
    [t] = await h.wait_trainers(lambda ts: len(ts) == 1)
    assert (t.pid, t.job_id, t.uid) == (ns_pid, 4711, user.uid)
    assert t.host_pid not in (0, ns_pid)
    r = await site.user_cli(
        "gputrace", "--job-id", "4711", "--iterations", "2", "--wait", "--timeout", "60",
        "--log-file", str(site.user_dir / "c.json"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert owner_of(site.user_dir / f"c_{ns_pid}.json") == user.uid


async def test_socket_directory_mode(site: Site) -> None:
    """The daemon's socket in a shared directory cannot be replaced by a user, an impostor
    bound there while the agent was down is removed, and an unsafe directory is refused."""
    h, user = site.h, site.user
    ours = h.socket_dir / "dynolog"
    r = await site.as_user("rm", "-f", str(ours))
    assert r.returncode != 0 and owner_of(ours) == 0
    # An impostor took the name while no agent ran.
    shared = h.base / "shared"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    impostor = subprocess.Popen(
        user.wrap([sys.executable, USER_CLIENT, "bind", str(shared)]),
        env=user.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert impostor.stdout is not None and "bound" in impostor.stdout.readline()
        assert owner_of(shared / "dynolog") == user.uid
        comp = TracingComponent(make_config(str(shared), [str(h.trace_dir)], legacy=False))
        await comp.start()
        try:
            assert comp.statuses()[0].state is PartState.OK
            assert owner_of(shared / "dynolog") == 0
            client = KinetoClient(str(shared))
            try:
                assert await client.poll([9100]) == ""  # the agent answers, not the impostor
            finally:
                client.close()
        finally:
            await comp.stop()
    finally:
        assert impostor.stdin is not None
        impostor.stdin.close()
        impostor.wait(10)
    # A directory anyone may write, without the sticky bit: the endpoint stays down.
    unsafe = h.base / "open"
    unsafe.mkdir()
    os.chmod(unsafe, 0o777)
    comp = TracingComponent(make_config(str(unsafe), [str(h.trace_dir)], legacy=False))
    await comp.start()
    try:
        ipc = comp.statuses()[0]
        assert ipc.state is PartState.UNAVAILABLE
        assert "not safe" in ipc.reason and f"chmod 1777 {unsafe}" in ipc.reason
    finally:
        await comp.stop()


async def test_grpc_over_tcp_acts_as_the_sockets_owner(site: Site) -> None:
    """gRPC on loopback TCP without TLS: a local client is its socket's owner, as on 1778."""
    h, user = site.h, site.user
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{probe.getsockname()[1]}"
    cfg = load(
        None,
        [
            ("grpc.socket", json.dumps(str(h.base / "tcp-agent.sock"))),
            ("grpc.tcp", json.dumps(addr)),
            ("grpc.insecure_tcp", "true"),
        ],
    )
    server = GrpcServer(cfg.grpc, AgentService(Daemon(cfg, [])), [servicer_factory(h.service)])
    await server.start()
    root_client = KinetoClient(str(h.socket_dir))
    try:
        await root_client.poll([9100])  # a root trainer (the test process claims a pid)
        r = await site.as_user(
            sys.executable, "-m", "bpfdyno", "gputrace", "--host", addr, "--pids", "9100",
            "--log-file", str(site.user_dir / "t.json"),
        )  # fmt: skip
        assert r.returncode == 1 and "not_process_owner" in r.stderr, r.stderr
        [record] = h.service.audit.records(user.uid)
        assert (record.transport, record.rule) == ("grpc-tcp", "not_process_owner")
        assert record.peer.startswith("127.0.0.1:")
        # Root over the same listener may.
        async with grpc.aio.insecure_channel(addr) as ch:
            resp = await pb_grpc.TracingStub(ch).StartTrace(
                pb.StartTraceRequest(pids=[9100], log_file=str(h.trace_dir / "t.json"))
            )
        assert [p.pid for p in resp.triggered] == [9100]
    finally:
        root_client.close()
        await server.stop(0)
