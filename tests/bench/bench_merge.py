"""What merging kernel tracks into a big trace costs: time and extra agent memory.

Run: ``python tests/bench/bench_merge.py [--size-mb 500] [--events 100000] [--rounds 3]
[--anchor-mb 50] [--dir /tmp]``.

1. A synthetic Kineto trace of ``--size-mb`` MB is written once: Kineto's own layout (head,
   ~320-byte ``cpu_op`` events, the profiler's span, then GPU kernels and ``Record Window
   End``). ``--span-at`` says where the span is: 0.5 (the default) puts it mid-file, as a
   CUDA trace does (CPU ops, span, GPU activities); 1.0 at the end, as a CPU trace does. The
   merge must find it wherever it is.
2. A capture with ``--events`` records (40 % socket bursts on 32 sockets, 50 % off-CPU
   intervals of 16 threads, 10 % NCCL calls) is built in a child process, as the agent holds
   it when the file appears.
3. The child runs the agent's own merge (`merge_capture`: trace events built from the
   records, spliced into a copy of the file, renamed over it) and reports the wall time and
   the peak RSS during the merge above its RSS before it (``VmHWM`` reset through
   ``/proc/self/clear_refs``). Each round merges into a fresh copy of the file (copy time
   not counted; the file is in the page cache, as one Kineto just wrote is).
4. Anchor: what a script would do — ``json.load`` the file, append, ``json.dump`` — on a
   ``--anchor-mb`` trace (a 500 MB one would need several GB), same measurements.

Reported: median, min and max of each over the rounds, and the targets (≤ 2 s and ≤ 100 MB
extra RSS for 500 MB and 100k events).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BASE_NS = 1_790_000_000_000_000_000

HEAD = """{
  "schemaVersion": 1,
  "deviceProperties": [
  ],
  "trace_id": "bench",
  "host_name": "bench",
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": %d,
  "traceEvents": [
"""
EVENT = """  {
    "ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 4242, "tid": 4242,
    "ts": %d.%03d, "dur": 58.473,
    "args": {
      "External id": %d,"Record function id": 0, "Sequence number": 207,
      "Fwd thread id": 0, "Ev Idx": %d
    }
  },
"""
KERNEL = """  {
    "ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT",
    "pid": 0, "tid": 7, "ts": %d.%03d, "dur": 406.720,
    "args": {
      "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": %d,
      "registers per thread": 168, "shared memory": 213188, "grid": [2, 66, 1]
    }
  },
"""
SPAN = """  {
    "ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
    "tid": "PyTorch Profiler",
    "ts": %d.000, "dur": %d.000,
    "args": {
      "Op count": 0
    }
  },
"""
TAIL = """  {
    "ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "",
    "ts": %d.000
  }
],"traceName": "bench.json" }
"""
#: The trace window in µs relative to the base time (the capture's records fall inside).
WINDOW_US = (1_000_000, 61_000_000)
WINDOW_NS = (WINDOW_US[0] * 1000, WINDOW_US[1] * 1000)


def write_trace(path: Path, size_mb: int, span_at: float = 0.5) -> int:
    """Write a Kineto-shaped trace of about ``size_mb`` MB, the profiler's span after
    ``span_at`` of it (CPU ops before, GPU kernels after); returns its size."""
    target = size_mb << 20
    block_events = 2000
    span = WINDOW_US[1] - WINDOW_US[0]
    with open(path, "w", encoding="ascii") as f:
        f.write(HEAD % BASE_NS)
        written, n = 0, 0
        spanned = False
        while written < target:
            if not spanned and written >= span_at * target:
                f.write(SPAN % (WINDOW_US[0], span))
                spanned = True
            event = KERNEL if spanned else EVENT
            block = []
            for _ in range(block_events):
                us = WINDOW_US[0] + (n * 7) % span
                block.append(
                    event % (us, n % 1000, n, n) if event is EVENT else event % (us, n % 1000, n)
                )
                n += 1
            text = "".join(block)
            f.write(text)
            written += len(text)
        if not spanned:
            f.write(SPAN % (WINDOW_US[0], span))
        f.write(TAIL % WINDOW_US[1])
    return path.stat().st_size


CHILD = r"""
import json, os, sys, time
from bpfdyno.tracing.capture.records import *
from bpfdyno.tracing.kernel_tracks import merge_capture
from bpfdyno.tracing.merge import inspect_trace
from bpfdyno.tracing.traces import PartRef

path, n, base_ns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lo_us, hi_us = int(sys.argv[4]), int(sys.argv[5])

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

start_rss = rss("VmRSS")
offset = 10**18  # wall - monotonic: monotonic timestamps are base + rel - offset
span = (hi_us - lo_us) * 1000
socks = [SocketInfo("tcp", f"10.0.0.1:{40000 + i}", "10.0.0.2:29500") for i in range(32)]
records = []
for i in range(n):
    rel = lo_us * 1000 + (i * span) // n
    mono = base_ns + rel - offset
    kind = i % 10
    if kind < 4:
        records.append(NetBurst(100 + i % 4, 0xffff0000 + i % 32, bool(i & 1), mono, mono + 5000,
                                4096, 3, socks[i % 32]))
    elif kind < 9:
        records.append(OffCpu(100 + i % 16, "gloo", mono, mono + 20000, mono + 25000, 1, 202, 0))
    else:
        records.append(NcclCall(100, "ncclAllReduce", mono, mono + 3000, 1024, 7, 0, -1,
                                0x1000, 0x2000, 0x3000, 0x4000, 0))
cap = ProcessCapture(4242, KernelTrackRequest(frozenset(Track), 0.0), 0, 0, offset, offset, 0,
                     records, {}, 0, n)
held = rss("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
before = rss("VmRSS")
part = PartRef("bench", b"", 4242, path, cap.request)
window = inspect_trace(path).window_ns
t0 = time.perf_counter()
status = merge_capture(part, cap)
seconds = time.perf_counter() - t0
peak = rss("VmHWM")
print(json.dumps({"seconds": seconds, "extra_rss": peak - before, "records_rss": held - start_rss,
                  "state": status.state.value, "events": status.events, "window": window,
                  "reason": status.reason, "size_after": os.path.getsize(path)}))
"""

ANCHOR = r"""
import json, sys, time
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
path, n = sys.argv[1], int(sys.argv[2])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = rss("VmRSS")
t0 = time.perf_counter()
with open(path) as f:
    data = json.load(f)
data["traceEvents"].extend({"ph": "i", "name": "x", "pid": 1, "tid": 1, "ts": i} for i in range(n))
with open(path + ".out", "w") as f:
    json.dump(data, f)
print(json.dumps({"seconds": time.perf_counter() - t0, "extra_rss": rss("VmHWM") - before}))
"""


def run_child(code: str, *args: object) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        raise SystemExit(f"child failed: {r.stderr[-3000:]}")
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=500)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--anchor-mb", type=int, default=50)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--span-at", type=float, default=0.5, help="where the span is (0..1)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-merge-", dir=args.dir))
    try:
        master = work / "master.json"
        size = write_trace(master, args.size_mb, args.span_at)
        print(
            f"trace: {size / 1e6:.0f} MB (the span after {args.span_at:.0%} of it), "
            f"{args.events} kernel records, {args.rounds} rounds"
        )
        times, extra, held = [], [], []
        result: dict[str, object] = {}
        for i in range(args.rounds):
            copy = work / f"round{i}.json"
            shutil.copyfile(master, copy)
            result = run_child(CHILD, copy, args.events, BASE_NS, *WINDOW_US)
            assert result["state"] == "merged", result
            assert result["window"] == list(WINDOW_NS), result  # the span was found
            times.append(float(str(result["seconds"])))
            extra.append(int(str(result["extra_rss"])) / 1e6)
            held.append(int(str(result["records_rss"])) / 1e6)
            copy.unlink()
        anchor_file = work / "anchor.json"
        write_trace(anchor_file, args.anchor_mb)
        anchor = run_child(ANCHOR, anchor_file, args.events)
        anchor_s = float(str(anchor["seconds"]))
        anchor_mb = int(str(anchor["extra_rss"])) / 1e6
        rows = [
            "| what | size | events added | time (s) | extra RSS (MB) |",
            "|---|---|---|---|---|",
            f"| bpfdyno merge | {size / 1e6:.0f} MB | {result['events']} | {summary(times)} "
            f"| {summary(extra)} |",
            f"| json.load + dump (anchor) | {anchor_file.stat().st_size / 1e6:.0f} MB "
            f"| {args.events} | {anchor_s:.2f} | {anchor_mb:.0f} |",
        ]
        print("\n".join(rows))
        print(
            f"\nThe capture's {args.events} records themselves: {statistics.median(held):.0f} MB "
            "of the agent's memory while it holds them (before the merge).\n"
            "Targets: <= 2 s and <= 100 MB extra RSS for 500 MB and 100k events."
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("note: not root; /proc/self/clear_refs may be refused", file=sys.stderr)
    main()
