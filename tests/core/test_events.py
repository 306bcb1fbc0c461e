"""The flight recorder: age and memory caps with exact eviction counts, queries, and the
thread -> asyncio hand-off of subscriptions (including a lagging reader)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bpfdyno.core.events import (
    ATTR_BASE_BYTES,
    EVENT_BASE_BYTES,
    KIND_LOST,
    FlightRecorder,
    KernelEvent,
    MonotonicClock,
    estimate_event_bytes,
)

SEC = 1_000_000_000


class FakeWallClock:
    """The recorder's injectable wall clock, moved by hand."""

    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


def ev(ts_ns: int, kind: str = "tcp_retransmit", pid: int = 1) -> KernelEvent:
    return KernelEvent(ts_ns, kind, pid, pid, "proc", {"dport": 9000})


def test_size_estimate_is_deterministic() -> None:
    e = KernelEvent(1, "exec", 10, 10, "python3", {"filename": "/usr/bin/python3", "n": 2})
    expected = (
        EVENT_BASE_BYTES
        + len("exec")
        + len("python3")
        + (ATTR_BASE_BYTES + len("filename") + len("/usr/bin/python3"))
        + (ATTR_BASE_BYTES + len("n"))
    )
    assert estimate_event_bytes(e) == expected


def test_age_cap_evicts_exactly_the_old_events() -> None:
    clock = FakeWallClock(1000 * SEC)
    rec = FlightRecorder(max_age_s=10, max_bytes=10**9, clock_ns=clock)
    # 20 events, one per second, the newest at "now".
    rec.add(ev((981 + i) * SEC) for i in range(20))
    st = rec.stats()
    # Cutoff is now - 10 s = 990 s: events at 981..989 (9 of them) are older.
    assert (st.events, st.evicted_age, st.evicted_memory, st.added) == (11, 9, 0, 20)
    clock.now_ns += 5 * SEC  # cutoff 995 s: 990..994 go
    assert rec.stats().evicted_age == 14
    assert [e.ts_ns // SEC for e in rec.since(0)] == list(range(995, 1001))


def test_memory_cap_evicts_oldest_first_with_exact_count() -> None:
    one = estimate_event_bytes(ev(0))
    clock = FakeWallClock(100 * SEC)
    rec = FlightRecorder(max_age_s=3600, max_bytes=one * 7 + one // 2, clock_ns=clock)
    rec.add(ev(SEC * i) for i in range(1, 31))
    st = rec.stats()
    assert (st.events, st.evicted_memory, st.evicted_age) == (7, 23, 0)
    assert st.bytes == 7 * one
    assert [e.ts_ns // SEC for e in rec.since(0)] == list(range(24, 31))
    assert st.oldest_ts_ns == 24 * SEC


def test_since_filters_by_time_and_kind_and_sorts() -> None:
    clock = FakeWallClock(50 * SEC)
    rec = FlightRecorder(max_age_s=60, max_bytes=10**9, clock_ns=clock)
    # Two collectors' batches interleave out of timestamp order.
    rec.add([ev(10 * SEC, "exec"), ev(30 * SEC, "tcp_close")])
    rec.add([ev(20 * SEC, "tcp_close"), ev(40 * SEC, "exit")])
    assert [e.ts_ns // SEC for e in rec.since(0)] == [10, 20, 30, 40]
    assert [e.ts_ns // SEC for e in rec.since(20 * SEC)] == [20, 30, 40]
    assert [e.kind for e in rec.since(0, {"tcp_close"})] == ["tcp_close", "tcp_close"]
    assert rec.since(41 * SEC) == []


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_age_s must be positive"):
        FlightRecorder(0, 100)
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        FlightRecorder(1, 0)


def test_add_is_thread_safe() -> None:
    rec = FlightRecorder(max_age_s=3600, max_bytes=10**9)
    now = time.time_ns()

    def producer(base: int) -> None:
        for i in range(500):
            rec.add([ev(now + base + i, pid=base)])

    threads = [threading.Thread(target=producer, args=(t * 1000,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = rec.stats()
    assert st.added == st.events == 2000
    assert st.bytes == 2000 * estimate_event_bytes(ev(0))


def test_monotonic_clock_maps_now_to_now() -> None:
    clock = MonotonicClock()
    wall = clock.to_wall_ns(time.monotonic_ns())
    assert abs(wall - time.time_ns()) < 5_000_000  # 5 ms: two clock reads apart


async def test_subscriber_gets_events_added_from_a_worker_thread() -> None:
    rec = FlightRecorder(max_age_s=3600, max_bytes=10**9)
    now = time.time_ns()
    async with rec.subscribe(kinds={"tcp_retransmit"}) as sub:
        loop_thread = threading.get_ident()
        seen_threads: list[int] = []

        def worker() -> None:
            seen_threads.append(threading.get_ident())
            rec.add([ev(now + 1), ev(now + 2, "exec"), ev(now + 3)])

        t = threading.Thread(target=worker)
        t.start()
        got = [await asyncio.wait_for(sub.__anext__(), 5) for _ in range(2)]
        t.join()
    assert seen_threads and seen_threads[0] != loop_thread
    assert [e.ts_ns - now for e in got] == [1, 3]
    assert rec.stats().subscribers == 0


async def test_lagging_subscriber_drops_oldest_and_is_told() -> None:
    rec = FlightRecorder(max_age_s=3600, max_bytes=10**9)
    now = time.time_ns()
    sub = rec.subscribe(queue_size=4)
    t = threading.Thread(target=lambda: rec.add(ev(now + i) for i in range(10)))
    t.start()
    t.join()
    first = await asyncio.wait_for(sub.__anext__(), 5)
    assert first.kind == KIND_LOST
    assert first.attrs == {"count": 6}
    rest = [await asyncio.wait_for(sub.__anext__(), 5) for _ in range(4)]
    assert [e.ts_ns - now for e in rest] == [6, 7, 8, 9]
    assert sub.dropped == 6
    sub.close()
    assert rec.stats().subscriber_drops == 6
    with pytest.raises(StopAsyncIteration):
        await sub.__anext__()


async def test_close_ends_a_waiting_reader() -> None:
    rec = FlightRecorder(max_age_s=3600, max_bytes=10**9)
    sub = rec.subscribe()

    async def read_all() -> list[KernelEvent]:
        return [e async for e in sub]

    task = asyncio.create_task(read_all())
    await asyncio.sleep(0.05)
    sub.close()
    assert await asyncio.wait_for(task, 5) == []
