"""What recording kernel tracks costs while a trace runs. Run as root:
``python tests/bench/bench_capture.py [--seconds 3] [--rounds 8] [--steps 200]``.

1. BPF cost per event of the capture programs (bpf/capture.bpf.c), from the kernel's run
   statistics over ``--seconds``, while a workload process ping-pongs 1 KiB messages with
   an echo server over loopback (a send, a blocking receive, context switches):
   a) the workload is the traced process (every function does its full work);
   b) another process is traced, not the workload (the functions run for every event of
      the machine and stop at the traced-process check);
   c) nothing is traced: the functions are detached (their run count stays 0).
2. NCCL probes (bpf/nccl.bpf.c): time per ``ncclAllReduce`` call (the real libnccl; no GPU,
   so the call returns at once) in a child calling it in a loop, rounds interleaved:
   no probes; probes on the library for another traced process (this one traps into them
   and is not recorded); this process traced. The differences are the per-call costs.
3. A PyTorch CPU training step (MLP 512-1024-10, batch 64, one thread pinned to CPU 0)
   under the PyTorch profiler (Kineto) in every round, with all kernel tracks recording
   the process in half of the rounds (interleaved, order rotated): median step time each,
   and the slowdown of the medians (target <= 3 %).
4. GPU counter sampling with the C library implementing the NVML ABI (tests/sources/gpu):
   time per sampling round for 1 and 8 GPUs — the agent's side of the cost; a real
   driver's NVML calls are not measured here (no GPU).

The machine is a shared 2-vCPU VM; treat ratios as indicative.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bpfdyno.core.config import load
from bpfdyno.ebpf.runstats import BpfRunStats
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import ALL_TRACKS, KernelTrackRequest, Track

ALL = KernelTrackRequest(frozenset(ALL_TRACKS), 0.0)

PINGPONG = r"""
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
msg = b"p" * 1024
while True:
    c.sendall(msg)
    got = 0
    while got < 1024:
        got += len(c.recv(1024 - got))
"""

NCCL_LOOP = r"""
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
P, N = ctypes.c_void_p, ctypes.c_size_t
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    for _ in range(n):
        lib.ncclAllReduce(P(1), P(2), N(1024), 7, 0, None, P(3))
    print((time.perf_counter() - t0) / n * 1e6, flush=True)
"""

TRAIN = r"""
import os, statistics, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
os.sched_setaffinity(0, {0})
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
for _ in range(30):
    step()
print("ready", flush=True)
for line in sys.stdin:
    times = []
    with profile(activities=[ProfilerActivity.CPU]):
        for _ in range(int(line)):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    print(statistics.median(times) * 1e3, flush=True)
"""


@contextmanager
def echo_server() -> Iterator[int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the workload is killed mid-message
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


@contextmanager
def child(code: str, *args: str, stdin: bool = False) -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # Kineto logs every profiler start and stop
        text=True,
    )
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def ask(p: subprocess.Popen[str], line: str) -> str:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def libnccl() -> str:
    spec = importlib.util.find_spec("nvidia.nccl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install nvidia-nccl-cu12 (the test extra) first")
    return os.path.join(next(iter(spec.submodule_search_locations)), "lib", "libnccl.so.2")


def bpf_costs(m: CaptureManager, seconds: float) -> None:
    print("## 1. BPF cost per event of the capture programs\n")
    with (
        echo_server() as port,
        child(PINGPONG, str(port)) as work,
        child("import time; time.sleep(3600)") as other,
    ):
        time.sleep(0.5)
        rows: dict[str, dict[str, tuple[float, float]]] = {}
        for label, pid in (("workload traced", work.pid), ("another process traced", other.pid)):
            key = CaptureKey(label, pid)
            m.begin(key, KernelTrackRequest(frozenset({Track.NET, Track.SCHED}), 0.0)).result(60)
            stats = BpfRunStats(m.kernel.program_fds()).measure(seconds)
            m.end(key).result(60)
            rows[label] = {n: (s.ns_per_event, s.runs_per_second) for n, s in stats.items()}
        idle = BpfRunStats(m.kernel.program_fds()).measure(seconds)
        print(
            "| program | traced: ns/event | runs/s | untraced: ns/event | runs/s "
            "| nothing traced: runs |"
        )
        print("|---|---|---|---|---|---|")
        for name in sorted(rows["workload traced"]):
            a = rows["workload traced"][name]
            b = rows["another process traced"][name]
            print(
                f"| `{name}` | {a[0]:.0f} | {a[1]:,.0f} | {b[0]:.0f} | {b[1]:,.0f} "
                f"| {idle[name].runs} |"
            )
        print()


def nccl_costs(m: CaptureManager, rounds: int, calls: int) -> None:
    print("## 2. NCCL probes: time per ncclAllReduce call\n")
    lib = libnccl()
    kinds = ("no probes", "probes, not traced", "traced")
    results: dict[str, list[float]] = {k: [] for k in kinds}
    with child(NCCL_LOOP, lib, stdin=True) as loop, child(NCCL_LOOP, lib, stdin=True) as holder:
        assert loop.stdout is not None and holder.stdout is not None
        assert loop.stdout.readline().strip() == "ready"
        assert holder.stdout.readline().strip() == "ready"
        for r in range(rounds):
            order = kinds[r % 3 :] + kinds[: r % 3]
            for kind in order:
                key = CaptureKey(f"{kind}{r}", loop.pid if kind == "traced" else holder.pid)
                if kind != "no probes":
                    m.begin(key, KernelTrackRequest(frozenset({Track.NCCL}), 0.0)).result(60)
                    assert m.nccl.probed_libraries(), "libnccl not probed"
                results[kind].append(float(ask(loop, str(calls))))
                if kind != "no probes":
                    m.end(key).result(60)
    base = statistics.median(results["no probes"])
    print("| probes | us per call (median) | added per call |")
    print("|---|---|---|")
    for kind in kinds:
        med = statistics.median(results[kind])
        print(f"| {kind} | {med:.2f} | {med - base:+.2f} us |")
    print()


def training(m: CaptureManager, rounds: int, steps: int) -> None:
    print("## 3. PyTorch CPU training step under Kineto, kernel tracks on / off\n")
    on: list[float] = []
    off: list[float] = []
    with child(TRAIN, stdin=True) as train:
        assert train.stdout is not None
        assert train.stdout.readline().strip() == "ready"
        ask(train, str(steps))  # a warm-up round under the profiler, not counted
        for r in range(rounds):
            for record in (r % 2 == 0, r % 2 == 1):
                key = CaptureKey(f"train{r}", train.pid)
                if record:
                    m.begin(key, ALL).result(60)
                ms = float(ask(train, str(steps)))
                if record:
                    m.end(key).result(60)
                (on if record else off).append(ms)
    a, b = statistics.median(off), statistics.median(on)
    print("| Kineto alone (median ms) | Kineto + all kernel tracks | slowdown | target |")
    print("|---|---|---|---|")
    print(f"| {a:.3f} | {b:.3f} | {(b / a - 1) * 100:+.1f} % | <= 3 % |")
    print(f"\nrounds: off {[round(x, 3) for x in off]}, on {[round(x, 3) for x in on]}\n")


def gpu_sampling(rounds: int) -> None:
    print("## 4. GPU counter sampling (the C NVML library of the tests)\n")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "gpu"))
    from gpu_fake_nvml import DEFAULT_VALUES, build_fake_nvml

    from bpfdyno.sources.gpu.collector import GpuCollector

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    lib = build_fake_nvml(work / "lib")
    print("| GPUs | ms per sampling round (median) |")
    print("|---|---|")
    for count in (1, 8):
        values = dict(DEFAULT_VALUES)
        values["device_count"] = str(count)
        for i in range(count):
            for k, v in DEFAULT_VALUES.items():
                if k.startswith("gpu.0."):
                    values[k.replace("gpu.0.", f"gpu.{i}.", 1)] = v
        ctl = work / f"ctl{count}"
        ctl.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        os.environ["FAKE_NVML_CONTROL"] = str(ctl)
        gpu = GpuCollector(str(lib))
        gpu.start()
        gpu.collect()
        times = []
        for _ in range(rounds * 20):
            t0 = time.perf_counter()
            gpu.trace_counters(range(count))
            times.append(time.perf_counter() - t0)
        gpu.close()
        print(f"| {count} | {statistics.median(times) * 1e3:.3f} |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--nccl-calls", type=int, default=20000)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: bpf,nccl,train,gpu")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    print(
        f"{time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    m = CaptureManager(load(None).capture)
    m.start()
    assert m.wait_loaded(120)
    try:
        if "bpf" not in skip:
            bpf_costs(m, args.seconds)
        if "nccl" not in skip:
            nccl_costs(m, args.rounds, args.nccl_calls)
        if "train" not in skip:
            training(m, args.rounds, args.steps)
    finally:
        m.stop()
    if "gpu" not in skip:
        gpu_sampling(args.rounds)


if __name__ == "__main__":
    main()
