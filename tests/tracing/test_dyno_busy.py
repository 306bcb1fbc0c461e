"""A dyno request for a process that is busy is not dropped: it waits and is traced after.

dyno prints "Matched 1 processes" and exits 0 whatever the reply says, so a request answered
``activityProfilersBusy: 1`` and dropped gave its user no file and no error. Now (as
dynolog does) it waits until the process is free — its current trace written and the kernel
tracks merged — and then starts, under the same rules. The test speaks dyno's exact bytes
(`tracing_harness.dyno_gputrace_bytes`, what dyno 0.6's CLI sends) to a real agent
component with the kernel-track capture, and a real PyTorch trainer.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tracing_harness import (
    Harness,
    dyno_gputrace_bytes,
    grpc_api,
    legacy_call,
    run_cli,
    unframe,
)

from bpfdyno.server.tracing import servicer_factory
from bpfdyno.tracing.traces import ProcState

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]


async def _written(path: Path, timeout: float) -> dict[str, object]:
    """The trace at ``path`` once Kineto (and the merge) wrote it."""
    async with asyncio.timeout(timeout):
        while True:
            if path.exists():
                try:
                    trace: dict[str, object] = json.loads(path.read_text())
                    return trace
                except ValueError:
                    pass  # still being written or renamed
            await asyncio.sleep(0.2)


async def test_a_request_for_a_busy_process_waits_and_is_traced_after(short_tmp: Path) -> None:
    async with Harness(short_tmp, capture=True) as h:
        proc = h.spawn_script("linear.py")
        [pid] = await proc.wait_ready()
        await h.wait_trainers(lambda ts: any(t.pid == pid for t in ts))
        first, second, third = (str(h.trace_dir / f"{n}.json") for n in ("a", "b", "c"))

        a = unframe(await legacy_call(h.legacy_port, dyno_gputrace_bytes(first)))
        assert a["activityProfilersTriggered"] == [pid], a
        # The process holds a's config: b waits for it instead of being dropped.
        b = unframe(await legacy_call(h.legacy_port, dyno_gputrace_bytes(second)))
        assert {k: b[k] for k in ("activityProfilersBusy", "activityProfilersTriggered")} == {
            "activityProfilersBusy": 0,
            "activityProfilersTriggered": [pid],
        }, b
        assert b["traceFiles"] == {str(pid): str(h.trace_dir / f"b_{pid}.json")}
        assert list(b["queued"]) == [str(pid)]  # type: ignore[call-overload]
        assert "its trace starts as soon as it is free" in b["queued"][str(pid)]  # type: ignore[index]
        assert "status" not in b
        # A third while b waits: it cannot wait too, and says so (not a silent busy).
        c = unframe(await legacy_call(h.legacy_port, dyno_gputrace_bytes(third)))
        assert c["status"] == "failed"
        assert c["activityProfilersBusy"] == 1 and c["activityProfilersTriggered"] == []
        assert "a request for it already waits" in str(c["error"])

        view = await h.wait_done(str(a["traceId"]), timeout=90)
        assert [p.state for p in view.processes] == [ProcState.WRITTEN]
        b_trace = await _written(h.trace_dir / f"b_{pid}.json", timeout=90)
        assert b_trace["traceEvents"]
        assert b_trace["trace_id"] != a["traceId"]  # a trace of its own, by the queue
        assert not (h.trace_dir / f"c_{pid}.json").exists()
        legacy = h.comp.legacy
        assert legacy is not None
        assert legacy.handler.queue.started == 1 and legacy.handler.queue.waiting == 0
        assert "1 started" in legacy.status().reason


async def test_a_request_that_would_overwrite_the_busy_trace_fails_at_once(
    short_tmp: Path,
) -> None:
    """The same --log-file again (a dyno habit): the waiting trace would overwrite the one
    being written, so the reply is a failure that says so, not a busy count."""
    async with Harness(short_tmp) as h:
        proc = h.spawn_script("linear.py")
        [pid] = await proc.wait_ready()
        await h.wait_trainers(lambda ts: any(t.pid == pid for t in ts))
        log_file = str(h.trace_dir / "same.json")
        first = unframe(await legacy_call(h.legacy_port, dyno_gputrace_bytes(log_file)))
        assert first["activityProfilersTriggered"] == [pid]
        again = unframe(await legacy_call(h.legacy_port, dyno_gputrace_bytes(log_file)))
        assert again["status"] == "failed"
        assert again["activityProfilersBusy"] == 1
        assert f"same_{pid}.json exists or is being written by its current trace" in str(
            again["error"]
        )
        assert h.comp.legacy is not None and h.comp.legacy.handler.queue.waiting == 0
        # bpfdyno gputrace on the busy process: nothing will be written, and the exit
        # status says so too.
        sock = str(h.base / "grpc.sock")
        async with grpc_api(sock, servicer_factory(h.service)):
            g = str(h.trace_dir / "g.json")
            rc, out, err = await run_cli(
                "gputrace", "--host", sock, "--pids", str(pid), "--log-file", g, "--wait"
            )
        assert rc == 1, out + err
        assert f"Busy (not traced):\n  pid {pid:>8}" in out
        assert "nothing was traced: every matched process is busy" in err
