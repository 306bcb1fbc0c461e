"""The root agent reading files a user controls (local safety, round two): a real
unprivileged user swaps their own written trace for a link, a FIFO or a bomb, and asks the
agent for its summary. The agent reads with the file owner's rights, never through a link,
never blocks, stays within its limits, and says nothing of what it could not read.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import zlib
from pathlib import Path

import orjson
import pytest
from security_site import Site, idle, registered

from bpfdyno.analysis.tracefile import ReadLimits
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.tracing.merge import Insertion, MergeError, TraceLayout, merge_into_trace

pytestmark = [pytest.mark.root, pytest.mark.slow]

SECRET = "ROOT-ONLY-SECRET-7f3a"


def root_only_trace(path: Path) -> None:
    """A root-owned 0600 file that summarises well: its secret would show in the reply."""
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 0, "dur": 10},
            {"ph": "X", "cat": "bpfdyno.info", "name": "i", "pid": 1, "tid": 1, "ts": 0,
             "dur": 10, "args": {"tracks": [SECRET]}},
        ]
    }  # fmt: skip
    path.write_bytes(orjson.dumps(doc))
    os.chmod(path, 0o600)


async def traced_by_user(site: Site, pid: int, name: str) -> tuple[str, Path]:
    """The user traces its own trainer into its own directory: (trace id, the file)."""
    r = await site.user_cli(
        "gputrace", "--pids", str(pid), "--iterations", "2", "--wait", "--timeout", "60",
        "--log-file", str(site.user_dir / f"{name}.json"), "--kernel-tracks", "none", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return str(json.loads(r.stdout)["request"]["trace_id"]), site.user_dir / f"{name}_{pid}.json"


async def summary_as_user(site: Site, trace_id: str) -> dict[str, object]:
    r = await site.user_cli("trace-summary", "--trace-id", trace_id, "--json")
    assert SECRET not in r.stdout + r.stderr
    [p] = json.loads(r.stdout)["processes"]
    return dict(p)


@pytest.mark.usefixtures("torch_ready")
async def test_a_summary_never_reads_through_what_the_user_swapped_in(site: Site) -> None:
    h, user = site.h, site.user
    pid = await registered(site, site.spawn_user_trainer())
    trace_id, written = await traced_by_user(site, pid, "s")
    summary = await summary_as_user(site, trace_id)
    assert summary["error"] == "" and summary["pid"] == pid  # the user's own file reads well
    await idle(site, pid)

    secret = h.base / "root-only.json"
    root_only_trace(secret)
    errors = {}
    for target in (str(secret), "/etc/shadow", str(h.base / "missing.json")):
        r = await site.as_user("sh", "-c", f'rm -f "{written}" && ln -s "{target}" "{written}"')
        assert r.returncode == 0, r.stderr
        errors[target] = (await summary_as_user(site, trace_id))["error"]
    # The same answer whatever the link points to: no content, no existence oracle.
    assert set(errors.values()) == {f"{written} is a symbolic link, not a trace file"}

    # A FIFO: refused at once; many asks at the same time park no thread of the agent (each
    # used to wait in open() for a writer, and 8 took every thread of the agent's pool).
    r = await site.as_user("sh", "-c", f'rm -f "{written}" && mkfifo "{written}"')
    assert r.returncode == 0, r.stderr
    fifo = f"{written} is not a regular file, not a trace file"
    assert (await summary_as_user(site, trace_id))["error"] == fifo
    t0 = time.monotonic()
    many = await asyncio.gather(
        *(site.stub().GetTraceSummary(pb.GetTraceRequest(trace_id=trace_id)) for _ in range(32))
    )
    assert {m.processes[0].error for m in many} == {fifo}
    assert time.monotonic() - t0 < 30
    # A hard link to the root-only file cannot be made (protected_hardlinks); if the kernel
    # allowed it, reading as the user would still be refused.
    r = await site.as_user("sh", "-c", f'rm -f "{written}" && ln "{secret}" "{written}"')
    if r.returncode == 0:
        assert "Permission denied" in (await summary_as_user(site, trace_id))["error"]
    else:
        assert "Operation not permitted" in r.stderr

    # Meanwhile root's own traces summarise as ever.
    root_pid = await registered(site, h.spawn_script("linear.py"))
    res = await site.stub().StartTrace(
        pb.StartTraceRequest(pids=[root_pid], log_file=str(h.trace_dir / "root.json"), iterations=2)
    )
    await h.wait_done(res.trace_id, timeout=60)
    ok = await site.stub().GetTraceSummary(pb.GetTraceRequest(trace_id=res.trace_id))
    assert ok.processes[0].error == "" and ok.processes[0].pid == root_pid
    assert user.uid != 0


def gzip_of(parts: list[bytes]) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(z.compress(p) for p in parts) + z.flush()


@pytest.mark.usefixtures("torch_ready")
async def test_a_bomb_in_the_users_file_costs_the_agent_a_bounded_amount(site: Site) -> None:
    """A 400 KB gzip file holding one 400 MiB JSON string; one inflating to 128 MiB of
    whitespace (the agent's JSON limit lowered to 64 MiB for the test): each refused at its
    limit with an error naming it, quickly."""
    pid = await registered(site, site.spawn_user_trainer())
    trace_id, written = await traced_by_user(site, pid, "b")
    site.h.service.read_limits = ReadLimits(max_json_bytes=64 << 20)
    mib, spaces = b"a" * (1 << 20), b" " * (1 << 20)
    bombs = [
        (
            gzip_of([b'{"traceEvents": [{"cat": "cpu_op", "name": "', *[mib] * 400]),
            "is longer than 16777216 bytes",
        ),
        (
            gzip_of([b'{"traceEvents": [{"cat": "cpu_op", "ts": 1},', *[spaces] * 128, b"{}]}"]),
            "holds more than 67108864 bytes of JSON",
        ),
    ]
    for bomb, limit in bombs:
        assert len(bomb) < 1_000_000
        staged = site.user_dir / "staged"
        staged.write_bytes(bomb)
        os.chown(staged, site.user.uid, site.user.gid)
        os.replace(staged, written)
        error = str((await summary_as_user(site, trace_id))["error"])
        assert limit in error and "[tracing] max_trace_json_bytes" in error, error
        # What it costs the agent is bounded by the limits, not by the file: at most 16 MiB
        # (the event limit) or 64 MiB (the JSON limit) read, twice, then refused.
        t0 = time.monotonic()
        reply = await site.stub().GetTraceSummary(pb.GetTraceRequest(trace_id=trace_id))
        assert limit in reply.processes[0].error
        assert time.monotonic() - t0 < 60


def test_the_merge_refuses_a_fifo_at_once_and_never_reopens_by_path(tmp_path: Path) -> None:
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(MergeError, match="is not a regular file"):
        merge_into_trace(str(fifo), lambda _: Insertion([b"{}"]))
    assert time.monotonic() - t0 < 5
    # A file swapped in (renamed over the name) while the merge runs is never read or kept.
    path = tmp_path / "u.json"
    trace = b'{"traceEvents": [{"ph": "X", "cat": "Trace", "name": "x", "ts": 1, "dur": 2}]}'
    path.write_bytes(trace)
    other = tmp_path / "other"
    other.write_bytes(b'{"traceEvents": []}')

    def swap(_: TraceLayout) -> Insertion:
        os.replace(other, path)
        return Insertion([b'{"ph": "i"}'])

    with pytest.raises(MergeError, match="changed while the kernel tracks were merged"):
        merge_into_trace(str(path), swap)
    assert path.read_bytes() == b'{"traceEvents": []}'
    assert sorted(os.listdir(tmp_path)) == ["t.json", "u.json"]
