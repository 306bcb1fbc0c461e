"""The NCCL profiler plugin under real NCCL: a two-rank all-reduce job on two GPUs with
``NCCL_PROFILER_PLUGIN`` set, read by the agent's receiver and shown by the agent's status.

Checked: each rank's collectives, sequence numbers and bytes exactly (20 all-reduces of
4 MiB), GPU and collective time above 0, both ranks in one communicator with the same
sequence numbers, arrivals within a second of each other, kernel channel records with GPU
spans in full mode, and the running agent's ``nccl_profiler`` part naming both trainers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_suite import Agent, Checks, cuda_python, smi

from bpfdyno.sources.nccl_profiler.build import build_plugin
from bpfdyno.sources.nccl_profiler.layout import RecordKind
from bpfdyno.sources.nccl_profiler.receiver import NcclProfilerReceiver

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
SHM = Path("/dev/shm")  # the agent's default: what it reads at its defaults
RUNS = 20
BYTES = 4 << 20


class Rank:
    def __init__(self, rank: int, port: int, library: Path, work: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KINETO_"))}
        env.update(
            NCCL_PROFILER_PLUGIN=str(library), CUDA_DEVICE_ORDER="PCI_BUS_ID",
            PYTHONUNBUFFERED="1",
        )  # fmt: skip
        env.pop("BPFDYNO_NCCL_SHM_DIR", None)
        self.log = work / f"nccl_rank{rank}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [cuda_python(), str(HERE / "nccl_ranks.py"), str(rank), "2", str(port)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, text=True,
            )  # fmt: skip

    def expect(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(prefix), f"{line!r}; stderr:\n{self.log.read_text()[-3000:]}"
        return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


@pytest.fixture
def ranks(work: Path) -> Iterator[list[Rank]]:
    if len(smi("--query-gpu=index")) < 2:
        pytest.skip("a two-rank NCCL job needs two GPUs (NCCL refuses two ranks on one GPU)")
    library = build_plugin(work / "nccl_plugin")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = [Rank(r, port, library, work) for r in range(2)]
    try:
        for r in started:
            r.expect("ready ")
        yield started
    finally:
        for r in started:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait(timeout=30)


def run_all(ranks: list[Rank], n: int) -> None:
    for r in ranks:
        r.send(f"run {n}")
    for r in ranks:
        r.expect("done")


def test_two_rank_allreduce_reaches_the_agent(
    agent: Agent, ranks: list[Rank], checks: Checks
) -> None:
    pids = [r.proc.pid for r in ranks]
    receiver = NcclProfilerReceiver(shm_dir=SHM)
    receiver.poll()
    before = receiver.snapshot()
    if not checks.equal("ranks publishing", sorted(p for p in before if p in pids), sorted(pids)):
        checks.verify()
    run_all(ranks, RUNS)
    receiver.poll()
    after = receiver.snapshot()
    for pid in pids:
        a, b = before[pid], after[pid]
        checks.equal(f"pid {pid} collectives", b.colls_completed - a.colls_completed, RUNS)
        checks.equal(f"pid {pid} last seq", b.last_seq - a.last_seq, RUNS)
        checks.equal(f"pid {pid} bytes", b.bytes - a.bytes, RUNS * BYTES)
        checks.equal(f"pid {pid} in flight", b.in_flight, 0)
        checks.equal(f"pid {pid} communicator size", b.nranks, 2)
        checks.between(f"pid {pid} GPU ns", b.gpu_time_ns - a.gpu_time_ns, 1, 10**10)
        checks.between(
            f"pid {pid} collective ns", b.time_in_collectives_ns - a.time_in_collectives_ns,
            1, 10**11,
        )  # fmt: skip
    r0, r1 = (after[p] for p in pids)
    checks.equal("ranks", sorted((r0.rank, r1.rank)), [0, 1])
    last0 = {(c.comm_id, c.seq): c for c in r0.recent[-RUNS:]}
    last1 = {(c.comm_id, c.seq): c for c in r1.recent[-RUNS:]}
    checks.equal("same collectives on both ranks", sorted(last0), sorted(last1))
    lateness = max(
        abs(last0[k].start_realtime_ns - last1[k].start_realtime_ns) for k in last0 if k in last1
    )
    checks.between("arrival difference (ns)", lateness, 0, 10**9)
    # The GPUs' own arrival (first kernel channel start, globaltimer) on both ranks.
    gpu_lateness = max(
        abs(last0[k].gpu_start_ns - last1[k].gpu_start_ns) for k in last0 if k in last1
    )
    checks.equal("GPU arrivals recorded", all(c.gpu_start_ns for c in last0.values()), True)
    checks.between("GPU arrival difference (ns)", gpu_lateness, 0, 10**9)

    # Full mode: kernel channels with GPU spans.
    receiver.request_detail(30.0)
    run_all(ranks, 5)
    receiver.poll()
    for pid in pids:
        channels = [r for r in receiver.drain_records(pid) if r.kind == RecordKind.KERNEL_CH]
        spans = [r.gpu_stop_ns - r.gpu_start_ns for r in channels]
        checks.between(f"pid {pid} kernel channel records", len(channels), 5, 10**6)
        checks.between(f"pid {pid} shortest channel GPU span", min(spans, default=0), 1, 10**10)

    # The running agent's part names both trainers.
    want = f"in use by 2 trainer process(es): {', '.join(str(p) for p in sorted(pids))}"
    deadline = time.monotonic() + 15
    while (part := agent.collector("nccl_profiler"))["reason"] != want:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    checks.equal("agent's nccl_profiler part", part["reason"], want)

    for r in ranks:
        r.send("quit")
    for r in ranks:
        checks.equal(f"rank pid {r.proc.pid} exit", r.proc.wait(timeout=60), 0)
    receiver.poll()
    checks.equal("files left", [p for p in receiver.snapshot() if p in pids], [])
    print(json.dumps({"lateness_ns": lateness, "gpu_lateness_ns": gpu_lateness}))
    checks.verify()
