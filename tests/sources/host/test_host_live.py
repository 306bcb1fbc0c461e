"""HostCollector against this machine's real /proc, with load generated on purpose."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from bpfdyno.core.metrics import Sample
from bpfdyno.sources.host.collector import HostCollector

MIB = 1 << 20


def values(samples: Sequence[Sample], name: str) -> dict[str, float]:
    """Values of metric ``name`` by their first label's value ("" when unlabelled)."""
    return {(s.labels[0][1] if s.labels else ""): s.value for s in samples if s.spec.name == name}


def two_collects(during: Callable[[], None], interval_s: float = 1.0) -> tuple[list[Sample], float]:
    """Collect, run ``during``, wait out the interval, collect again.

    Returns:
        The second collect's samples and an upper bound of the time between the two reads.
    """
    collector = HostCollector()
    collector.start()
    start = time.monotonic()
    collector.collect()
    during()
    time.sleep(max(0.0, interval_s - (time.monotonic() - start)))
    samples = list(collector.collect())
    return samples, time.monotonic() - start


def meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/meminfo")


def test_memory_total_is_memtotal_in_bytes() -> None:
    samples = HostCollector().collect()
    assert values(samples, "memory_total_bytes")[""] == meminfo_kib("MemTotal") * 1024


def test_uptime_matches_proc_uptime() -> None:
    samples = HostCollector().collect()
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert abs(values(samples, "uptime_seconds")[""] - uptime) < 1.0


def test_cpu_ratios_cover_every_core_and_sum_to_one() -> None:
    samples, _ = two_collects(lambda: None)
    states = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    per_state = {state: values(samples, f"cpu_{state}_ratio") for state in states}
    online = {str(cpu) for cpu in os.sched_getaffinity(0)}
    assert set(per_state["user"]) == {"total"} | online
    for cpu in per_state["user"]:
        ratios = [per_state[state][cpu] for state in states]
        assert all(0.0 <= r <= 1.0 for r in ratios), (cpu, ratios)
        assert abs(sum(ratios) - 1.0) <= 0.02, (cpu, ratios)


@contextmanager
def spinning_thread() -> Iterator[None]:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_busy_thread_shows_in_cpu_utilization() -> None:
    with spinning_thread():
        samples, _ = two_collects(lambda: None)
    cpus = len(os.sched_getaffinity(0))
    # One thread keeps one of the cores busy the whole interval (the main thread sleeps).
    assert values(samples, "cpu_utilization_ratio")["total"] >= 0.9 / cpus


def test_loopback_transfer_shows_in_lo_rates() -> None:
    size = 64 * MIB

    def transfer() -> None:
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            received = 0

            def receive() -> None:
                nonlocal received
                conn, _ = server.accept()
                with conn:
                    while chunk := conn.recv(MIB):
                        received += len(chunk)

            receiver = threading.Thread(target=receive)
            receiver.start()
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(b"\0" * size)
            receiver.join()
            assert received == size

    samples, elapsed = two_collects(transfer)
    assert values(samples, "net_rx_bytes_per_second")["lo"] >= size / elapsed
    assert values(samples, "net_tx_bytes_per_second")["lo"] >= size / elapsed
    assert values(samples, "net_rx_packets_per_second")["lo"] > 0


def whole_disk_of(path: Path) -> str:
    """The whole block device (as /proc/diskstats names it) holding ``path``."""
    dev = os.stat(path).st_dev
    sysdir = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    assert sysdir.exists(), f"{path} is not on a block device"
    return (sysdir.parent if (sysdir / "partition").exists() else sysdir).name


def test_an_fsynced_write_shows_in_disk_write_rate() -> None:
    size = 16 * MIB
    # /var/tmp is disk-backed by convention (/tmp may be tmpfs).
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        target = Path(tmp) / "blob"

        def write() -> None:
            with open(target, "wb") as f:
                f.write(os.urandom(size))
                f.flush()
                os.fsync(f.fileno())

        samples, elapsed = two_collects(write)
        disk = whole_disk_of(Path(tmp))
    assert values(samples, "disk_write_bytes_per_second")[disk] >= size / elapsed
    assert values(samples, "disk_writes_per_second")[disk] > 0
    assert 0.0 < values(samples, "disk_busy_ratio")[disk] <= 1.0


PID_NAMESPACE_SCRIPT = """
import subprocess
import sys
from bpfdyno.sources.host.collector import HostCollector
collector = HostCollector()
def processes():
    return [s.value for s in collector.collect() if s.spec.name == "processes_total"][0]
before = processes()
children = [subprocess.Popen(["sleep", "30"]) for _ in range(20)]
during = processes()
for child in children:
    child.kill()
    child.wait()
print(before, during, processes())
"""


@pytest.mark.root
def test_process_count_is_exact_in_a_pid_namespace_of_its_own() -> None:
    # A fresh PID namespace with its own /proc shows only what the test starts, so the count
    # is exact even while the rest of the machine starts and ends processes.
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PID_NAMESPACE_SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.split() == ["1.0", "21.0", "1.0"]


def test_thread_count_follows_started_threads() -> None:
    # threads_total is host-wide, and other work on the machine starts and ends threads, so
    # take the median of three start/stop cycles of 300 threads.
    collector = HostCollector()

    def threads() -> float:
        return values(collector.collect(), "threads_total")[""]

    grown = []
    for _ in range(3):
        release = threading.Event()
        started = [threading.Thread(target=release.wait) for _ in range(300)]
        before = threads()
        for t in started:
            t.start()
        try:
            grown.append(threads() - before)
        finally:
            release.set()
            for t in started:
                t.join()
    assert 240 <= statistics.median(grown) <= 360, grown
