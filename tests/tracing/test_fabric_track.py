"""The fabric track from its sampler to the trace events: a real process whose environment
names its RDMA device, an mlx5 sysfs tree (there is no RDMA hardware here) whose counters the
test advances between readings, the interrupt collector's BPF program for interrupt time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "fabric"))
from mlx5_sysfs import SysfsTree, dgx_like

from bpfdyno.sources.irq.collector import SOFTIRQS, CpuInterrupts, IrqCollector
from bpfdyno.tracing.capture.fabric import FabricSampler, _interrupt_time
from bpfdyno.tracing.capture.records import (
    FabricDelta,
    FabricEvent,
    KernelTrackRequest,
    ProcessCapture,
    Track,
)
from bpfdyno.tracing.capture.tracks import Window, build_tracks

pytestmark = pytest.mark.root

KEY = ("trace", 1)


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return dgx_like(tmp_path / "root")


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    """A process that names mlx5_1 for NCCL and keeps a thread busy on CPU 0."""
    env = {**os.environ, "NCCL_IB_HCA": "mlx5_1"}
    code = "import os\nos.sched_setaffinity(0, {0})\nprint('ready', flush=True)\nwhile True: pass"
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def runtime(pid: int) -> int:
    """The on-CPU ns of process ``pid``'s main thread, as the kernel's books have it."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def ran_since(pid: int, before: int) -> int:
    """Wait until process ``pid``'s on-CPU time moved past ``before`` (its kernel books move
    at ticks and switches); return the new one."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = runtime(pid)
        if now != before:
            return now
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not run for 30 s")


def test_deltas_per_interval_of_the_processes_devices(
    tree: SysfsTree, irq: IrqCollector, worker: subprocess.Popen[bytes]
) -> None:
    sampler = FabricSampler(irq, 10.0, 1000, root=tree.root)
    ran_since(worker.pid, 0)  # it runs
    assert sampler.add(KEY, worker.pid) == ""
    ran = runtime(worker.pid)  # at least what the first reading saw
    # Interval 1: RDMA traffic and CNPs on mlx5_1, bytes on its netdev; mlx5_0 moves too,
    # but the process does not use it.
    tree.add("mlx5_1", 1, "counters", "port_xmit_data", 1_000)  # 4-byte words
    tree.add("mlx5_1", 1, "counters", "port_rcv_data", 250)
    tree.add("mlx5_1", 1, "hw_counters", "np_cnp_sent", 5)
    tree.add("mlx5_0", 1, "counters", "port_xmit_data", 99)
    tree.nic_add("eth2", "tx_bytes", 4_000)
    ran_since(worker.pid, ran)
    sampler.read_now()
    # The baseline after that reading: the process must run after it, not only after the
    # test's last look (it may have run in between and then not again before the end).
    ran = runtime(worker.pid)
    # Interval 2: a transport error and the link going down.
    tree.add("mlx5_1", 1, "hw_counters", "packet_seq_err", 2)
    tree.set_link("mlx5_1", 1, "1: DOWN", "3: Disabled", "100 Gb/sec (4X EDR)")
    ran_since(worker.pid, ran)
    records, stats = sampler.remove(KEY)

    deltas = [r for r in records if isinstance(r, FabricDelta)]
    by = {}
    for d in deltas:
        by.setdefault((d.device, d.group), []).append(d.values)
    assert {dev for dev, _ in by} == {"rdma mlx5_1:1", "nic eth2", "cpu"}
    assert by[("rdma mlx5_1:1", "bytes")] == [{"rx": 1_000, "tx": 4_000}, {"rx": 0, "tx": 0}]
    assert by[("rdma mlx5_1:1", "packets")] == [{"rx": 0, "tx": 0}] * 2
    congestion = by[("rdma mlx5_1:1", "congestion")]
    assert [c["np_cnp_sent"] for c in congestion] == [5, 0]
    assert set(congestion[0]) == {
        "port_xmit_wait",
        "np_cnp_sent",
        "rp_cnp_handled",
        "rp_cnp_ignored",
        "np_ecn_marked_roce_packets",
    }
    errors = by[("rdma mlx5_1:1", "errors")]
    assert [e["packet_seq_err"] for e in errors] == [0, 2]
    assert sum(v for e in errors for k, v in e.items() if k != "packet_seq_err") == 0
    assert by[("nic eth2", "bytes")] == [{"rx": 0, "tx": 4_000}, {"rx": 0, "tx": 0}]
    assert by[("nic eth2", "drops")][0] == {"rx_dropped": 0, "rx_missed_errors": 0, "tx_dropped": 0}
    # Interrupt time on the CPUs its threads ran on: the spinner is on CPU 0.
    cpu = by[("cpu", "interrupt time")]
    assert len(cpu) == 2 and all(set(v) <= {*SOFTIRQS, "hardirq"} and "hardirq" in v for v in cpu)
    assert all(n >= 0 for v in cpu for n in v.values())
    [event] = [r for r in records if isinstance(r, FabricEvent)]
    assert (event.kind, event.attrs) == ("rdma_link_down", {"device": "mlx5_1:1", "state": "DOWN"})
    assert event.ts_ns == deltas[-1].end_ns
    assert stats.note == ""
    assert stats.events == len(deltas)
    assert stats.info == {
        "devices": ["rdma mlx5_1:1", "nic eth2"],
        "chosen": "from NCCL_IB_HCA=mlx5_1",
        "sample_hz": 10.0,
        "cpus": [0],
    }
    # The intervals follow each other without gaps.
    starts = sorted({(d.start_ns, d.end_ns) for d in deltas})
    assert len(starts) == 2 and starts[0][1] == starts[1][0]


def test_interrupt_time_is_summed_over_the_cpus_the_threads_ran_on() -> None:
    def cpu(ns: int, hard: int) -> CpuInterrupts:
        soft = tuple(ns if name == "NET_RX" else 0 for name in SOFTIRQS)
        return CpuInterrupts(soft, (0,) * len(SOFTIRQS), hard, 0)

    before = {0: cpu(100, 10), 1: cpu(1_000, 50), 2: cpu(5, 5)}
    after = {0: cpu(400, 30), 1: cpu(9_000, 60), 2: cpu(5, 5)}
    got = _interrupt_time(before, after, {0, 2})
    assert got["NET_RX"] == 300 and got["hardirq"] == 20
    assert sum(got.values()) == 320  # CPU 1's time is not the process's


def capture_of(records: list[Any]) -> ProcessCapture:
    return ProcessCapture(
        pid=4242,
        request=KernelTrackRequest(frozenset({Track.FABRIC})),
        begin_ns=0,
        end_ns=10**9,
        begin_wall_ns=0,
        offset_ns=1_000_000_000_000,
        drift_ns=0,
        records=records,
        stats={},
        dropped_over_cap=0,
        cap=1000,
    )


def test_the_track_as_trace_events() -> None:
    base = 1_000_000_000_000  # baseTimeNanoseconds = the capture's offset: ts = monotonic ns
    records: list[Any] = [
        FabricDelta(100_000, 200_000, "rdma mlx5_1:1", "bytes", {"rx": 8, "tx": 4_000}),
        FabricDelta(200_000, 300_000, "rdma mlx5_1:1", "bytes", {"rx": 0, "tx": 0}),
        FabricDelta(100_000, 200_000, "cpu", "interrupt time", {"NET_RX": 5_000, "hardirq": 0}),
        FabricDelta(900_000, 950_000, "nic eth2", "bytes", {"rx": 1, "tx": 1}),  # after the window
        FabricEvent(250_000, "rdma_link_down", {"device": "mlx5_1:1", "state": "DOWN"}),
    ]
    built = build_tracks(capture_of(records), base, Window(0, 500_000, "kineto"), [Track.FABRIC])
    evs = [orjson.loads(e) for e in built.events]
    counters = [e for e in evs if e["ph"] == "C"]
    assert [(e["name"], e["ts"], e["args"]) for e in counters] == [
        ("fabric cpu interrupt time (ns)", 100.0, {"NET_RX": 5_000, "hardirq": 0}),
        ("fabric cpu interrupt time (ns)", 200.0, {"NET_RX": 0, "hardirq": 0}),
        ("fabric rdma mlx5_1:1 bytes", 100.0, {"rx": 8, "tx": 4_000}),
        ("fabric rdma mlx5_1:1 bytes", 200.0, {"rx": 0, "tx": 0}),
        ("fabric rdma mlx5_1:1 bytes", 300.0, {"rx": 0, "tx": 0}),
    ]
    assert {e["cat"] for e in counters} == {"bpfdyno.fabric"} and {e["pid"] for e in counters} == {
        4242
    }
    [instant] = [e for e in evs if e["ph"] == "i"]
    assert (instant["name"], instant["ts"], instant["args"], instant["cat"]) == (
        "rdma link down",
        250.0,
        {"device": "mlx5_1:1", "state": "DOWN"},
        "bpfdyno.fabric",
    )
    names = {e["args"]["name"] for e in evs if e.get("name") == "thread_name"}
    assert "fabric events" in names
    assert built.counts[Track.FABRIC] == 3 + 1  # interval points (not the closing ones), instant
