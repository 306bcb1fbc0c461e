"""The Prometheus exporter scraped by a real Prometheus server, checked against the agent.

One agent runs every collector that works here (BPF sched and net, procs, host, perf_sw) plus
the GPU collector on the fake libnvidia-ml; Prometheus scrapes it every second. Values are
read back through Prometheus' HTTP API and compared with the agent's own (gRPC GetMetrics,
GetMetricsWindow, ListProcesses) exactly, and with known inputs where there are some: GPU
values chosen in the fake library, bytes sent between two child processes, wakeups caused.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from export_harness import AgentProcess, PrometheusServer, build_fake_nvml, free_port, wait_for

from bpfdyno.app.catalog import CATALOG
from bpfdyno.core.metrics import MetricKind
from bpfdyno.exporters.prometheus import help_text
from bpfdyno.sources.procs.metrics import PROCESS_LABELS

pytestmark = [pytest.mark.root, pytest.mark.slow]

_spec = importlib.util.spec_from_file_location(
    "gpu_fake_values", Path(__file__).parents[1] / "sources" / "gpu" / "gpu_fake_nvml.py"
)
assert _spec is not None and _spec.loader is not None
_gpu = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _gpu  # dataclasses look their module up there
_spec.loader.exec_module(_gpu)
GPU_VALUES: dict[str, str] = _gpu.DEFAULT_VALUES
H100 = _gpu.H100_UUID

SENT_BYTES = 1_234_567
SLEEPS = 300

# Two children: a receiver and a sender that moves exactly SENT_BYTES over loopback TCP and
# runs 4 extra threads; both then sleep until killed.
RECEIVER = textwrap.dedent(
    """
    import socket, sys, time
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    conn, _ = srv.accept()
    got = 0
    while got < int(sys.argv[1]):
        got += len(conn.recv(65536))
    print(got, flush=True)
    time.sleep(3600)
    """
)
SENDER = textwrap.dedent(
    """
    import socket, sys, threading, time
    for _ in range(4):
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
        s.sendall(b"x" * int(sys.argv[2]))
        print("sent", flush=True)
        time.sleep(3600)
    """
)


class Setup:
    def __init__(self, agent: AgentProcess, prom: PrometheusServer) -> None:
        self.agent = agent
        self.prom = prom


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("prom")
    lib = build_fake_nvml(tmp / "nvml")
    control = tmp / "nvml.ctl"
    control.write_text("".join(f"{k}={v}\n" for k, v in GPU_VALUES.items()))
    port = free_port()
    agent = AgentProcess(
        tmp,
        "export.prometheus.enabled=true",
        f'export.prometheus.listen="127.0.0.1:{port}"',
        f'gpu.library_path="{lib}"',
        "events.process_table_size=100000",  # every process is a row: the children too
        "collectors.dcgm.enabled=false",
        env={"FAKE_NVML_CONTROL": str(control)},
    )
    prom = None
    try:
        prom = PrometheusServer(tmp, f"127.0.0.1:{port}")
        wait_for("a first scrape", lambda: prom.query("up").get(("up", ())) == 1.0 or None, 90)
        yield Setup(agent, prom)
    finally:
        if prom is not None:
            prom.stop()
        agent.stop()


def _spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True
    )


def test_every_family_with_its_type_help_and_unit(setup: Setup) -> None:
    agent, prom = setup.agent, setup.prom
    wait_for(
        "the histogram and the GPU and process families in Prometheus",
        lambda: (
            all(
                prom.query(name)
                for name in (
                    "sched_runqueue_latency_histogram_seconds_count",
                    "gpu_memory_total_bytes",
                    "process_rss_bytes",
                    "bpf_program_runs_per_second",
                )
            )
            or None
        ),
    )
    # Each source's families are there: host, sched and net BPF, perf, GPU (NVML), BPF runs.
    sources = (
        "cpu_user_ratio",
        "sched_context_switches_per_second",
        "gpu_power_watts",
        "net_tcp_sent_bytes_per_second",
        "bpf_program_runs_per_second",
        "perf_page_faults_per_second",
        "gpu_ecc_errors_total",
    )

    def reporting() -> set[str] | None:
        """Every metric the agent keeps reporting (at least twice in the last 30 s: one
        reported once, per-process GPU utilization when NVML took one sample, may fall
        between scrapes), once every source is. An agent nobody read collected every few
        seconds; the scrapes brought it back to its normal cadence, so its sources report
        again within a few rounds of the first scrape."""
        recent = time.time() - 30
        names = {
            name
            for (name, _), pts in agent.window(seconds=30).items()
            if sum(ts > recent for ts, _ in pts) >= 2
        }
        return names if all(n in names for n in sources) else None

    agent_names = wait_for("every source reporting at the scraped cadence", reporting)
    expected = agent_names | {
        "sched_runqueue_latency_histogram_seconds",
        "process_rss_bytes",
        "process_cpu_ratio",
        "process_threads",
        "process_oncpu_seconds_total",
        "process_tcp_sent_bytes_total",
    }

    def missing() -> list[str]:
        scraped = set(prom.api("label/__name__/values"))
        scraped |= {f"{n}_total" for n in scraped} | {n.removesuffix("_count") for n in scraped}
        return sorted(expected - scraped)

    try:
        wait_for("every family in Prometheus", lambda: None if missing() else True, timeout=30)
    except AssertionError:
        raise AssertionError(f"not in Prometheus: {missing()}") from None
    metadata = prom.api("metadata")
    for name in expected:
        spec = CATALOG.get(name)
        assert spec is not None, name
        # OpenMetrics names a counter's family without its _total suffix.
        family = name.removesuffix("_total") if spec.kind is MetricKind.COUNTER else name
        (meta,) = metadata[family]
        want = {
            MetricKind.COUNTER: "counter",
            MetricKind.HISTOGRAM: "histogram",
        }.get(spec.kind, "gauge")
        assert meta["type"] == want, (name, meta)
        assert meta["help"] == help_text(spec), name
        if spec.unit in ("seconds", "bytes", "ratio", "celsius", "watts", "hertz"):
            assert family.endswith(spec.unit)
            assert meta["unit"] == spec.unit, (name, meta)


def test_values_are_the_agents_own_exactly(setup: Setup) -> None:
    agent, prom = setup.agent, setup.prom
    time.sleep(6)  # several rounds and scrapes to compare
    # Prometheus first, then the agent: every round a stored scrape rendered is in the
    # agent's window then, however slow the machine.
    theirs = prom.raw(
        '{__name__=~".+", __name__!~"process_.*|sched_runqueue_latency_hist.*|up|scrape_.*"}', 8
    )
    # Prometheus stamps a sample with the scrape's start; the agent renders it up to the
    # scrape's duration later (at most its 1 s timeout).
    durations = dict(prom.raw("scrape_duration_seconds", 10)[("scrape_duration_seconds", ())])
    ours = agent.window(seconds=60)
    compared = 0
    for key, samples in theirs.items():
        points = ours.get(key)
        assert points is not None, f"{key} is in Prometheus but not in the agent's store"
        for t, v in samples:
            # The value scraped at t is that of one of the agent's latest rounds by the time
            # the scrape was rendered: the latest point of the series by then, or one up to a
            # slow round (5 s) before it, and always the series' previous point: a round is
            # stamped when it starts and reaches the exporter when it ends, so a scrape in
            # between serves the round before. A series' rounds are its part's own: the
            # budget's come with its run-statistics windows, 10 s apart while nothing happens.
            rendered_by = t + durations.get(t, 1.0) + 0.05
            before = sorted((ts, val) for ts, val in points if ts <= rendered_by)
            latest = before[-1][0] if before else t
            previous = before[-2][0] if len(before) > 1 else latest
            candidates = [val for ts, val in before if min(latest - 5.0, previous) <= ts]
            assert any(v == c or (math.isnan(v) and math.isnan(c)) for c in candidates), (
                key,
                t,
                v,
                candidates,
                [(ts - t, val) for ts, val in points if abs(ts - t) < 20],
            )
            compared += 1
    assert compared > 200, compared
    now = prom.query('{__name__=~"gpu_.*|memory_total_bytes"}')
    meminfo = Path("/proc/meminfo").read_text().split("\n")
    mem_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    assert now[("memory_total_bytes", ())] == mem_kib * 1024
    h100 = (("gpu", "0"), ("uuid", H100))
    assert now[("gpu_memory_total_bytes", h100)] == int(GPU_VALUES["gpu.0.mem_total"])
    assert now[("gpu_memory_used_bytes", h100)] == int(GPU_VALUES["gpu.0.mem_used"])
    assert now[("gpu_temperature_celsius", h100)] == int(GPU_VALUES["gpu.0.temp_c"])
    assert now[("gpu_power_watts", h100)] == int(GPU_VALUES["gpu.0.power_mw"]) / 1000
    assert now[("gpu_sm_clock_hertz", h100)] == int(GPU_VALUES["gpu.0.clock_sm_mhz"]) * 1e6
    ecc = (("gpu", "0"), ("type", "corrected"), ("uuid", H100))
    assert now[("gpu_ecc_errors_total", ecc)] == int(GPU_VALUES["gpu.0.ecc_corrected"])


def test_per_process_families_are_the_process_tables_rows(setup: Setup) -> None:
    agent, prom = setup.agent, setup.prom
    receiver = _spawn(RECEIVER, SENT_BYTES)
    sender = None
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        sender = _spawn(SENDER, port, SENT_BYTES)
        assert sender.stdout is not None
        assert sender.stdout.readline().strip() == "sent"
        assert int(receiver.stdout.readline()) == SENT_BYTES

        def scraped(pid: int, name: str) -> float | None:
            got = prom.query(f'{name}{{pid="{pid}"}}')
            return next(iter(got.values())) if got else None

        def settled() -> bool | None:
            ok = scraped(sender.pid, "process_tcp_sent_bytes_total") == SENT_BYTES  # type: ignore[union-attr]
            ok = ok and scraped(receiver.pid, "process_tcp_received_bytes_total") == SENT_BYTES
            ok = ok and scraped(sender.pid, "process_threads") == 5  # type: ignore[union-attr]
            return ok or None

        wait_for("the children's exact traffic and threads in Prometheus", settled)
        rows = {r.pid: r for r in agent.processes()}
        assert rows[sender.pid].tcp_tx_bytes == SENT_BYTES
        assert rows[receiver.pid].tcp_rx_bytes == SENT_BYTES
        series = prom.query(f'process_rss_bytes{{pid="{sender.pid}"}}')
        ((name, labels),) = series
        label_names = {k for k, _ in labels}
        assert label_names <= set(PROCESS_LABELS)
        assert {"pid", "comm", "user"} <= label_names
        assert dict(labels)["comm"] == rows[sender.pid].comm
        assert dict(labels)["user"] == rows[sender.pid].user
        # RSS of a sleeping process does not move: Prometheus has the table's value.
        assert series[(name, labels)] == rows[sender.pid].rss_bytes
    finally:
        for child in (receiver, sender):
            if child is not None:
                child.kill()
                child.wait()


def test_runqueue_latency_is_a_real_histogram(setup: Setup) -> None:
    prom = setup.prom
    count = "sched_runqueue_latency_histogram_seconds_count"
    before = wait_for("a histogram count", lambda: prom.query(count).get((count, ())))
    sleeper = _spawn(f"import time\nfor _ in range({SLEEPS}): time.sleep(0.002)")
    assert sleeper.wait(timeout=60) == 0
    time.sleep(1)  # the sleeps' wakeups are in the next round
    after = wait_for(
        "the sleeper's wakeups in the count",
        lambda: v if (v := prom.query(count).get((count, ()))) and v >= before + SLEEPS else None,
    )
    buckets = prom.query("sched_runqueue_latency_histogram_seconds_bucket")
    by_le = sorted((float(dict(labels)["le"]), v) for (_, labels), v in buckets.items())
    expected_bounds = [2.0 ** (k + 1) * 1e-9 for k in range(36)] + [math.inf]
    assert [le for le, _ in by_le] == pytest.approx(expected_bounds, rel=1e-12)
    counts = [v for _, v in by_le]
    assert counts == sorted(counts), "buckets must be cumulative"
    total = prom.query(count)[(count, ())]
    assert counts[-1] == total >= after
    hist = "sched_runqueue_latency_histogram_seconds"
    mean = prom.query(f"{hist}_sum / {hist}_count")
    (m,) = mean.values()
    assert 0 < m < 1.0, m  # a mean run-queue wait in seconds, not in ns


def test_status_names_the_endpoint(setup: Setup) -> None:
    _, reason = setup.agent.status()["export_prometheus"]
    assert reason.startswith("serving http://127.0.0.1:"), reason
    assert "/metrics" in reason
