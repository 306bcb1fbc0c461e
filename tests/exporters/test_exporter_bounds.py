"""Per-process series stay bounded under real process churn.

The per-process families are the process table's rows: at most ``[events]
process_table_size`` processes plus registered trainers. With a table of 5 and a stream of
short-lived busy processes (each briefly the busiest on the host), every scrape must hold
at most 5 processes, while the processes seen across scrapes change (the churn was real).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from export_harness import AgentProcess, free_port, wait_for

pytestmark = [pytest.mark.slow]

TABLE_SIZE = 5
BUSY = "import time\nt = time.monotonic() + 0.4\nwhile time.monotonic() < t: pass\n"


def _pids(exposition: str) -> set[str]:
    return set(re.findall(r'^process_\w+\{[^}]*pid="(\d+)"', exposition, re.MULTILINE))


def test_process_series_are_bounded_by_the_table_under_churn(tmp_path: Path) -> None:
    port = free_port()
    agent = AgentProcess(
        tmp_path,
        "export.prometheus.enabled=true",
        f'export.prometheus.listen="127.0.0.1:{port}"',
        f"events.process_table_size={TABLE_SIZE}",
        "daemon.interval_s=0.25",
        *(
            f"collectors.{c}.enabled=false"
            for c in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "self", "irq")
        ),
    )
    url = f"http://127.0.0.1:{port}/metrics"
    stop = threading.Event()
    spawned: list[int] = []

    def churn() -> None:
        while not stop.is_set():
            children = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(3)]
            spawned.extend(c.pid for c in children)
            for c in children:
                c.wait()

    try:

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=10) as r:
                return str(r.read().decode())

        wait_for("process rows in the exposition", lambda: _pids(scrape()) or None)
        worker = threading.Thread(target=churn)
        worker.start()
        seen: set[str] = set()
        sizes: list[int] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            pids = _pids(scrape())
            sizes.append(len(pids))
            seen |= pids
            assert len(pids) <= TABLE_SIZE, pids
            time.sleep(0.2)
        stop.set()
        worker.join()
        churned = seen & {str(p) for p in spawned}
        assert len(spawned) >= 30, len(spawned)
        assert len(churned) > TABLE_SIZE, (len(churned), len(spawned))
        assert max(sizes) == TABLE_SIZE
    finally:
        stop.set()
        agent.stop()
