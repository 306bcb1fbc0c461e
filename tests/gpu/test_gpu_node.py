"""The GPU acceptance suite: bpfdyno on a real GPU node, checked against the driver's own tools
(``pytest -m gpu``; README.md here).

1. The agent's NVML values against ``nvidia-smi`` read at the same moment, under a steady
   CUDA load.
2. GPM (Hopper and newer): plausible under that load, paused by ``dcgm-pause`` and while a
   Kineto trace runs, resumed after.
3. A CUDA trainer traced by iterations and by duration with every kernel track: the window is
   Kineto's, and the file holds GPU kernels, the GPU counter track, net and sched events.
4. Its NCCL calls with their exact arguments.
5. The verdict on its one rank: the step's time split, with a GPU-busy part.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpu_suite import (
    REPORT,
    Agent,
    Checks,
    CudaProcess,
    MetricsWatch,
    Round,
    running,
    smi,
    smi_gpus,
    smi_number,
)
from trace_checks import (
    ALL_TRACKS,
    NoProfilerSpan,
    Trace,
    check_allreduces,
    check_connection,
    check_file,
    check_verdict,
    optimizer_steps,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_node")]

MIB = 1 << 20
#: The trainer's calls (cuda_trainer.py): per step, two all-reduces and one loopback send.
SUM_COUNT, MAX_COUNT, SEND_BYTES = 1_048_583, 4_099, 65_521
ALLREDUCES = {
    (SUM_COUNT, "float32", SUM_COUNT * 4, "sum", "ncclSuccess"),
    (MAX_COUNT, "bfloat16", MAX_COUNT * 2, "max", "ncclSuccess"),
}
ITERATIONS = 5
DURATION_MS = 1500
#: The duration trace starts this long after its request: Kineto warms up for 5 s, and the
#: CLI's start and the trainer's next poll come first.
START_IN_S = 15
#: How many paired readings of the agent and nvidia-smi are compared (their medians).
PAIRS = 5


@pytest.fixture(scope="session")
def watch(agent: Agent) -> Iterator[MetricsWatch]:
    w = MetricsWatch(agent)
    yield w
    w.close()


def gpu_of(watch: MetricsWatch, pid: int) -> str:
    """The NVML index of the GPU where ``pid`` has its memory, as the agent reports it."""
    r = watch.wait_for(
        lambda r: any(
            ls.get("pid") == str(pid) for ls in r.label_sets("gpu_process_memory_used_bytes")
        ),
        f"gpu_process_memory_used_bytes for pid {pid}",
        timeout=30,
    )
    [labels] = [ls for ls in r.label_sets("gpu_process_memory_used_bytes") if ls["pid"] == str(pid)]
    return labels["gpu"]


def gpm_state(agent: Agent) -> str:
    """The GPM part of the gpu collector's status line ("active", "paused (...)"...)."""
    reason = str(agent.collector("gpu")["reason"])
    return reason.split("GPM: ", 1)[1].split("; events", 1)[0] if "GPM: " in reason else reason


def skip_without_gpm(agent: Agent, gpu: str) -> None:
    """Skip on a GPU without GPM (older than Hopper); fail if a Hopper-class one lacks it."""
    state = gpm_state(agent)
    if not state.startswith(("unavailable", "disabled")):
        return
    try:
        caps = {
            r["index"]: smi_number(r["compute_cap"]) for r in smi("--query-gpu=index,compute_cap")
        }
    except AssertionError:  # a driver too old to know the field
        caps = {}
    cap = caps.get(gpu)
    assert cap is None or cap < 9.0, f"GPU {gpu} is compute capability {cap} but GPM: {state}"
    pytest.skip(f"GPU {gpu} has no GPM (compute capability {cap}; the agent says GPM: {state})")


# -- 1 and 2: NVML and GPM under a steady load ----------------------------------------------------


@pytest.fixture(scope="class")
def load(work: Path, agent: Agent) -> Iterator[CudaProcess]:
    with running(CudaProcess("cuda_load.py", [], work)) as p:
        REPORT.facts["torch"] = f"{p.facts['torch']} (CUDA {p.facts['cuda']})"
        yield p


class TestUnderSteadyLoad:
    """With the steady load running (stopped before the trainer starts)."""

    def test_nvml_matches_nvidia_smi(
        self, load: CudaProcess, watch: MetricsWatch, checks: Checks
    ) -> None:
        loaded = gpu_of(watch, load.pid)
        pairs: list[tuple[Round, dict[str, dict[str, str]], float]] = []
        for _ in range(PAIRS):
            r = watch.next(time.time())  # the next round, and nvidia-smi as soon as it came
            pairs.append((r, smi_gpus(), time.time() - r.ts))
        REPORT.facts["skew"] = (
            f"nvidia-smi read {statistics.median(p[2] for p in pairs):.2f} s (median) after "
            "each agent round"
        )
        last = pairs[-1][0]
        for info in last.label_sets("gpu_info"):
            gpu, uuid = info["gpu"], info["uuid"]
            smi_row = pairs[-1][1].get(uuid)
            if not checks.record(f"gpu {gpu} {uuid} listed by nvidia-smi", smi_row is not None, ""):
                continue
            assert smi_row is not None
            checks.equal(f"gpu {gpu} name", info["name"], smi_row["name"])
            checks.equal(f"gpu {gpu} index", gpu, smi_row["index"])
            checks.equal(
                f"gpu {gpu} PCI bus id", info["pci_bus_id"].upper(), smi_row["pci.bus_id"].upper()
            )
            total = last.get("gpu_memory_total_bytes", gpu=gpu)
            checks.near(
                f"gpu {gpu} memory total (MiB)",
                None if total is None else total / MIB,
                smi_number(smi_row["memory.total"]),
                1,  # nvidia-smi's resolution
            )
            checks.near(
                f"gpu {gpu} enforced power limit (W)",
                last.get("gpu_power_limit_watts", gpu=gpu),
                smi_number(smi_row["enforced.power.limit"]),
                0.01,
            )
            compare_moving(checks, gpu, uuid, pairs)
        # The loaded GPU: busy, and the load's own memory as nvidia-smi lists it.
        util = statistics.median(
            r.get("gpu_utilization_ratio", gpu=loaded) or 0 for r, _, _ in pairs
        )
        checks.between(f"gpu {loaded} utilization under the load", util, 0.8, 1.0)
        apps = smi("--query-compute-apps=pid,used_memory")
        want = [smi_number(a["used_memory"]) for a in apps if a["pid"] == str(load.pid)]
        used = last.get("gpu_process_memory_used_bytes", gpu=loaded, pid=str(load.pid))
        checks.near(
            f"gpu {loaded} memory of the load's process (MiB)",
            None if used is None else used / MIB,
            want[0] if want else None,
            1,
        )
        checks.verify()

    def test_gpm_under_load_paused_by_dcgm_pause(
        self, load: CudaProcess, agent: Agent, watch: MetricsWatch, checks: Checks
    ) -> None:
        gpu = gpu_of(watch, load.pid)
        skip_without_gpm(agent, gpu)
        rounds = [watch.next(time.time())]
        rounds += [watch.next(rounds[-1].ts) for _ in range(2)]

        def gpm(name: str) -> float | None:
            values = [v for r in rounds if (v := r.get(name, gpu=gpu)) is not None]
            return statistics.median(values) if values else None

        # bf16 matrix products keep the engine, the SMs and the tensor cores busy.
        checks.between("graphics engine active", gpm("gpu_gr_engine_active_ratio"), 0.8, 1.0)
        checks.between("SM active", gpm("gpu_sm_active_ratio"), 0.5, 1.0)
        checks.between("tensor active", gpm("gpu_tensor_active_ratio"), 0.3, 1.0)
        checks.between("SM occupancy", gpm("gpu_sm_occupancy_ratio"), 1e-6, 1.0)
        checks.between("DRAM bandwidth", gpm("gpu_dram_bw_util_ratio"), 1e-6, 1.0)
        checks.equal("profiling paused before dcgm-pause", gpm("gpu_profiling_paused"), 0.0)

        r = agent.cli("dcgm-pause", "--duration-s", "60")
        try:
            checks.equal("dcgm-pause answer", (r.returncode, r.stdout.strip()), (0, "status: true"))
            paused = watch.wait_for(
                lambda x: x.get("gpu_profiling_paused", gpu=gpu) == 1.0,
                "a round with GPM paused after dcgm-pause",
                timeout=10,
            )
            checks.equal("SM active while paused", paused.get("gpu_sm_active_ratio", gpu=gpu), None)
            state = gpm_state(agent)
            checks.record(
                "status while paused", state.startswith("paused (dcgm-pause, until "), state
            )
        finally:
            r = agent.cli("dcgm-resume")
        resumed_at = time.time()
        checks.equal("dcgm-resume answer", (r.returncode, r.stdout.strip()), (0, "status: true"))
        back = watch.wait_for(
            lambda x: x.ts > resumed_at and x.get("gpu_sm_active_ratio", gpu=gpu) is not None,
            "GPM values after dcgm-resume",
            timeout=10,
        )
        checks.equal(
            "profiling paused after dcgm-resume", back.get("gpu_profiling_paused", gpu=gpu), 0.0
        )
        checks.record("GPM values again", True, f"{back.ts - resumed_at:.1f} s after dcgm-resume")
        checks.verify()


def compare_moving(
    checks: Checks, gpu: str, uuid: str, pairs: list[tuple[Round, dict[str, dict[str, str]], float]]
) -> None:
    """The values that move (memory used, temperature, power, clocks, utilization): the
    medians of the paired readings, within tolerances stated with each."""

    def both(metric: str, scale: float, field: str) -> tuple[float | None, float | None]:
        ours = [v * scale for r, _, _ in pairs if (v := r.get(metric, gpu=gpu)) is not None]
        theirs = [
            v for _, s, _ in pairs if uuid in s and (v := smi_number(s[uuid][field])) is not None
        ]
        return (
            statistics.median(ours) if ours else None,
            statistics.median(theirs) if theirs else None,
        )

    smi_row = pairs[-1][1][uuid]
    limit = smi_number(smi_row["enforced.power.limit"]) or 0.0
    max_sm = smi_number(smi_row["clocks.max.sm"]) or 0.0
    checks.near(
        f"gpu {gpu} memory used (MiB)", *both("gpu_memory_used_bytes", 1 / MIB, "memory.used"), 32
    )
    checks.near(
        f"gpu {gpu} temperature (°C)", *both("gpu_temperature_celsius", 1, "temperature.gpu"), 3
    )
    checks.near(
        f"gpu {gpu} power (W)", *both("gpu_power_watts", 1, "power.draw"), max(10.0, 0.05 * limit)
    )
    checks.near(
        f"gpu {gpu} SM clock (MHz)",
        *both("gpu_sm_clock_hertz", 1e-6, "clocks.sm"),
        max(30.0, 0.1 * max_sm),
    )
    mem_clock = both("gpu_memory_clock_hertz", 1e-6, "clocks.mem")
    checks.near(f"gpu {gpu} memory clock (MHz)", *mem_clock, 0.01 * (mem_clock[1] or 0) + 1)
    checks.near(
        f"gpu {gpu} utilization (%)", *both("gpu_utilization_ratio", 100, "utilization.gpu"), 10
    )


# -- 3, 4 and 5: a traced CUDA trainer ------------------------------------------------------------


@dataclass
class Traced:
    """A trace of the trainer: the merged file, what ``gputrace --wait --json`` said, and
    meanwhile the gpu collector's GPM states and rounds."""

    trace: Trace
    cli: dict[str, Any]
    gpm_states: set[str]
    rounds: list[Round]


@pytest.fixture(scope="class")
def trainer(work: Path, agent: Agent) -> Iterator[CudaProcess]:
    kineto = work / "kineto.conf"  # poll the agent every second rather than every five
    kineto.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
    env = {
        "KINETO_USE_DAEMON": "1",
        "KINETO_IPC_SOCKET_DIR": str(agent.ipc_dir),
        "KINETO_CONFIG": str(kineto),
        "NCCL_SOCKET_IFNAME": "lo",  # world size 1: nothing leaves the node
    }
    store = work / "store"  # the process group's FileStore: a fresh one
    store.unlink(missing_ok=True)
    p = CudaProcess("cuda_trainer.py", ["--store", str(store)], work, env)
    with running(p, timeout=180) as p:
        REPORT.facts["trainer"] = f"torch {p.facts['torch']}, NCCL {p.facts['nccl']}"
        deadline = time.monotonic() + 30
        while str(p.pid) not in agent.cli("trainers").stdout.split():
            assert time.monotonic() < deadline, "the trainer did not register with the agent"
            time.sleep(0.5)
        yield p


@pytest.fixture(scope="class")
def gpu(trainer: CudaProcess, watch: MetricsWatch) -> str:
    return gpu_of(watch, trainer.pid)


@pytest.fixture(scope="class")
def by_iterations(agent: Agent, watch: MetricsWatch, trainer: CudaProcess) -> Traced:
    return trace(agent, watch, trainer.pid, "iterations", lambda: ["--iterations", str(ITERATIONS)])


@pytest.fixture(scope="class")
def by_duration(agent: Agent, watch: MetricsWatch, trainer: CudaProcess) -> Traced:
    # An explicit start, well ahead: with none (0) Kineto starts "now + its 5 s warm-up" and
    # may then find a few ms too few for the warm-up and drop the trace ("insufficient time
    # for warmup", seen with PyTorch 2.13); a start less than 5 s ahead when the config
    # arrives is dropped the same way.
    def how() -> list[str]:
        start_ms = int((time.time() + START_IN_S) * 1000)
        return ["--duration-ms", str(DURATION_MS), "--profile-start-time", str(start_ms)]

    return trace(agent, watch, trainer.pid, "duration", how)


class TestTracedTrainer:
    """The trainer, traced once by iterations and once by duration."""

    def test_traced_by_iterations(
        self, by_iterations: Traced, trainer: CudaProcess, gpu: str, checks: Checks
    ) -> None:
        check_merged(by_iterations, trainer, gpu, checks)
        steps = optimizer_steps(by_iterations.trace)
        checks.equal("optimizer steps in the window", steps, ITERATIONS)
        checks.verify()

    def test_traced_by_duration(
        self, by_duration: Traced, trainer: CudaProcess, gpu: str, checks: Checks
    ) -> None:
        check_merged(by_duration, trainer, gpu, checks)
        lo, hi = by_duration.trace.window
        checks.between("window (s)", (hi - lo) / 1e6, DURATION_MS / 1000 * 0.9, DURATION_MS / 500)
        checks.verify()

    def test_gpm_paused_while_a_kineto_trace_runs(
        self,
        by_duration: Traced,
        agent: Agent,
        watch: MetricsWatch,
        trainer: CudaProcess,
        gpu: str,
        checks: Checks,
    ) -> None:
        skip_without_gpm(agent, gpu)
        states = by_duration.gpm_states
        want = f"paused (Kineto trace in pid {trainer.pid})"
        seen = any(want in state for state in states)
        checks.record("status during the trace", seen, "; ".join(sorted(states)))
        rounds = by_duration.rounds
        paused = [r for r in rounds if r.get("gpu_profiling_paused", gpu=gpu) == 1.0]
        checks.record(
            "rounds paused during the trace", bool(paused), f"{len(paused)} of {len(rounds)}"
        )
        ended = time.time()
        back = watch.wait_for(
            lambda r: r.ts > ended and r.get("gpu_sm_active_ratio", gpu=gpu) is not None,
            "GPM values after the trace",
            timeout=15,
        )
        checks.record("GPM values again after the trace", True, f"{back.ts - ended:.1f} s after")
        checks.verify()

    def test_nccl_calls_have_their_exact_arguments(
        self, by_iterations: Traced, by_duration: Traced, trainer: CudaProcess, checks: Checks
    ) -> None:
        for t in (by_iterations.trace, by_duration.trace):
            check_allreduces(t, trainer.pid, ALLREDUCES, checks)
        checks.verify()

    def test_the_verdict_on_one_rank(
        self, by_duration: Traced, agent: Agent, trainer: CudaProcess, checks: Checks
    ) -> None:
        t = by_duration.trace
        r = agent.cli("trace-summary", str(t.path), "--json", timeout=120)
        assert r.returncode == 0, f"trace-summary failed: {r.stdout}{r.stderr}"
        doc = json.loads(r.stdout)
        [row] = doc["processes"]
        checks.equal("trace-summary: error", row.get("error", ""), "")
        checks.equal("trace-summary: pid", row["pid"], trainer.pid)
        checks.equal("trace-summary: kernel tracks", row["kernel_tracks"], ALL_TRACKS)
        lo, hi = t.window
        checks.near("trace-summary: window (s)", row["window_seconds"], (hi - lo) / 1e6, 1e-6)
        calls = [e for e in t.of("bpfdyno.nccl") if e["name"] == "ncclAllReduce" and t.inside(e)]
        checks.near("trace-summary: NCCL calls (±1 at the edges)", row["nccl_calls"], len(calls), 1)
        headline = check_verdict(t, trainer.pid, checks)  # summarize_file + compare, here
        said = doc.get("verdict", {}).get("headline")
        checks.equal("trace-summary --json: the same verdict", said, headline)
        checks.verify()


def trace(
    agent: Agent, watch: MetricsWatch, pid: int, name: str, how: Callable[[], list[str]]
) -> Traced:
    """``bpfdyno gputrace --kernel-tracks all --wait`` of the trainer (with the options
    ``how()`` gives); meanwhile the gpu collector's GPM state is polled (it pauses while the
    trace runs).

    Kineto once wrote a file without any of its own events (PyTorch 2.13 on a loaded 2-CPU
    machine: no profiler span); such a trace is taken again, once, and the report says so.
    """
    for attempt in (1, 2):
        start = time.time()
        log_file = agent.trace_dir / f"{name}-{attempt}.pt.trace.json"
        run = agent.start_cli(
            *("gputrace", "--pids", str(pid), *how(), "--kernel-tracks", "all", "--json"),
            *("--log-file", str(log_file), "--wait", "--timeout", "60"),
        )
        states = set()
        while run.poll() is None:
            states.add(gpm_state(agent))
            time.sleep(0.5)
        out, err = run.communicate()
        assert run.returncode == 0, f"gputrace {name} failed ({run.returncode}): {err}{out}"
        doc = json.loads(out)
        assert "trace" in doc, f"gputrace {name} traced nothing: {json.dumps(doc['request'])}"
        [part] = doc["trace"]["processes"]
        try:
            t = Trace.load(Path(part["output_path"]))
        except NoProfilerSpan as e:
            if attempt == 2:
                raise
            REPORT.facts[f"{name} trace"] = f"{e}; traced again"
            continue
        return Traced(t, doc, states, watch.rounds_between(start, time.time()))
    raise AssertionError("unreachable")


def check_merged(traced: Traced, trainer: CudaProcess, gpu: str, checks: Checks) -> None:
    """What every trace of the trainer holds: ``gputrace --wait --json`` says it was written
    with every kernel track merged; the file (`check_file`); the trainer's connection."""
    [part] = traced.cli["trace"]["processes"]
    checks.equal("state", part["state"], "PROCESS_TRACE_STATE_WRITTEN")
    tracks = part.get("kernel_tracks", {})
    merged = (tracks.get("state"), tracks.get("merged"))
    checks.equal("kernel tracks merged", merged, ("merged", ALL_TRACKS))
    check_file(traced.trace, trainer.pid, gpu, checks)
    facts = trainer.facts
    check_connection(traced.trace, facts["client"], facts["server"], SEND_BYTES, checks)
