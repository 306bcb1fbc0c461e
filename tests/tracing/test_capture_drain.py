"""The capture drains its ring buffers sooner while they fill (`FAST_DRAIN_INTERVAL_S`): a
traced process switching threads a few thousand times a second overflows a small ring
between two drains 0.1 s apart, and not when the drains come every 10 ms.

Real BPF, a real process, a 4-page ring buffer (about 136 off-CPU records): its two
threads sleep 200 us at a time for 2 s (about 6,000 off-CPU intervals a second here, 600
between two slow drains). The same process is traced with the faster drains turned
off, then on; each drain's time is noted (the manager's own drain, called through)."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import time

import pytest
from test_capture_bpf import manager_with, record

from bpfdyno.tracing.capture import manager as capture_manager
from bpfdyno.tracing.capture.records import KernelTrackRequest, OffCpu, Track

pytestmark = pytest.mark.root

SLEEPERS = r"""
import sys, threading, time
def sleep_often(until):
    while time.monotonic() < until:
        time.sleep(0.0002)
print("ready", flush=True)
for line in sys.stdin:
    until = time.monotonic() + 2.0
    ts = [threading.Thread(target=sleep_often, args=(until,)) for _ in range(2)]
    for t in ts: t.start()
    for t in ts: t.join()
    print("done", flush=True)
"""


def traced(p: subprocess.Popen[str], drains: list[float]) -> tuple[int, int, float]:
    """Trace ``p``'s 2 s of sleeping: (off-CPU records kept, lost to a full ring, the median
    time between two drains while it slept); ``drains``: where the drains note their time."""
    m = manager_with(("capture.ringbuf_pages", "4"))
    window = [0.0, 0.0]

    def work() -> None:
        assert p.stdin is not None and p.stdout is not None
        window[0] = time.monotonic()
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline() == "done\n"
        window[1] = time.monotonic()

    try:
        cap = record(m, p.pid, KernelTrackRequest(frozenset({Track.SCHED})), work)
    finally:
        m.stop()
    kept = sum(1 for r in cap.records if isinstance(r, OffCpu))
    during = [t for t in drains if window[0] <= t <= window[1]]
    gap = statistics.median(b - a for a, b in itertools.pairwise(during))
    return kept, cap.stats[Track.SCHED].lost_kernel, gap


def test_a_filling_ring_buffer_is_drained_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    drains: list[float] = []
    drain = capture_manager.CaptureManager._drain

    def noted(self: capture_manager.CaptureManager) -> None:
        drains.append(time.monotonic())
        drain(self)

    monkeypatch.setattr(capture_manager.CaptureManager, "_drain", noted)
    p = subprocess.Popen([sys.executable, "-c", SLEEPERS], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        with monkeypatch.context() as slow:
            slow.setattr(capture_manager, "FAST_DRAIN_FILL", 2.0)  # never: every 0.1 s
            kept_slow, lost_slow, gap_slow = traced(p, drains)
        kept, lost, gap = traced(p, drains)
    finally:
        p.kill()
        p.wait()
    share_slow, share = lost_slow / (kept_slow + lost_slow), lost / (kept + lost)
    print(
        f"drains every {gap_slow * 1e3:.1f} ms: {kept_slow} kept, {lost_slow} lost; "
        f"sooner, every {gap * 1e3:.1f} ms: {kept} kept, {lost} lost"
    )
    # The drains come every 0.1 s, and sooner (every 10 ms) while the ring fills: what this
    # feature does, whatever the machine's speed (5x slack for a loaded one).
    assert gap_slow >= 0.095, gap_slow
    assert gap <= 0.05, gap
    # Every 0.1 s the ring overflows between any two drains (on a machine three times as
    # slow, the sleepers' 200 a drain still lose a third); sooner, only before the first
    # drain that found it filling, and whenever the drain thread could not run for a while.
    # Measured: 75-80 % lost slow, 4.5-6 % sooner (7.4 % beside two busy processes); on
    # one CI machine 30 % sooner: its drain thread, contending with the two sleepers for
    # two vCPUs the hypervisor also took time from, did not run often enough. So the loss
    # sooner is compared with the loss at 0.1 s on the same machine, in the same minute.
    assert share_slow >= 0.3, (kept_slow, lost_slow)
    assert share <= 0.5 * share_slow, (kept, lost, kept_slow, lost_slow)
