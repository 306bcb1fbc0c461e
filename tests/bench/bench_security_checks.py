"""What three of the round-three security checks cost, each with and without, interleaved.

Usage (as root): ``python tests/bench/bench_security_checks.py [--rounds 21]
[--write-doc docs/performance.md]``

* **Header tree check, per start.** Before bcc compiles with the generated kernel headers,
  `ensure_headers` verifies the owner and mode of every entry of the cached tree and of the
  directories above it (`kheaders.tree_problem`). Timed: a warm `ensure_headers("btf")`
  (the tree cached, as at every start but the first) with the check and with it replaced by
  one that finds nothing; the difference is what the check adds to each start.
* **hidepid in `ps`.** With ``hidepid`` on /proc a user other than root gets only her own
  processes: each `ListProcesses` reads the /proc mount's options
  (`procview.proc_view`), asks whether the user may see all (her groups against the
  exempt group) and filters the rows. Timed on a table of `--rows` rows (this host's
  processes repeated), with and without that step.
* **The listener-owner check (``dcgm_host_engine = "auto"``).** Before connecting to
  127.0.0.1:5555 the agent reads /proc/net/tcp for the uid that listens there
  (`dcgm.untrusted_listener`); once per connect of the DCGM collector. Timed with this
  host's sockets plus `--listeners` extra listening sockets (a busy node's table), against
  no check (0).

Reported: the calling thread's CPU time per call, medians over the rounds (on/off order
alternating), the difference and, where a base exists, the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from doc_blocks import write_results

from bpfdyno.core.procview import ProcView, proc_view
from bpfdyno.ebpf import kheaders
from bpfdyno.sources.gpu.dcgm import HostEngine, untrusted_listener

SECTION = "## Security checks"


def _time_ns(fn: Callable[[], object], n: int) -> float:
    """This thread's CPU ns per call: on a crowded machine the wall clock mostly measures
    the wait for a CPU, the same with and without a check."""
    t0 = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - t0) / n


def _interleaved(
    rounds: int, on: Callable[[], float], off: Callable[[], float]
) -> tuple[float, float]:
    ons, offs = [], []
    for r in range(rounds):
        for which in (True, False) if r % 2 == 0 else (False, True):
            (ons if which else offs).append(on() if which else off())
    return statistics.median(ons), statistics.median(offs)


def header_tree(rounds: int) -> str:
    tree = kheaders.ensure_headers("btf")  # generated once if it is not cached yet
    entries = sum(len(d) + len(f) for _, d, f in os.walk(tree.path))
    real = kheaders.tree_problem

    def warm(check: Callable[[Path], str]) -> float:
        kheaders.tree_problem = check
        try:
            return _time_ns(lambda: kheaders.ensure_headers("btf"), 5)
        finally:
            kheaders.tree_problem = real

    on, off = _interleaved(rounds, lambda: warm(real), lambda: warm(lambda _p: ""))
    return (
        f"| header tree check, per start ({tree.kind}, {entries} entries) | "
        f"{on / 1e6:.2f} ms | {off / 1e6:.2f} ms | +{(on - off) / 1e6:.2f} ms | "
        f"{on / off:.2f}x |"
    )


@dataclasses.dataclass(frozen=True)
class _Row:
    pid: int
    uid: int


def hidepid(rounds: int, rows: int) -> str:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    table = []
    for i in range(rows):
        pid = pids[i % len(pids)]
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            uid = 0
        table.append(_Row(pid, uid))
    uid = 65534  # a user in no exempt group
    view = ProcView(hidepid=2, gid=27)  # as if /proc had hidepid=invisible,gid=27

    def with_check() -> object:
        proc_view()  # read per request: a remount takes effect at once
        if not view.sees_all(uid):
            return [r for r in table if r.uid == uid]
        return table

    on, off = _interleaved(
        rounds, lambda: _time_ns(with_check, 20), lambda: _time_ns(lambda: table, 20)
    )
    return (
        f"| hidepid in `ps`, per request ({rows} rows) | {on / 1e3:.0f} µs | "
        f"{off / 1e3:.1f} µs | +{(on - off) / 1e3:.0f} µs | — |"
    )


def listener(rounds: int, extra: int) -> str:
    held = []
    for _ in range(extra):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        held.append(s)
    try:
        tables = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
        lines = sum(len(t.read_text().splitlines()) - 1 for t in tables)
        engine = HostEngine("127.0.0.1:5555", found=True)
        on, off = _interleaved(
            rounds,
            lambda: _time_ns(lambda: untrusted_listener(engine), 20),
            lambda: _time_ns(lambda: "", 20),
        )
    finally:
        for s in held:
            s.close()
    return (
        f"| listener-owner check, per DCGM connect ({lines} TCP sockets) | "
        f"{on / 1e3:.0f} µs | {off / 1e3:.2f} µs | +{(on - off) / 1e3:.0f} µs | — |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--listeners", type=int, default=900)
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    lines = [
        f"{args.rounds} interleaved rounds, medians of the calling thread's CPU time per "
        f"call; load average {load:.1f} on {os.cpu_count()} CPUs while measured.",
        "",
        "| check | with | without | cost | ratio |",
        "|---|---|---|---|---|",
        header_tree(args.rounds),
        hidepid(args.rounds, args.rows),
        listener(args.rounds, args.listeners),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "security-checks", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
