"""The daemon core: scheduling, error isolation, back-off, streaming, sd_notify."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from bpfdyno.app.daemon import Daemon, SharedWorker, notify_systemd
from bpfdyno.core.config import load
from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.metrics import MetricKind, MetricTable, Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.core.store import SharedResults
from bpfdyno.services.agent import AgentService, Snapshot
from bpfdyno.sources.base import Collector, CollectorUnavailable

REG = MetricTable("t")
TICKS = REG.declare("test_ticks_total", MetricKind.COUNTER, "1", "Rounds collected.")


class Counting(Collector):
    """Emits its round number; fails on the rounds listed in ``fail_on``."""

    def __init__(self, name: str, fail_on: Sequence[int] = ()) -> None:
        self.name = name
        self.fail_on = set(fail_on)
        self.rounds = 0
        self.times: list[float] = []
        self.closed = False
        self.threads: set[str] = set()

    def collect(self) -> Sequence[Sample]:
        self.rounds += 1
        self.times.append(time.monotonic())
        self.threads.add(threading.current_thread().name)
        if self.rounds in self.fail_on:
            raise OSError(f"boom {self.name}")
        return [sample(TICKS, self.rounds)]

    def close(self) -> None:
        self.closed = True


class Unavailable(Collector):
    name = "nogpu"

    def start(self) -> None:
        raise CollectorUnavailable("no GPU found — install the NVIDIA driver")

    def collect(self) -> Sequence[Sample]:
        raise AssertionError("never called")


class Hanging(Collector):
    name = "hang"

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self) -> Sequence[Sample]:
        self.release.wait(5)
        return []


def make_daemon(*collectors: Collector, interval: float = 0.1) -> Daemon:
    cfg = load(None, [("daemon.interval_s", str(interval)), ("daemon.history_s", "60")])
    return Daemon(cfg, collectors)


async def test_collects_on_deadlines_on_own_threads() -> None:
    a, b = Counting("a"), Counting("b")
    d = make_daemon(a, b)
    await d.start()
    await asyncio.sleep(0.55)
    await d.stop()
    assert 5 <= a.rounds <= 7
    gaps = [t2 - t1 for t1, t2 in zip(a.times, a.times[1:], strict=False)]
    assert all(0.07 < g < 0.2 for g in gaps), gaps
    assert a.threads == {"collector-a_0"} and b.threads == {"collector-b_0"}
    assert a.closed and b.closed
    st = {s.name: s for s in d.statuses()}
    assert st["a"].state is PartState.STOPPED
    assert st["a"].collections == a.rounds
    latest = d.store.latest(["test_ticks_total"])
    assert latest and latest[0].points[0].value >= 5


async def test_errors_are_isolated_counted_and_backed_off(caplog: pytest.LogCaptureFixture) -> None:
    bad = Counting("bad", fail_on=range(1, 100))
    good = Counting("good")
    d = make_daemon(bad, good)
    await d.start()
    await asyncio.sleep(1.0)
    st = {s.name: s for s in d.statuses()}
    await d.stop()
    # back-off doubles: fails at ~0, 0.2, 0.6 (0.1*2, 0.1*4) -> only 3 attempts in 1 s
    assert bad.rounds == 3
    assert st["bad"].state is PartState.DEGRADED
    assert st["bad"].errors == 3
    assert st["bad"].reason == "OSError: boom bad"
    assert good.rounds >= 8
    assert st["good"].state is PartState.OK
    logged = [r for r in caplog.records if "boom bad" in r.getMessage()]
    assert len(logged) == 1  # logged once per distinct error


async def test_recovers_after_transient_error() -> None:
    flaky = Counting("flaky", fail_on=[2])
    d = make_daemon(flaky)
    await d.start()
    await asyncio.sleep(0.7)
    st = d.statuses()[0]
    await d.stop()
    assert st.errors == 1
    assert st.state is PartState.OK
    assert st.reason == ""


async def test_unavailable_collector_is_reported_and_others_run() -> None:
    ok = Counting("ok")
    d = make_daemon(Unavailable(), ok)
    await d.start()
    await asyncio.sleep(0.25)
    await d.stop()
    st = {s.name: s for s in d.statuses()}
    assert st["nogpu"].state is PartState.UNAVAILABLE
    assert st["nogpu"].reason == "no GPU found — install the NVIDIA driver"
    assert ok.rounds >= 2


async def test_a_hung_collector_does_not_delay_others() -> None:
    hang, ok = Hanging(), Counting("ok")
    d = make_daemon(hang, ok)
    await d.start()
    await asyncio.sleep(0.5)
    hang.release.set()
    await d.stop()
    assert ok.rounds >= 4


async def test_stream_yields_rounds_and_validates() -> None:
    c = Counting("a")
    d = make_daemon(c)
    svc = AgentService(d)
    await d.start()
    got = []
    async for snap in svc.stream(["test_*"]):
        got.append((snap.collector, snap.series[0].points[0].value))
        if len(got) == 3:
            break
    with pytest.raises(InvalidArgument, match="unknown collector"):
        async for _ in svc.stream(collectors=["nope"]):
            pass
    await d.stop()
    assert [g[0] for g in got] == ["a", "a", "a"]
    assert [g[1] for g in got] == sorted(g[1] for g in got)
    assert d.publisher._subscribers == set()


async def test_stream_subscribers_with_one_filter_share_each_snapshot() -> None:
    """Filtering (and converting) a round is done once for all subscribers of one filter."""
    d = make_daemon(Counting("a"))
    svc = AgentService(d)
    await d.start()

    async def first_three(names: list[str]) -> list[Snapshot]:
        out: list[Snapshot] = []
        async for snap in svc.stream(names):
            out.append(snap)
            if len(out) == 3:
                return out
        return out

    a, b, other = await asyncio.gather(
        first_three(["test_*"]), first_three(["test_*"]), first_three(["test_ticks_total"])
    )
    await d.stop()
    assert [x.ts for x in a] == [x.ts for x in b] == [x.ts for x in other]
    assert all(x is y for x, y in zip(a, b, strict=True))
    assert all(x is not y and x.series == y.series for x, y in zip(a, other, strict=True))


def test_shared_results_compute_once_per_object_and_key() -> None:
    cache: SharedResults[str, int] = SharedResults(size=2)
    calls: list[str] = []

    def compute(tag: str) -> int:
        calls.append(tag)
        return len(calls)

    x, y, z = object(), object(), object()
    assert cache.get(x, "k", lambda: compute("x")) == 1
    assert cache.get(x, "k", lambda: compute("x again")) == 1
    assert cache.get(x, "j", lambda: compute("x j")) == 2
    assert cache.get(y, "k", lambda: compute("y")) == 3  # evicts (x, "k"): size 2
    assert cache.get(x, "k", lambda: compute("x evicted")) == 4
    assert calls == ["x", "x j", "y", "x evicted"]
    assert cache.get(z, "k", lambda: 99) == 99


async def test_window_arguments_are_checked() -> None:
    d = make_daemon(Counting("a"))
    svc = AgentService(d)
    with pytest.raises(InvalidArgument, match="after its end"):
        svc.window([], 200.0, 100.0)
    with pytest.raises(InvalidArgument, match="bad metric name pattern"):
        svc.snapshot(["has space"])


def test_notify_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert notify_systemd("READY=1") is True
        assert s.recv(100) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert notify_systemd("READY=1") is False


class PartlyLost(Counting):
    """Collects fine but reports part of its source gone on rounds 2-3."""

    def health(self) -> tuple[PartState, str] | None:
        if self.rounds in (2, 3):
            return PartState.DEGRADED, "GPU 1 lost: GPU_IS_LOST"
        return None


async def test_collector_health_reports_degraded_while_collecting() -> None:
    c = PartlyLost("gpu")
    d = make_daemon(c)
    await d.start()
    states = []
    for _ in range(6):
        states.append((d.statuses()[0].state, d.statuses()[0].reason))
        await asyncio.sleep(0.1)
    await d.stop()
    assert (PartState.DEGRADED, "GPU 1 lost: GPU_IS_LOST") in states
    assert states[-1] == (PartState.OK, "")
    assert d.statuses()[0].errors == 0


class Quick(Counting):
    """A collector that never blocks: it shares the daemon's worker thread."""

    may_block = False


async def test_collectors_that_never_block_share_one_thread_and_one_batch() -> None:
    a, b = Quick("a"), Quick("b")
    own = Counting("own")
    batches: list[tuple[str, ...]] = []
    worker_run = SharedWorker._flush

    def recording(self: SharedWorker) -> None:
        batches.append(tuple(fn.__self__.name for fn, _ in self._batch))  # type: ignore[attr-defined]
        worker_run(self)

    d = make_daemon(a, b, own)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SharedWorker, "_flush", recording)
        await d.start()
        await asyncio.sleep(0.55)
        await d.stop()
    assert a.threads == b.threads == {"collectors-0.1s_0"}
    assert own.threads == {"collector-own_0"}
    # Their rounds fall due together: one batch each round, both in it.
    assert batches and all(batch == ("a", "b") for batch in batches), batches
    assert a.rounds == b.rounds == len(batches)
    assert 5 <= a.rounds <= 7
    st = {s.name: s for s in d.statuses()}
    assert st["a"].collections == a.rounds and st["a"].state is PartState.STOPPED


async def test_a_failing_collector_in_a_batch_costs_the_others_nothing() -> None:
    bad = Quick("bad", fail_on=range(1, 100))
    good = Quick("good")
    d = make_daemon(bad, good)
    await d.start()
    await asyncio.sleep(1.0)
    st = {s.name: s for s in d.statuses()}
    await d.stop()
    assert bad.rounds == 3  # backed off as on a thread of its own
    assert st["bad"].state is PartState.DEGRADED and st["bad"].reason == "OSError: boom bad"
    assert good.rounds >= 8
    assert st["good"].state is PartState.OK


async def test_a_hung_collector_does_not_delay_the_shared_thread() -> None:
    hang, ok = Hanging(), Quick("ok")
    d = make_daemon(hang, ok)
    await d.start()
    await asyncio.sleep(0.5)
    hang.release.set()
    await d.stop()
    assert ok.rounds >= 4
