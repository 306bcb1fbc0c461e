"""The fabric track of a real PyTorch trace, end to end: a real trainer that names its RDMA
device for NCCL, traced through the agent's tracing component, the interrupt collector's BPF
program for interrupt time, and an mlx5 sysfs tree (there is no RDMA hardware here) whose
counters a thread advances while the trainer runs, as traffic would."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "fabric"))
from kernel_tracks_helpers import echo_server, events, info, window_us
from mlx5_sysfs import SysfsTree, dgx_like
from tracing_harness import TRAINERS, Harness

from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.sources.irq.collector import SOFTIRQS, IrqCollector
from bpfdyno.tracing.traces import KernelTrackState, ProcState

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

SEND, RECV, SLEEP_MS, STEPS = 100_000, 50_000, 40.0, 4
HZ = 20.0
#: The "traffic": this many 4-byte words sent on mlx5_1 every few milliseconds.
WORDS = 1_000


class Traffic:
    """Advances mlx5_1's transmitted data (and mlx5_0's, which the trainer does not use) on a
    thread of its own until stopped; counts what it added."""

    def __init__(self, tree: SysfsTree) -> None:
        self.tree = tree
        self.words = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.003):
            self.tree.add("mlx5_1", 1, "counters", "port_xmit_data", WORDS)
            self.tree.add("mlx5_0", 1, "counters", "port_xmit_data", WORDS)
            self.words += WORDS


async def test_the_fabric_of_the_traced_process_beside_its_ops(
    short_tmp: Path, irq: IrqCollector
) -> None:
    tree = dgx_like(short_tmp / "sysfs")
    h = Harness(
        short_tmp,
        capture=True,
        capture_settings=[("capture.fabric_sample_hz", str(HZ))],
        interrupts=irq,
        sysfs_root=tree.root,
    )
    async with h:
        with echo_server(SEND, RECV) as server, Traffic(tree) as traffic:
            trainer = h.spawn(
                [
                    sys.executable,
                    str(TRAINERS / "net_sleep.py"),
                    f"--port={server.port}",
                    f"--send-bytes={SEND}",
                    f"--recv-bytes={RECV}",
                    f"--sleep-ms={SLEEP_MS}",
                ],
                extra_env={"NCCL_IB_HCA": "mlx5_1"},
            )
            [pid] = await trainer.wait_ready()
            await h.wait_trainers(lambda ts: [t.pid for t in ts] == [pid])
            res = h.service.start_trace(
                TraceRequest(
                    options=TraceSpec(log_file=str(h.trace_dir / "f.json"), iterations=STEPS),
                    kernel_tracks=("fabric",),
                )
            )
            view = await h.wait_done(res.trace_id, timeout=90)
        added = traffic.words
    [p] = view.processes
    assert p.state is ProcState.WRITTEN, p.reason
    k = p.kernel_tracks
    assert (k.state, k.requested, k.merged, k.lost) == (
        KernelTrackState.MERGED,
        ("fabric",),
        ("fabric",),
        0,
    )
    evs = events(p.output_path)
    lo, hi = window_us(evs)
    meta = info(evs)
    assert meta["tracks"] == ["fabric"]
    assert meta["fabric_devices"] == ["rdma mlx5_1:1", "nic eth2"]
    assert meta["fabric_chosen"] == "from NCCL_IB_HCA=mlx5_1"
    assert meta["fabric_sample_hz"] == HZ
    assert meta["fabric_cpus"] and set(meta["fabric_cpus"]) <= set(range(64))
    assert "fabric_note" not in meta

    counters = [e for e in evs if e.get("cat") == "bpfdyno.fabric" and e["ph"] == "C"]
    assert all(e["pid"] == pid for e in counters)
    assert {e["name"] for e in counters} == {
        "fabric rdma mlx5_1:1 bytes",
        "fabric rdma mlx5_1:1 packets",
        "fabric rdma mlx5_1:1 congestion",
        "fabric rdma mlx5_1:1 errors",
        "fabric nic eth2 bytes",
        "fabric nic eth2 packets",
        "fabric nic eth2 drops",
        "fabric nic eth2 errors",
        "fabric cpu interrupt time (ns)",
    }
    # The points run from the interval around the window's start to the one around its end,
    # one per reading (1/HZ apart; a busy machine may stretch one).
    period_us = 1e6 / HZ
    rdma = sorted(
        (e for e in counters if e["name"] == "fabric rdma mlx5_1:1 bytes"), key=lambda e: e["ts"]
    )
    assert rdma[0]["ts"] <= lo and rdma[-1]["ts"] >= hi
    assert all(lo - 10 * period_us <= e["ts"] <= hi + 10 * period_us for e in rdma)
    assert len(rdma) >= (hi - lo) / period_us / 3
    # What the traffic added, in bytes (words x 4), interval by interval; the last point
    # (all 0) closes the last interval.
    sent = [e["args"]["tx"] for e in rdma]
    assert all(b % (4 * WORDS) == 0 for b in sent) and sent[-1] == 0
    assert 0 < sum(sent) <= 4 * added
    assert sum(e["args"]["rx"] for e in rdma) == 0
    # Interrupt time on the CPUs the trainer ran on: its loopback socket calls run NET_RX.
    cpu = [e["args"] for e in counters if e["name"] == "fabric cpu interrupt time (ns)"]
    assert set(cpu[0]) <= {*SOFTIRQS, "hardirq"}
    assert sum(a.get("NET_RX", 0) for a in cpu) > 0
