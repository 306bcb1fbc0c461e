"""A trainer stalled when its warm-up was due still writes the trace it was asked for.

Kineto (PyTorch 2.13) starts a duration trace with no PROFILE_START_TIME (dyno's default) 7 s
after it reads the config, and its profiler thread must begin the 5 s warm-up at a tick that
comes at most 1 s late. A later tick drops the config, and only the trainer's log says so
("Not starting tracing - insufficient time for warmup"). A trainer stalled or starved across
that tick lost its trace, and the agent reported "never started tracing": it happened to this
module's user-trace test on a loaded CI machine. Now the agent hands the config out again.

The test causes the drop with a real PyTorch trainer and dyno's exact bytes: it stops the
trainer (SIGSTOP) from 0.3 s after the config went out until 3.3 s, across the tick due 1-2 s
after the config is read. The trainer reads its reply within 0.1 s of its poll; should it
read it one poll late, the stop delays the reading instead and nothing is dropped, so the
test tries again, up to three times, and then needs a drop to have happened.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest
from tracing_harness import Harness, dyno_gputrace_bytes, legacy_call, trace_json, unframe

from bpfdyno.tracing.traces import KernelTrackState, ProcState, TrainerState

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]

#: What Kineto logs when it drops a config at its warm-up tick (too late, or past the start).
DROPPED = "Not starting tracing"
STOP_AFTER_S, STOP_FOR_S = 0.3, 3.0
ATTEMPTS = 3


async def test_a_config_dropped_at_a_stalled_warm_up_is_handed_out_again(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bpfdyno.tracing.polls")
    async with Harness(short_tmp, capture=True) as h:
        proc = h.spawn_script("linear.py")
        [pid] = await proc.wait_ready()
        await h.wait_trainers(lambda ts: any(t.pid == pid for t in ts))
        drops_before = 0
        for attempt in range(ATTEMPTS):
            name = f"a{attempt}.json"
            reply = unframe(
                await legacy_call(h.legacy_port, dyno_gputrace_bytes(str(h.trace_dir / name)))
            )
            assert reply["activityProfilersTriggered"] == [pid], reply
            trace_id = str(reply["traceId"])
            async with asyncio.timeout(30):
                while h.service.get_trace(trace_id).processes[0].state is ProcState.PENDING:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(STOP_AFTER_S)
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(STOP_FOR_S)
            finally:
                os.kill(pid, signal.SIGCONT)
            view = await h.wait_done(trace_id, timeout=90)
            [part] = view.processes
            log = proc.log_tail(10**7)
            drops = log.count(DROPPED) - drops_before
            drops_before += drops
            assert part.state is ProcState.WRITTEN, f"{part.reason}\n{log[-3000:]}"
            # Its kernel tracks were recorded from the request on, across the drop.
            assert part.kernel_tracks.state is KernelTrackState.MERGED, part.kernel_tracks
            delivered = [
                r.getMessage()
                for r in caplog.records
                if r.getMessage() == f"trace {trace_id}: config delivered to pid {pid}"
            ]
            # Handed out once more for each config Kineto dropped, and no more.
            assert len(delivered) == drops + 1, (delivered, log[-3000:])
            events = trace_json(str(h.trace_dir / f"a{attempt}_{pid}.json"))["traceEvents"]
            assert isinstance(events, list)
            assert any(e.get("cat") == "cpu_op" for e in events)
            if drops:
                assert drops == 1  # the trainer ran on unstopped after the first
                assert "insufficient time for warmup" in log or "in the past" in log
                break
            await h.wait_trainers(
                lambda ts: any(t.pid == pid and t.state is TrainerState.IDLE for t in ts)
            )
        else:
            pytest.fail(
                f"the stop never made Kineto drop the config in {ATTEMPTS} attempts (the "
                f"trainer read its replies one poll late each time?):\n{proc.log_tail()}"
            )
