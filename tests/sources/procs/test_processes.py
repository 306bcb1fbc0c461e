"""The process table: /proc parsing on a fixture tree (exact values), joins with per-process
providers, selection of the top N plus pinned pids, and flat caches under real churn."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bpfdyno.core import pidfs as procinfo
from bpfdyno.core.errors import InvalidArgument, Unavailable
from bpfdyno.core.events import FlightRecorder
from bpfdyno.rpc.processes import sort_rows
from bpfdyno.services.kernel import KernelService
from bpfdyno.sources.kubelet.podresources import PodRef
from bpfdyno.sources.procs.collector import IDLE_REFRESH_S, ProcsCollector
from bpfdyno.sources.procs.table import ProcessTable

CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
DOCKER_ID = "4f3a" * 16
CRI_ID = "ab12" * 16
POD = "0b1c2d3e-aaaa-bbbb-cccc-1234567890ab"


class FakeProc:
    """A fixture /proc tree; `tick` moves the injected monotonic clock."""

    def __init__(self, root: Path, uptime_s: float = 1000.0, btime: int = 1_700_000_000) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "self").mkdir(exist_ok=True)
        (root / "uptime").write_text(f"{uptime_s} 1.0\n")
        (root / "stat").write_text(f"cpu 1 2 3 4\nbtime {btime}\n")
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def add(
        self,
        pid: int,
        comm: str = "proc",
        ticks: int = 0,
        start_ticks: int = 100,
        rss_pages: int = 10,
        uid: int = 0,
        cmdline: str = "",
        cgroup: str = "0::/user.slice\n",
        environ: dict[str, str] | None = None,
        threads: int = 1,
    ) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        self.set_stat(pid, comm, ticks, start_ticks, rss_pages, threads)
        (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        (d / "cgroup").write_text(cgroup)
        env = environ or {}
        (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))

    def set_stat(
        self,
        pid: int,
        comm: str,
        ticks: int,
        start_ticks: int = 100,
        rss_pages: int = 10,
        threads: int = 1,
    ) -> None:
        utime, stime = ticks // 2, ticks - ticks // 2
        fields = [
            "S", "1", str(pid), str(pid), "0", "-1", "4194560", "10", "0", "0", "0",
            str(utime), str(stime), "0", "0", "20", "0", str(threads), "0", str(start_ticks),
            "1000000", str(rss_pages), "18446744073709551615",
        ]  # fmt: skip
        (self.root / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")

    def remove(self, pid: int) -> None:
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()


@dataclass(frozen=True)
class Sched:
    oncpu_ns: int
    offcpu_runnable_ns: int
    offcpu_blocked_ns: int
    runq_wait_ns: int


@dataclass(frozen=True)
class Net:
    tcp_tx_bytes: int
    tcp_rx_bytes: int
    udp_tx_bytes: int
    udp_rx_bytes: int
    tcp_retransmits: int


def test_stat_parser_handles_odd_comm(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(42, comm="a) b (c", ticks=7, start_ticks=555, rss_pages=12, threads=3)
    st = procinfo.read_stat(tmp_path, 42)
    assert st == procinfo.PidStat("a) b (c", "S", 1, 7, 3, 555, 12)
    assert procinfo.read_stat(tmp_path, 43) is None


def test_stat_parser_agrees_with_the_kernel_for_this_process() -> None:
    st = procinfo.read_stat(Path("/proc"), os.getpid())
    assert st is not None
    assert st.ppid == os.getppid()
    assert st.num_threads == len(os.listdir(f"/proc/{os.getpid()}/task"))
    times = os.times()
    assert abs(st.cpu_ticks / CLK - (times.user + times.system)) < 0.05


def test_a_gpu_process_names_its_pod_for_its_whole_container(tmp_path: Path) -> None:
    """The GPU collector knows the pod of the processes on a pod's GPU (from the kubelet);
    the other processes of that container (same container id) are the same pod's, and those
    of the pod's other containers (same pod uid) the pod's, in no container the kubelet
    named."""
    fp = FakeProc(tmp_path)
    kubepods = f"0::/kubepods/besteffort/pod{POD}"
    fp.add(10, comm="python", ticks=50, cgroup=f"{kubepods}/{CRI_ID}\n")  # on the GPU
    fp.add(11, comm="pt_data_worker", ticks=40, cgroup=f"{kubepods}/{CRI_ID}\n")  # no GPU
    fp.add(12, comm="sidecar", ticks=30, cgroup=f"{kubepods}/{DOCKER_ID}\n")  # another container
    fp.add(13, comm="sshd", ticks=20)  # not in a container
    trainer = PodRef("ml", "train-0", "trainer")
    pods: dict[int, PodRef] = {10: trainer}
    table = ProcessTable(tmp_path, pods=lambda: pods, clock=fp.clock)
    rows = {r.pid: r for r in table.refresh().rows}
    assert {pid: (r.k8s_namespace, r.k8s_pod, r.k8s_container) for pid, r in rows.items()} == {
        10: ("ml", "train-0", "trainer"),
        11: ("ml", "train-0", "trainer"),
        12: ("ml", "train-0", ""),
        13: ("", "", ""),
    }
    assert rows[11].k8s_pod_uid == POD
    pods.clear()  # the GPU process is gone from the GPU: nothing says which pod it is
    fp.now += 1.0
    assert {r.k8s_pod for r in table.refresh().rows} == {""}


@pytest.mark.parametrize(
    ("cgroup", "container", "pod"),
    [
        (f"0::/system.slice/docker-{DOCKER_ID}.scope", DOCKER_ID, ""),
        (f"0::/docker/{DOCKER_ID}", DOCKER_ID, ""),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD.replace('-', '_')}.slice/cri-containerd-{CRI_ID}.scope",
            CRI_ID,
            POD,
        ),
        (f"0::/kubepods/besteffort/pod{POD}/{CRI_ID}", CRI_ID, POD),
        (f"0::/machine.slice/libpod-{CRI_ID}.scope/container", CRI_ID, ""),
        (f"0::/system.slice/crio-{CRI_ID}.scope", CRI_ID, ""),
        ("0::/user.slice/user-1000.slice/session-3.scope", "", ""),
    ],
)
def test_container_and_pod_from_cgroup(cgroup: str, container: str, pod: str) -> None:
    path = cgroup.split("::", 1)[1]
    assert procinfo.container_id(path) == container
    assert procinfo.k8s_pod_uid(path) == pod


def test_cgroup_v1_uses_the_cpu_hierarchy(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(5, cgroup=f"12:memory:/docker/{DOCKER_ID}\n4:cpu,cpuacct:/docker/{DOCKER_ID}\n")
    assert procinfo.read_cgroup(tmp_path, 5) == f"/docker/{DOCKER_ID}"


def test_rows_join_every_source_with_exact_values(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path, uptime_s=1000.0)
    fp.add(
        10,
        comm="python",
        ticks=100,
        start_ticks=50 * CLK,  # started 50 s after boot
        rss_pages=256,
        uid=0,
        cmdline="python train.py --lr 0.1",
        cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n",
        environ={"PATH": "/bin", "SLURM_JOB_ID": "1234"},
    )
    fp.add(11, comm="idle", ticks=0)
    sched = {10: Sched(1_000_000_000, 10, 20, 30)}
    net = {10: Net(1000, 2000, 30, 40, 1)}
    table = ProcessTable(
        tmp_path,
        sched=lambda: sched,
        net=lambda: net,
        gpu_memory=lambda: {10: 8 << 30},
        clock=fp.clock,
    )
    snap = table.refresh()
    assert snap.total_processes == 2
    row = next(r for r in snap.rows if r.pid == 10)
    # First sight: CPU over the process's life (100 ticks over 950 s).
    assert row.cpu_ratio == pytest.approx(100 / CLK / 950.0)
    assert (row.comm, row.cmdline, row.user, row.uid) == (
        "python",
        "python train.py --lr 0.1",
        "root",
        0,
    )
    assert row.rss_bytes == 256 * PAGE
    assert row.start_unix_seconds == 1_700_000_000 + 50
    assert (row.container_id, row.slurm_job_id) == (DOCKER_ID, "1234")
    assert (row.oncpu_ns, row.offcpu_runnable_ns, row.offcpu_blocked_ns, row.runq_wait_ns) == (
        1_000_000_000,
        10,
        20,
        30,
    )
    assert (row.tcp_tx_bytes, row.tcp_rx_bytes, row.udp_tx_bytes, row.udp_rx_bytes) == (
        1000,
        2000,
        30,
        40,
    )
    assert row.gpu_memory_bytes == 8 << 30
    assert row.tcp_tx_bytes_per_second != row.tcp_tx_bytes_per_second  # no baseline yet: NaN
    idle = next(r for r in snap.rows if r.pid == 11)
    assert (idle.tcp_tx_bytes, idle.oncpu_ns, idle.gpu_memory_bytes) == (0, 0, 0)

    # One second later: exact interval rates.
    fp.now = 2.0
    fp.set_stat(10, "python", ticks=100 + CLK // 2, start_ticks=50 * CLK, rss_pages=256)
    sched[10] = Sched(1_250_000_000, 10, 500_000_020, 100_000_030)
    net[10] = Net(1000 + 4000, 2000 + 2000, 30, 40, 3)
    row = next(r for r in table.refresh().rows if r.pid == 10)
    assert row.cpu_ratio == pytest.approx(0.25)
    assert row.oncpu_ratio == pytest.approx(0.125)
    assert row.offcpu_blocked_ratio == pytest.approx(0.25)
    assert row.runq_wait_ratio == pytest.approx(0.05)
    assert row.tcp_tx_bytes_per_second == 2000.0
    assert row.tcp_rx_bytes_per_second == 1000.0
    assert row.tcp_retransmits_per_second == 1.0
    assert row.udp_tx_bytes_per_second == 0.0


def test_unavailable_sources_leave_columns_unknown(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(10)

    def broken() -> dict[int, Net]:
        raise RuntimeError("the net collector is not running: no BTF")

    table = ProcessTable(tmp_path, sched=lambda: None, net=broken, clock=fp.clock)
    snap = table.refresh()
    (row,) = snap.rows
    assert (row.tcp_tx_bytes, row.oncpu_ns, row.gpu_memory_bytes) == (None, None, None)
    assert snap.unavailable == {
        "sched": "the sched collector is not running (see `bpfdyno status`)",
        "net": "RuntimeError: the net collector is not running: no BTF",
    }


def test_slurm_job_is_read_once_per_process(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(20, environ={"SLURM_JOB_ID": "77"}, start_ticks=100)
    table = ProcessTable(tmp_path, clock=fp.clock)
    assert table.refresh().rows[0].slurm_job_id == "77"
    (tmp_path / "20" / "environ").write_bytes(b"SLURM_JOB_ID=88\0")
    assert table.refresh().rows[0].slurm_job_id == "77"  # cached for this process
    fp.set_stat(20, "proc", ticks=0, start_ticks=999)  # the pid now belongs to a new process
    assert table.refresh().rows[0].slurm_job_id == "88"


def test_slurm_job_falls_back_to_the_cgroup(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(21, cgroup="0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    assert ProcessTable(tmp_path, clock=fp.clock).refresh().rows[0].slurm_job_id == "4242"


def test_exec_refreshes_the_command_line(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(30, comm="bash", cmdline="bash -c run")
    table = ProcessTable(tmp_path, clock=fp.clock)
    assert table.refresh().rows[0].cmdline == "bash -c run"
    (tmp_path / "30" / "cmdline").write_bytes(b"torchrun\0--nproc\x002\0")
    fp.set_stat(30, "torchrun", ticks=0)
    assert table.refresh().rows[0].cmdline == "torchrun --nproc 2"


def test_top_n_plus_pinned(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    for pid in range(100, 110):
        fp.add(pid, ticks=0)
    table = ProcessTable(tmp_path, top_n=3, pinned=lambda: {100, 101, 9999}, clock=fp.clock)
    table.refresh()
    fp.now = 1.0
    for pid, ticks in ((105, CLK), (106, CLK // 2), (107, CLK // 4), (108, 1)):
        fp.set_stat(pid, "proc", ticks)
    rows = table.refresh().rows
    assert [r.pid for r in rows] == [105, 106, 107, 100, 101]
    assert [r.pinned for r in rows] == [False, False, False, True, True]
    assert [r.pid for r in sort_rows(rows, "pid")] == [100, 101, 105, 106, 107]
    assert [r.pid for r in sort_rows(rows, "cpu")][:3] == [105, 106, 107]
    with pytest.raises(ValueError, match="unknown sort key 'bogus'; use one of: activity"):
        sort_rows(rows, "bogus")


def test_network_traffic_counts_as_activity(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(1, ticks=0)
    fp.add(2, ticks=0)
    net = {1: Net(0, 0, 0, 0, 0), 2: Net(0, 0, 0, 0, 0)}
    table = ProcessTable(tmp_path, top_n=1, net=lambda: net, clock=fp.clock)
    table.refresh()
    fp.now = 1.0
    fp.set_stat(1, "proc", CLK // 10)  # 10 % of a core
    net[2] = Net(125_000_000, 0, 0, 0, 0)  # 1 Gbit/s: as active as a full core
    (row,) = table.refresh().rows
    assert row.pid == 2
    assert row.activity == pytest.approx(1.0)


async def test_service_filters_sorts_and_limits(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(1, comm="systemd", cmdline="/sbin/init", uid=0)
    fp.add(2, comm="python", cmdline="python train.py", environ={"SLURM_JOB_ID": "9"})
    fp.add(3, comm="python", cmdline="python eval.py", cgroup=f"0::/docker/{DOCKER_ID}\n")
    table = ProcessTable(tmp_path, clock=fp.clock)
    svc = KernelService(FlightRecorder(60, 1 << 20), table=table)
    table.refresh()

    async def pids(**kw: object) -> list[int]:
        return [r.pid for r in (await svc.list_processes(**kw)).rows]  # type: ignore[arg-type]

    assert await pids(sort_by="pid") == [1, 2, 3]
    assert await pids(sort_by="pid", limit=2) == [1, 2]
    assert await pids(sort_by="pid", filter="python") == [2, 3]
    assert await pids(filter="job=9") == [2]
    assert await pids(filter=f"container={DOCKER_ID[:12]}") == [3]
    assert await pids(filter="comm=python train") == [2]
    assert await pids(filter="pid=3 user=root") == [3]
    assert (await svc.list_processes(filter="pid=1")).total_processes == 3
    with pytest.raises(InvalidArgument, match="unknown filter key 'port'"):
        await svc.list_processes(filter="port=80")
    with pytest.raises(InvalidArgument, match="pid must be a number"):
        await svc.list_processes(filter="pid=abc")
    with pytest.raises(InvalidArgument, match="has no value"):
        await svc.list_processes(filter="user=")
    with pytest.raises(InvalidArgument, match="unknown sort key 'size'"):
        await svc.list_processes(sort_by="size")
    with pytest.raises(InvalidArgument, match="limit must be"):
        await svc.list_processes(limit=-1)
    with pytest.raises(Unavailable, match=r"enable \[collectors.net\]"):
        svc.list_connections()


def test_caches_stay_flat_under_process_churn() -> None:
    """2000 short-lived processes: the caches only ever hold pids alive at a refresh."""
    table = ProcessTable(top_n=20)
    table.refresh()
    churn_pids: set[int] = set()
    max_pids_cache = 0
    for _ in range(20):
        batch = [subprocess.Popen(["/bin/sleep", "0.05"]) for _ in range(100)]
        churn_pids.update(p.pid for p in batch)
        snap = table.refresh()
        sizes = table.cache_sizes()
        assert sizes["pids"] <= snap.total_processes
        assert sizes["details"] <= snap.total_processes
        max_pids_cache = max(max_pids_cache, sizes["pids"])
        for p in batch:
            p.wait()
    time.sleep(0.05)
    table.refresh()
    snap = table.refresh()  # both updates the table keeps are after the churn
    sizes = table.cache_sizes()
    assert len(churn_pids) == 2000
    assert sizes["pids"] == snap.total_processes
    # Nothing of the churn is left (a pid the kernel already reused for a live process aside).
    assert table._last is not None and table._prev is not None
    for cache in (table._last.states, table._prev.states, table._last.details):
        assert all(os.path.exists(f"/proc/{pid}") for pid in churn_pids & set(cache))
    assert sizes["details"] == snap.total_processes
    assert sizes["users"] <= 5


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root")
def test_joins_the_real_sched_collector() -> None:
    from bpfdyno.sources.sched.collector import SchedCollector

    sched = SchedCollector()
    sched.start()
    burn = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print(time.process_time(), flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        cpu_s = float(child.stdout.readline())
        # Its last on-CPU slice is accounted when it blocks on stdin: wait for that.
        stat = Path(f"/proc/{child.pid}/stat")
        deadline = time.monotonic() + 5
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "S":
            assert time.monotonic() < deadline, "child never blocked"
            time.sleep(0.005)
        sched.collect()
        table = ProcessTable(top_n=1, sched=sched.per_process, pinned=lambda: {child.pid})
        row = next(r for r in table.refresh().rows if r.pid == child.pid)
        want = sched.per_process()[child.pid]
        assert (row.oncpu_ns, row.offcpu_runnable_ns, row.offcpu_blocked_ns, row.runq_wait_ns) == (
            want.oncpu_ns,
            want.offcpu_runnable_ns,
            want.offcpu_blocked_ns,
            want.runq_wait_ns,
        )
        # The scheduler's on-CPU time agrees with the kernel's CPU accounting (1 tick apart).
        assert row.oncpu_ns is not None and abs(row.oncpu_ns / 1e9 - cpu_s) < 0.02
    finally:
        if child.stdin is not None:
            child.stdin.write("\n")
            child.stdin.close()
        child.wait()
        sched.close()


@dataclass(frozen=True)
class SchedOf:
    """Per-process scheduler totals as the sched collector gives them."""

    oncpu_ns: int
    offcpu_runnable_ns: int = 0
    offcpu_blocked_ns: int = 0
    runq_wait_ns: int = 0


def test_a_process_that_did_not_run_is_not_read_again(tmp_path: Path) -> None:
    # Its on-CPU time and run-queue wait did not move: /proc/PID/stat cannot have changed
    # but for resident memory, which is re-read at least every STAT_MAX_AGE_S.
    from bpfdyno.sources.procs.table import STAT_MAX_AGE_S

    fp = FakeProc(tmp_path)
    fp.add(10, rss_pages=100)
    sched = {10: SchedOf(5_000, offcpu_blocked_ns=1_000)}
    table = ProcessTable(tmp_path, sched=lambda: sched, clock=fp.clock)
    assert table.refresh().rows[0].rss_bytes == 100 * PAGE
    fp.now = 1.0
    fp.set_stat(10, "proc", ticks=0, rss_pages=90)  # reclaim took some pages meanwhile
    sched[10] = SchedOf(5_000, offcpu_blocked_ns=1_000_001_000)  # slept for the second
    (row,) = table.refresh().rows
    assert row.rss_bytes == 100 * PAGE  # not read again
    assert row.offcpu_blocked_ratio == pytest.approx(1.0)  # the sched columns are current
    assert row.offcpu_blocked_ns == 1_000_001_000
    fp.now = 1.0 + STAT_MAX_AGE_S
    assert table.refresh().rows[0].rss_bytes == 90 * PAGE  # read again: it was too old
    fp.now += 1.0
    fp.set_stat(10, "proc", ticks=CLK, rss_pages=80)
    sched[10] = SchedOf(1_000_005_000)  # it ran: read at once
    (row,) = table.refresh().rows
    assert (row.rss_bytes, row.cpu_ratio) == (80 * PAGE, pytest.approx(1.0))


def test_rows_are_built_only_while_someone_reads_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bpfdyno.sources.procs import table as table_mod

    builds = []
    build = ProcessTable._build

    def counting(self: ProcessTable) -> table_mod.ProcessSnapshot:
        builds.append(1)
        return build(self)

    monkeypatch.setattr(ProcessTable, "_build", counting)
    fp = FakeProc(tmp_path)
    fp.add(1, comm="init")
    fp.add(2, comm="worker")
    table = ProcessTable(tmp_path, clock=fp.clock)
    assert table.update() == 2
    assert builds == []  # nobody has read it
    assert sorted((r.pid, r.comm) for r in table.snapshot.rows) == [(1, "init"), (2, "worker")]
    assert len(builds) == 1
    assert table.snapshot.rows and len(builds) == 1  # built once per update
    fp.now = table_mod.DEMAND_S / 2
    fp.remove(2)
    assert table.update() == 1
    assert len(builds) == 2  # read recently: built by the update itself
    assert [r.pid for r in table.snapshot.rows] == [1]
    assert len(builds) == 2
    fp.now += table_mod.DEMAND_S + 1
    table.update()
    assert len(builds) == 2  # nobody read it lately: not built


def test_the_collector_refreshes_every_round_only_while_the_table_is_read(tmp_path: Path) -> None:
    fp = FakeProc(tmp_path)
    fp.add(100, ticks=10)
    table = ProcessTable(tmp_path, clock=fp.clock)
    collector = ProcsCollector(table, clock=fp.clock)

    def cpu_ratio_after(seconds: float, ticks: int) -> float:
        fp.now += seconds
        fp.set_stat(100, "proc", ticks, 100, 10, 1)
        collector.collect()
        (row,) = table.snapshot.rows
        return row.cpu_ratio

    collector.collect()
    # Nobody read it: rounds within IDLE_REFRESH_S keep the last refresh (no new reading).
    first = collector.collect()
    fp.now += 1.0
    assert collector.collect() is first
    # Read now (a `ps`): from here on every round refreshes, its rates over one round.
    fp.now += IDLE_REFRESH_S
    assert cpu_ratio_after(0.0, 10 + 6 * CLK) == pytest.approx(6 / (1 + IDLE_REFRESH_S))
    assert cpu_ratio_after(1.0, 10 + 7 * CLK) == pytest.approx(1.0)
    assert cpu_ratio_after(1.0, 10 + 7 * CLK) == 0.0
