"""HostCollector and the procfs parsers against two fixture snapshots with known deltas.

``fixtures/host/t0`` and ``t1`` are real-looking copies of this kind of machine's procfs and
sysfs files, edited so that between them every counter moves by a chosen amount. The
collector reads a root that is a symlink, repointed from t0 to t1 while a fake clock
advances by exactly 2.0 s, so every ratio and rate below is known exactly.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from bpfdyno.core.metrics import Sample
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.host import procfs
from bpfdyno.sources.host.collector import HostCollector
from bpfdyno.sources.host.procfs import ProcfsError

FIXTURES = Path(__file__).parent / "fixtures" / "host"
SOURCES = (
    "proc/stat",
    "proc/meminfo",
    "proc/loadavg",
    "proc/uptime",
    "proc",
    "proc/diskstats",
    "proc/net/dev",
)
KIB = 1024

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def as_dict(samples: Sequence[Sample]) -> Series:
    out: Series = {}
    for s in samples:
        assert s.key not in out, f"series {s.key} emitted twice"
        out[s.key] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(labels.items()))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A collector reading ``root``, a symlink that a test repoints between snapshots."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "root"
        self.root.symlink_to(FIXTURES / "t0")
        self.clock = FakeClock()
        self.collector = HostCollector(root=self.root, clock=self.clock)

    def collect_at(self, snapshot: Path, advance_s: float = 0.0) -> Series:
        self.root.unlink()
        self.root.symlink_to(snapshot)
        self.clock.now += advance_s
        return as_dict(self.collector.collect())


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def copy_snapshot(tmp_path: Path, name: str, copy: str = "copy") -> Path:
    """A writable copy of fixture snapshot ``name`` for a test to edit."""
    dest = tmp_path / f"{copy}-{name}"
    shutil.copytree(FIXTURES / name, dest)
    return dest


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def up(value: float) -> Series:
    return {key("host_source_up", source=s): value for s in SOURCES}


def gauges_t0() -> Series:
    return {
        key("procs_running"): 4.0,
        key("procs_blocked"): 0.0,
        key("memory_total_bytes"): 24684084 * KIB,
        key("memory_used_bytes"): (24684084 - 24377088) * KIB,
        key("memory_available_bytes"): 24377088 * KIB,
        key("memory_free_bytes"): 24418904 * KIB,
        key("memory_cached_bytes"): (91408 + 74392) * KIB,
        key("memory_buffers_bytes"): 3660 * KIB,
        key("swap_total_bytes"): 2097148 * KIB,
        key("swap_used_bytes"): 0.0,
        key("load_average_1m"): 0.26,
        key("load_average_5m"): 0.13,
        key("load_average_15m"): 0.05,
        key("threads_total"): 99.0,
        key("processes_total"): 4.0,
        key("uptime_seconds"): 199.83,
        **up(1.0),
    }


def gauges_t1() -> Series:
    return {
        key("procs_running"): 3.0,
        key("procs_blocked"): 1.0,
        key("memory_total_bytes"): 24684084 * KIB,
        key("memory_used_bytes"): (24684084 - 24262020) * KIB,
        key("memory_available_bytes"): 24262020 * KIB,
        key("memory_free_bytes"): 24300112 * KIB,
        key("memory_cached_bytes"): (98304 + 75008) * KIB,
        key("memory_buffers_bytes"): 3712 * KIB,
        key("swap_total_bytes"): 2097148 * KIB,
        key("swap_used_bytes"): (2097148 - 1998844) * KIB,
        key("load_average_1m"): 0.52,
        key("load_average_5m"): 0.31,
        key("load_average_15m"): 0.12,
        key("threads_total"): 121.0,
        key("processes_total"): 5.0,
        key("uptime_seconds"): 201.83,
        **up(1.0),
    }


CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ratios(cpu: str, deltas: Sequence[int]) -> Series:
    """Expected ratios for one CPU from its per-state tick deltas between t0 and t1."""
    total = sum(deltas)
    out = {
        key(f"cpu_{s}_ratio", cpu=cpu): d / total for s, d in zip(CPU_STATES, deltas, strict=True)
    }
    out[key("cpu_utilization_ratio", cpu=cpu)] = (total - deltas[3] - deltas[4]) / total
    return out


def rates_t0_t1() -> Series:
    """Every rate and ratio between t0 and t1 (2.0 s apart), from the fixtures' deltas."""
    expected: Series = {
        key("context_switches_per_second"): 2500.0,  # ctxt +5000
        key("forks_per_second"): 20.0,  # processes +40
    }
    # Tick deltas per state (user nice system idle iowait irq softirq steal). cpu1's guest
    # time (+20) is inside its user delta and must not be counted a second time.
    expected |= cpu_ratios("0", (50, 2, 20, 110, 10, 2, 4, 2))
    expected |= cpu_ratios("1", (100, 0, 40, 50, 0, 0, 6, 4))
    expected |= cpu_ratios("total", (150, 2, 60, 160, 10, 2, 10, 6))
    expected |= {
        # vda: reads +100, sectors read +4096, writes +50, sectors written +2048, io_ticks +500
        key("disk_read_bytes_per_second", device="vda"): 4096 * 512 / 2,
        key("disk_write_bytes_per_second", device="vda"): 2048 * 512 / 2,
        key("disk_reads_per_second", device="vda"): 50.0,
        key("disk_writes_per_second", device="vda"): 25.0,
        key("disk_busy_ratio", device="vda"): 0.25,
        # loop1: reads +10, sectors read +80, io_ticks +3; no writes
        key("disk_read_bytes_per_second", device="loop1"): 80 * 512 / 2,
        key("disk_write_bytes_per_second", device="loop1"): 0.0,
        key("disk_reads_per_second", device="loop1"): 5.0,
        key("disk_writes_per_second", device="loop1"): 0.0,
        key("disk_busy_ratio", device="loop1"): 0.0015,
    }
    net = {
        # lo: 8192 bytes and 4 packets each way
        "lo": dict(rx_bytes=4096.0, tx_bytes=4096.0, rx_packets=2.0, tx_packets=2.0),
        # eth0: rx +2e6 B, +1000 pkts, +2 errs, +4 drops; tx +3e5 B, +600 pkts, +1 drop.
        # fifo/frame/multicast/colls/carrier move too, by other amounts, to catch off-by-one
        # column reads.
        "eth0": dict(rx_bytes=1e6, tx_bytes=150000.0, rx_packets=500.0, tx_packets=300.0),
    }
    errors = {"lo": (0.0, 0.0, 0.0, 0.0), "eth0": (1.0, 0.0, 2.0, 0.5)}
    for nic, values in net.items():
        for field, value in values.items():
            expected[key(f"net_{field}_per_second", interface=nic)] = value
        rx_err, tx_err, rx_drop, tx_drop = errors[nic]
        expected[key("net_rx_errors_per_second", interface=nic)] = rx_err
        expected[key("net_tx_errors_per_second", interface=nic)] = tx_err
        expected[key("net_rx_drops_per_second", interface=nic)] = rx_drop
        expected[key("net_tx_drops_per_second", interface=nic)] = tx_drop
    return expected


def test_first_collect_reports_only_gauges(rig: Rig) -> None:
    assert rig.collect_at(FIXTURES / "t0") == gauges_t0()


def test_second_collect_gives_exact_values_for_every_family(rig: Rig) -> None:
    rig.collect_at(FIXTURES / "t0")
    got = rig.collect_at(FIXTURES / "t1", advance_s=2.0)
    assert got == gauges_t1() | rates_t0_t1()


def test_disks_are_whole_devices_that_did_io_and_seen_twice(rig: Rig) -> None:
    rig.collect_at(FIXTURES / "t0")
    got = rig.collect_at(FIXTURES / "t1", advance_s=2.0)
    devices = {dict(labels)["device"] for (name, labels) in got if name.startswith("disk_")}
    # vda1: a partition (no sys/block/vda1); loop0, zram0: never did I/O; nvme0n1: first
    # seen in t1, so it has no rate yet.
    assert devices == {"vda", "loop1"}
    third = rig.collect_at(FIXTURES / "t1", advance_s=1.0)
    assert third[key("disk_reads_per_second", device="nvme0n1")] == 0.0
    assert third[key("disk_reads_per_second", device="vda")] == 0.0


def test_nic_that_disappears_is_dropped_and_a_new_one_waits_a_round(rig: Rig) -> None:
    rig.collect_at(FIXTURES / "t0")
    got = rig.collect_at(FIXTURES / "t1", advance_s=2.0)
    nics = {dict(labels)["interface"] for (name, labels) in got if name.startswith("net_")}
    assert nics == {"lo", "eth0"}  # ifb0 is gone in t1; veth1 is new in t1
    third = rig.collect_at(FIXTURES / "t1", advance_s=1.0)
    nics = {dict(labels)["interface"] for (name, labels) in third if name.startswith("net_")}
    assert nics == {"lo", "eth0", "veth1"}
    assert third[key("net_rx_bytes_per_second", interface="veth1")] == 0.0


def test_counter_going_backwards_skips_that_series_for_one_round(rig: Rig, tmp_path: Path) -> None:
    t1 = copy_snapshot(tmp_path, "t1")
    edit(t1 / "proc/net/dev", "eth0: 98124110", "eth0:     1000")  # reset (interface re-created)
    edit(t1 / "proc/stat", "ctxt 248949", "ctxt 100")
    # io_ticks is a 32-bit millisecond counter: 6320 after 4294967295 is a wrap.
    edit(t1 / "proc/diskstats", "740440 1511 0 6320", "740440 1511 0 10")
    rig.collect_at(FIXTURES / "t0")
    got = rig.collect_at(t1, advance_s=2.0)
    expected = gauges_t1() | rates_t0_t1()
    for gone in (
        key("net_rx_bytes_per_second", interface="eth0"),
        key("context_switches_per_second"),
        key("disk_busy_ratio", device="vda"),
    ):
        del expected[gone]
    assert got == expected
    # The next round restarts from the values after the reset.
    t2 = copy_snapshot(tmp_path, "t1", copy="t2")
    edit(t2 / "proc/net/dev", "eth0: 98124110", "eth0:     5000")
    edit(t2 / "proc/stat", "ctxt 248949", "ctxt 600")
    edit(t2 / "proc/diskstats", "740440 1511 0 6320", "740440 1511 0 410")
    third = rig.collect_at(t2, advance_s=2.0)
    assert third[key("net_rx_bytes_per_second", interface="eth0")] == 2000.0
    assert third[key("context_switches_per_second")] == 250.0
    assert third[key("disk_busy_ratio", device="vda")] == 0.2
    assert all(v >= 0 for v in got.values()) and all(v >= 0 for v in third.values())


def test_cpu_state_stepping_back_counts_as_zero(rig: Rig, tmp_path: Path) -> None:
    t1 = copy_snapshot(tmp_path, "t1")
    # cpu0's iowait goes from 44 to 40: proc(5) says iowait may decrease on tickless kernels.
    edit(t1 / "proc/stat", "cpu0 937 5 629 18445 54", "cpu0 937 5 629 18445 40")
    rig.collect_at(FIXTURES / "t0")
    got = rig.collect_at(t1, advance_s=2.0)
    expected = cpu_ratios("0", (50, 2, 20, 110, 0, 2, 4, 2))
    assert {k: got[k] for k in expected} == expected


def test_cpus_going_offline_or_online_have_no_ratios_that_round(rig: Rig, tmp_path: Path) -> None:
    t1 = copy_snapshot(tmp_path, "t1")
    edit(t1 / "proc/stat", "cpu1 2342 0 916 16621 161 2 35 8 35 0", "cpu2 10 0 5 300 0 0 0 0 0 0")
    rig.collect_at(FIXTURES / "t0")
    got = rig.collect_at(t1, advance_s=2.0)
    cpus = {dict(labels)["cpu"] for (name, labels) in got if name.startswith("cpu_")}
    assert cpus == {"total", "0"}


def test_no_rates_when_the_clock_did_not_advance(rig: Rig) -> None:
    rig.collect_at(FIXTURES / "t0")
    assert rig.collect_at(FIXTURES / "t1", advance_s=0.0) == gauges_t1()


# Each case: the file to break, the text to replace, its replacement, the error after the
# file's path, and the prefixes of the metrics that must be missing from that round.
MALFORMED = [
    pytest.param(
        "proc/meminfo",
        "MemAvailable:   24377088 kB\n",
        "",
        "no MemAvailable field; the file looks truncated",
        ("memory_", "swap_"),
        id="meminfo-truncated",
    ),
    pytest.param(
        "proc/stat",
        "ctxt 243949\n",
        "",
        "no ctxt line; the file looks truncated",
        ("procs_",),
        id="stat-missing-line",
    ),
    pytest.param(
        "proc/stat",
        "cpu0 887 3 609 18335 44 0 5 1 0 0",
        "cpu0 887 3 609 18335",
        "line 2: a cpu line needs 8 time fields, got 4",
        ("procs_",),
        id="stat-short-cpu-line",
    ),
    pytest.param(
        "proc/diskstats",
        " 254       0 vda 29173 7434 1935002 4995 4170 12578 738392 1481 0 5820 6722 4753 43 "
        "119472 235 303 10",
        " 254       0 vda 29173 7434",
        "line 3: expected at least 14 fields, got 5",
        ("disk_",),
        id="diskstats-short-line",
    ),
    pytest.param(
        "proc/net/dev",
        "    2833",
        "    28x3",
        "line 5: expected integers, got '96124110 28x3 0 0 7 3 0 10 157984 1532 0 0 5 2 1 0'; "
        "the file is not in the Linux format this version understands",
        ("net_",),
        id="netdev-not-a-number",
    ),
    pytest.param(
        "proc/loadavg",
        " 0.05 3/99 5701",
        "",
        "expected 'L1 L5 L15 RUNNABLE/THREADS LASTPID', got '0.26 0.13'",
        ("load_", "threads_"),
        id="loadavg-truncated",
    ),
    pytest.param(
        "proc/uptime",
        "199.83 349.06",
        "",
        "expected 'UPTIME IDLE' seconds, got ''",
        ("uptime_",),
        id="uptime-empty",
    ),
]


@pytest.mark.parametrize(("rel", "old", "new", "problem", "missing"), MALFORMED)
def test_malformed_source_is_skipped_and_named(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    rel: str,
    old: str,
    new: str,
    problem: str,
    missing: tuple[str, ...],
) -> None:
    root = copy_snapshot(tmp_path, "t0")
    edit(root / rel, old, new)
    collector = HostCollector(root=root, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="bpfdyno.sources.host.collector"):
        got = as_dict(collector.collect())
        collector.collect()
    assert got[key("host_source_up", source=rel)] == 0.0
    expected = {k: v for k, v in gauges_t0().items() if not k[0].startswith(missing)}
    expected[key("host_source_up", source=rel)] = 0.0
    assert got == expected
    # One log line for the failure, not one per round; it names the file and the problem.
    assert [r.getMessage() for r in caplog.records] == [
        f"host metrics from {rel} skipped: {root / rel}: {problem}"
    ]


def test_missing_files_name_the_file_and_a_fix(tmp_path: Path) -> None:
    root = copy_snapshot(tmp_path, "t0")
    (root / "proc/net/dev").unlink()
    with pytest.raises(ProcfsError) as err:
        procfs.read_net_dev(root)
    assert str(err.value) == (
        f"{root}/proc/net/dev: cannot read it (No such file or directory); "
        "is procfs mounted there and readable?"
    )
    assert err.value.path == root / "proc/net/dev"
    shutil.rmtree(root / "sys")
    with pytest.raises(ProcfsError) as err:
        procfs.read_diskstats(root)
    assert str(err.value) == (
        f"{root}/sys/block: cannot list it (No such file or directory); mount sysfs there so "
        "whole disks can be told from partitions"
    )


def test_source_recovers_after_a_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = copy_snapshot(tmp_path, "t0")
    good = (root / "proc/uptime").read_text()
    (root / "proc/uptime").write_text("garbage\n")
    collector = HostCollector(root=root, clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="bpfdyno.sources.host.collector"):
        assert as_dict(collector.collect())[key("host_source_up", source="proc/uptime")] == 0.0
        (root / "proc/uptime").write_text(good)
        again = as_dict(collector.collect())
    assert again[key("host_source_up", source="proc/uptime")] == 1.0
    assert again[key("uptime_seconds")] == 199.83
    assert caplog.records[-1].getMessage() == "host metrics from proc/uptime are back"


def test_every_source_failing_raises_and_start_refuses(tmp_path: Path) -> None:
    collector = HostCollector(root=tmp_path, clock=FakeClock())
    with pytest.raises(ProcfsError, match=r"none of the host sources could be read; first: "):
        collector.collect()
    with pytest.raises(CollectorUnavailable) as err:
        collector.start()
    assert str(err.value) == (
        f"host metrics need procfs: {tmp_path}/proc/stat: cannot read it (No such file or "
        "directory); is procfs mounted there and readable? (mount it with 'mount -t proc proc "
        f"{tmp_path}/proc')"
    )
    HostCollector(root=FIXTURES / "t0").start()


def test_parsers_return_the_kernel_values() -> None:
    root = FIXTURES / "t0"
    stat = procfs.read_stat(root)
    assert stat.cpus[1] == procfs.CpuTimes(2242, 0, 876, 16571, 161, 2, 29, 4)
    assert stat.cpu_total.total == 3129 + 3 + 1485 + 34906 + 205 + 2 + 34 + 5
    assert (stat.context_switches, stat.forks, stat.boot_time) == (243949, 5700, 1795255084)
    assert procfs.read_loadavg(root) == procfs.LoadAvg(0.26, 0.13, 0.05, 3, 99, 5701)
    assert procfs.read_uptime(root) == procfs.Uptime(199.83, 349.06)
    assert procfs.read_diskstats(root)["vda"] == procfs.DiskStats(
        "vda", 29173, 1935002, 4170, 738392, 5820
    )
    assert procfs.read_net_dev(root)["eth0"] == procfs.NetDev(
        "eth0", 96124110, 2833, 0, 0, 157984, 1532, 0, 0
    )
    assert procfs.count_processes(root) == 4


def test_disk_busy_ratio_is_capped_at_one(rig: Rig, tmp_path: Path) -> None:
    t1 = copy_snapshot(tmp_path, "t1")
    # io_ticks advances in jiffies, so over 2 s it can read a little more than 2000 ms.
    edit(t1 / "proc/diskstats", "740440 1511 0 6320", "740440 1511 0 7830")
    rig.collect_at(FIXTURES / "t0")
    got = rig.collect_at(t1, advance_s=2.0)
    assert got[key("disk_busy_ratio", device="vda")] == 1.0


def test_per_cpu_ratios_every_few_rounds_cover_their_whole_interval(tmp_path: Path) -> None:
    # A node with more CPUs than [daemon] per_cpu_series_max reports each CPU's ratios every
    # few rounds (here 3), over the time since the last report; the totals every round.
    rig = Rig(tmp_path)
    rig.collector = HostCollector(root=rig.root, clock=rig.clock, per_cpu_every=3)
    rig.collect_at(FIXTURES / "t0")
    per_cpu = {k for k in rates_t0_t1() if k[0].startswith("cpu_") and k[1] != (("cpu", "total"),)}
    for _ in range(2):  # t0 again: nothing moved, so no ratios at all; none per CPU
        got = rig.collect_at(FIXTURES / "t0", advance_s=1.0)
        assert not per_cpu & got.keys()
    got = rig.collect_at(FIXTURES / "t1", advance_s=2.0)
    expected = rates_t0_t1()
    assert {k: got[k] for k in per_cpu} == {k: expected[k] for k in per_cpu}
    got = rig.collect_at(FIXTURES / "t1", advance_s=1.0)
    assert not per_cpu & got.keys()
