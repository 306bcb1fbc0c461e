"""A real multi-rank training job on this machine, an agent tracing it, and faults to inject
on one rank at a time: the proof that the verdict (`bpfdyno.analysis.verdict`) names the rank
that holds a job back, and why.

- **Network**: each rank in its own network namespace, its ``eth0`` a veth joined to a
  bridge in a namespace of its own, so every rank has its own address (``10.18.0.10+i``)
  and its traffic with the others crosses a real link that can lose packets. Every name
  carries this process's pid: several runs may share the machine.
- **Job**: one ``torchrun`` per "node" (``--nnodes N --node-rank i --nproc-per-node 1``,
  static rendezvous on rank 0's address), each launched inside its rank's namespace and
  pinned to a CPU; the ranks (``trainers/ddp.py``, DDP on gloo over TCP) read each
  step's batch from a FIFO written by a feeder process (``trainers/batch_feeder.py``), and
  register with the agent through ``KINETO_IPC_SOCKET_DIR`` (a socket file, reachable from
  every namespace; the abstract ``@dynolog@`` name is per namespace).
- **Agent**: a real ``bpfdyno serve`` (no collectors: the capture of the traced processes'
  kernel tracks is all this needs), asked through its gRPC API as a client would.
- **Faults**, each on one rank and removed afterwards: a busy process pinned to the rank's
  CPU (`cpu_hog`), random loss of the TCP packets the rank receives (`packet_loss`,
  nftables in the rank's namespace), a feeder that delivers each batch late (`slow_batches`),
  a link that delays (and may lose) what the rank sends (`slow_link`: its veth replaced by a
  wire through `delay_wire.py`, this kernel having no netem), a bandwidth cap on what it
  sends (`bandwidth_cap`, tbf), a CPU quota on the rank's process (`cpu_quota`, a cgroup of
  the cpu controller); with ``loader_workers`` (each step also takes an item from a
  DataLoader with that many worker processes) a slow DataLoader worker (`slow_worker`);
  and, through each rank's knobs file (``ddp.py --knobs``): more work
  per step (`more_work`), reads of a data file whose pages are dropped from the page cache
  each step (`evicted_reads`), the same on a disk throttled for the rank (`throttled_disk`,
  the blkio controller); an interrupt storm on the rank's CPU (`interrupt_storm`: UDP
  packets from a namespace of their own, received by the rank's CPU through receive packet
  steering).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from memory_limit import memory_limited

from bpfdyno.core.config import KNOWN_COLLECTORS
from bpfdyno.rpc.diagnosis import RankEvidence, Verdict
from bpfdyno.rpc.traces import ProcessSummary, TraceSummary
from bpfdyno.rpc.v1 import agent_pb2, agent_pb2_grpc, tracing_pb2, tracing_pb2_grpc
from bpfdyno.rpc.wire import from_pb

TRAINERS = Path(__file__).resolve().parent / "trainers"
WIRE = Path(__file__).resolve().parent / "delay_wire.py"
FLOOD = Path(__file__).resolve().parent / "udp_flood.py"
#: The size of a rank's data file (`StragglerJob.data_file`).
DATA_FILE_BYTES = 64 << 20
#: The UDP port the interrupt storm's packets go to (nothing listens on it).
FLOOD_PORT = 9
SUBNET = "10.18.0"
MASTER_PORT = 29500
#: The ranks' job id (libkineto reports $SLURM_JOB_ID with its polls).
JOB_ID = 1818
#: Sleep at the end of each step: the ranks' steps are light, most of a step is this.
STEP_SLEEP_MS = 30.0
#: The slow feeder's wait before each batch.
SLOW_BATCH_MS = 120.0
#: The name the CPU hog gives itself (prctl PR_SET_NAME), so the verdict can be checked to
#: name it.
HOG_NAME = "stress-hog"
#: Its weight (its nice, and its session's with autogroups). At equal weight a rank that
#: sleeps most of its step hardly waits: EEVDF gives a sleeper its lag back. Against the
#: ranks' `RANK_NICE` it holds the job back about 40 % of the time (docs/tracing.md).
HOG_NICE = -20
#: The ranks' weight: a little above other work's, so that other processes on the machine
#: (a benchmark pinned to CPU 0 was seen) do not make a healthy rank a straggler.
RANK_NICE = -3

HOG_CODE = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)  # PR_SET_NAME
os.sched_setaffinity(0, {int(sys.argv[2])})
os.write(1, b"spinning\\n")
while True:
    pass
"""


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    """Poll ``pred`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def run(*argv: str, stdin: str | None = None) -> None:
    """Run a set-up command; fail with its stderr."""
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")


# -- network ---------------------------------------------------------------------------------


class Network:
    """N namespaces with one address each, joined by veth pairs to a bridge namespace."""

    def __init__(self, ranks: int) -> None:
        tag = f"bds{os.getpid()}"
        self.bridge_ns = f"{tag}-br"
        self.namespaces = [f"{tag}-r{i}" for i in range(ranks)]
        self.addresses = [f"{SUBNET}.{10 + i}" for i in range(ranks)]
        self.flood_ns = f"{tag}-fl"

    def create(self) -> None:
        if shutil.which("ip") is None or shutil.which("nft") is None:
            raise AssertionError(
                "the straggler job needs iproute2 and nftables (`vagrant/bootstrap.sh test` "
                "installs both)"
            )
        br = self.bridge_ns
        run("ip", "netns", "add", br)
        run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", br, "link", "set", "br0", "up")
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses, strict=True)):
            run("ip", "netns", "add", ns)
            # Both ends are made inside the namespaces: no name is taken in the host's.
            run("ip", "-n", br, "link", "add", f"v{i}", "type", "veth",
                "peer", "name", "eth0", "netns", ns)  # fmt: skip
            run("ip", "-n", br, "link", "set", f"v{i}", "master", "br0", "up")
            run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")

    def add_flooder(self) -> str:
        """A namespace of its own on the bridge, address ``.99``, to send an interrupt storm
        from; returns its name."""
        ns, br = self.flood_ns, self.bridge_ns
        run("ip", "netns", "add", ns)
        run("ip", "-n", br, "link", "add", "vfl", "type", "veth", "peer", "name", "eth0",
            "netns", ns)  # fmt: skip
        run("ip", "-n", br, "link", "set", "vfl", "master", "br0", "up")
        run("ip", "-n", ns, "addr", "add", f"{SUBNET}.99/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        return ns

    def steer(self, ns: str, device: str, cpus: set[int]) -> None:
        """Receive packet steering: what ``device`` in ``ns`` receives is processed (the
        NET_RX softirq, raised by an IPI) on ``cpus``; empty: where it arrives."""
        mask = f"{sum(1 << c for c in cpus):x}"
        run("ip", "netns", "exec", ns, "sh", "-c",
            f"echo {mask} > /sys/class/net/{device}/queues/rx-0/rps_cpus")  # fmt: skip

    def delete(self) -> None:
        for ns in [*self.namespaces, self.bridge_ns, self.flood_ns]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def drop_input(self, rank: int, per_mille: int) -> None:
        """Drop at random ``per_mille``/1000 of the TCP packets rank ``rank`` receives.

        Ingress, not egress: a packet dropped on its way out of the sender's own stack is
        reported back to TCP and re-sent at once, never seen as a retransmit; one lost on
        the wire (here: at the receiver) is, after a timeout or duplicate ACKs."""
        rules = (
            "table inet bpfdyno_loss {\n"
            "  chain input {\n"
            "    type filter hook input priority 0; policy accept;\n"
            f"    meta l4proto tcp numgen random mod 1000 < {per_mille} drop\n"
            "  }\n"
            "}\n"
        )
        run("ip", "netns", "exec", self.namespaces[rank], "nft", "-f", "-", stdin=rules)

    def mac(self, rank: int) -> str:
        out = subprocess.run(
            ["ip", "-n", self.namespaces[rank], "-j", "link", "show", "eth0"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return str(json.loads(out)[0]["address"])

    def _plug(self, rank: int, rank_end: str, bridge_end: str, mac: str) -> None:
        """Make ``rank_end`` (in the rank's namespace) its eth0 with its address and MAC,
        and ``bridge_end`` a port of the bridge: the peers' ARP entries stay right."""
        ns, br = self.namespaces[rank], self.bridge_ns
        run("ip", "-n", ns, "link", "set", rank_end, "name", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "address", mac)
        run("ip", "-n", ns, "addr", "add", f"{self.addresses[rank]}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", br, "link", "set", bridge_end, "master", "br0", "up")

    def to_wire(self, rank: int, wire: str) -> None:
        """Replace rank ``rank``'s veth by the wire's TAP devices ``{wire}a`` (the rank's
        side) and ``{wire}b``, created in this namespace by a running `delay_wire.py`."""
        mac = self.mac(rank)
        run("ip", "link", "set", f"{wire}a", "netns", self.namespaces[rank])
        run("ip", "link", "set", f"{wire}b", "netns", self.bridge_ns)
        run("ip", "-n", self.bridge_ns, "link", "del", f"v{rank}")  # its eth0 goes with it
        self._plug(rank, f"{wire}a", f"{wire}b", mac)

    def to_veth(self, rank: int, mac: str) -> None:
        """A veth again for rank ``rank`` (after its wire went away), with its MAC."""
        ns = self.namespaces[rank]
        run("ip", "-n", self.bridge_ns, "link", "add", f"v{rank}", "type", "veth",
            "peer", "name", "new0", "netns", ns)  # fmt: skip
        self._plug(rank, "new0", f"v{rank}", mac)

    def stop_dropping(self, rank: int) -> None:
        run("ip", "netns", "exec", self.namespaces[rank], "nft", "delete", "table", "inet",
            "bpfdyno_loss")  # fmt: skip


# -- processes -------------------------------------------------------------------------------


@dataclass
class Proc:
    """A process we started in its own session, its stdout lines kept in a file."""

    popen: subprocess.Popen[bytes]
    out: Path
    answers_read: int = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def lines(self) -> list[str]:
        return self.out.read_text(errors="replace").splitlines() if self.out.exists() else []

    def send(self, command: str) -> None:
        """A command line on its stdin (see ``trainers/batch_feeder.py``)."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(f"{command}\n".encode())
        self.popen.stdin.flush()

    def answer(self, word: str, timeout: float = 60) -> int:
        """The number of its next answer line ``WORD N``."""
        found: list[int] = []

        def answered() -> bool:
            for i, line in enumerate(self.lines()[self.answers_read :], self.answers_read):
                if line.startswith(f"{word} "):
                    found.append(int(line.split()[1]))
                    self.answers_read = i + 1
                    return True
            return False

        wait_for(answered, timeout, f"{self.out.name}: '{word} N'", step=0.02)
        return found[0]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


#: What every child is started under: SIGKILL it when the process that started it dies,
#: however that dies. A run killed outright (SIGKILL, an out-of-memory kill) must not leave a
#: CPU hog or a packet storm behind: another run on the machine would take it for its own
#: fault (the death signal survives exec, so ``ip netns exec`` and ``taskset`` pass it on).
#: Not a preexec_fn: that makes subprocess fork() the whole threaded test process, and
#: gRPC's fork handler then waits for the test's open RPCs (a WatchEvents stream) forever,
#: where no test timeout can interrupt it (seen: a test hung for good in fork()).
DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


def spawn(
    argv: Sequence[str], out: Path, env: dict[str, str] | None = None, stdin: bool = False
) -> Proc:
    with open(out, "wb") as f:
        popen = subprocess.Popen(
            [*DIE_WITH_PARENT, *argv],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Proc(popen, out)


def _ancestors(pid: int) -> set[int]:
    """The processes above ``pid``, up to init (an empty set when it is gone)."""
    out: set[int] = set()
    while pid > 1:
        try:
            # The parent is the field after the state, past the command name's ")".
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        out.add(pid)
    return out


def foreign_faults() -> dict[int, str]:
    """The CPU hogs (named `HOG_NAME`) and interrupt storms (`FLOOD`) on this machine that
    this process did not start: another run's faults, which would make this run's ranks
    late for a reason of theirs (pid -> what it is)."""
    me = os.getpid()
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm == HOG_NAME:
            what = HOG_NAME
        elif any(Path(arg.decode(errors="replace")).name == FLOOD.name for arg in cmdline):
            what = FLOOD.name  # any checkout's: other sessions run this job from their own
        else:
            continue
        if me not in _ancestors(pid):
            found[pid] = what
    return found


def set_weight(pid: int, nice: int) -> None:
    """Give process ``pid`` (each of its threads, and its session with autogroups, where
    CPU weight is shared per session first) the CPU weight of ``nice``."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(nice))
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children first found through /proc)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        out += map(int, children)
        todo += map(int, children)
    return out


# -- agent -----------------------------------------------------------------------------------


class Agent:
    """A ``bpfdyno serve`` with only the tracing component (and its kernel-track capture)."""

    def __init__(self, base: Path, interrupts: bool = False) -> None:
        self.base = base
        self.sock = base / "agent.sock"
        self.socket_dir = base / "k"  # the trainers' KINETO_IPC_SOCKET_DIR
        self.trace_dir = base / "traces"
        self.socket_dir.mkdir()
        self.trace_dir.mkdir()
        self.log = base / "agent.log"
        lines = [
            "[grpc]",
            f"socket = {json.dumps(str(self.sock))}",
            "[kineto]",
            f"socket_dir = {json.dumps(str(self.socket_dir))}",
            "[tracing]",
            f"allowed_dirs = [{json.dumps(str(self.trace_dir))}]",
            "[legacy_rpc]",
            "enabled = false",
        ]
        for c in KNOWN_COLLECTORS:
            # The interrupt collector, when asked for: the fabric track's interrupt time.
            on = interrupts and c == "irq"
            lines += [f"[collectors.{c}]", f"enabled = {'true' if on else 'false'}"]
        self.config = base / "bpfdyno.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: Proc | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETO_", "SLURM_"))}
        self.proc = spawn(
            [sys.executable, "-m", "bpfdyno", "serve", "--config", str(self.config)],
            self.log,
            env,
        )

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.popen.poll() is not None:
                raise AssertionError(f"the agent exited:\n{self.log.read_text()[-3000:]}")
            try:
                with self.channel() as ch:
                    agent_pb2_grpc.AgentStub(ch).GetStatus(agent_pb2.GetStatusRequest(), timeout=2)
            except grpc.RpcError:
                return False
            return True

        wait_for(ready, 90, "the agent to serve")

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self.sock}")

    def trainers(self) -> list[tracing_pb2.Trainer]:
        with self.channel() as ch:
            resp = tracing_pb2_grpc.TracingStub(ch).ListTrainers(
                tracing_pb2.ListTrainersRequest(job_id=JOB_ID), timeout=10
            )
        return list(resp.trainers)

    def stop(self) -> None:
        if self.proc is not None and self.proc.popen.poll() is None:
            self.proc.popen.send_signal(signal.SIGTERM)
            try:
                self.proc.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- the job ---------------------------------------------------------------------------------


@dataclass
class Trace:
    """One trace of the job: each rank's file summarised by the agent, and its verdict."""

    name: str
    trace_id: str
    summaries: list[ProcessSummary]
    verdict: Verdict
    seconds: float  # from the request to the verdict

    @property
    def evidence(self) -> dict[int, RankEvidence]:
        return {s.evidence.rank: s.evidence for s in self.summaries if s.evidence is not None}

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.summaries]


@dataclass
class StragglerJob:
    """The network, the agent, the feeders and the ranks (see the module doc).

    Args:
        base: a short directory of its own (Unix socket paths are limited).
        ranks: how many ranks.
        cpus: the CPU each rank (its torchrun and everything under it) is pinned to.
        interrupts: run the agent's interrupt collector (for the ``fabric`` track's
            interrupt time: `interrupt_storm`).
        train_seconds: how long the ranks train before they exit (a run that watches the
            job longer must say so: after it, the job stops stepping).
    """

    base: Path
    ranks: int
    cpus: Sequence[int]
    interrupts: bool = False
    network: Network = field(init=False)
    agent: Agent = field(init=False)
    feeders: list[Proc] = field(default_factory=list)
    launchers: list[Proc] = field(default_factory=list)
    rank_pids: dict[int, int] = field(default_factory=dict)
    traces: list[Trace] = field(default_factory=list)
    #: DataLoader worker processes per rank (0: the ranks have no DataLoader).
    loader_workers: int = 0
    train_seconds: float = 3600.0

    def __post_init__(self) -> None:
        self.network = Network(self.ranks)
        self.agent = Agent(self.base, self.interrupts)

    def start(self) -> None:
        self.network.create()
        self.agent.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETO_", "SLURM_"))}
        env.update(
            KINETO_USE_DAEMON="1",
            KINETO_IPC_SOCKET_DIR=str(self.agent.socket_dir),
            KINETO_CONFIG=str(TRAINERS / "kineto.conf"),
            SLURM_JOB_ID=str(JOB_ID),
            # gloo binds to the address of the host name (127.0.0.1 here) unless told which
            # interface: the rank's veth.
            GLOO_SOCKET_IFNAME="eth0",
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            # Kineto's INFO log: each config it gets and when it starts (failure messages).
            KINETO_LOG_LEVEL="1",
        )
        for i in range(self.ranks):
            fifo = self.base / f"batches-{i}"
            os.mkfifo(fifo)
            feeder = [sys.executable, str(TRAINERS / "batch_feeder.py"), str(fifo)]
            self.feeders.append(spawn(feeder, self.base / f"feeder-{i}.out", stdin=True))
            launcher = [
                "ip", "netns", "exec", self.network.namespaces[i],
                "taskset", "-c", str(self.cpus[i]),
                sys.executable, "-m", "torch.distributed.run",
                f"--nnodes={self.ranks}", f"--node-rank={i}", "--nproc-per-node=1",
                f"--master-addr={self.network.addresses[0]}", f"--master-port={MASTER_PORT}",
                str(TRAINERS / "ddp.py"), f"--batches={fifo}", f"--knobs={self.knobs(i)}",
                f"--sleep-ms={STEP_SLEEP_MS}", f"--seconds={self.train_seconds:g}",
                f"--loader-workers={self.loader_workers}",
                f"--worker-delay-file={self.worker_delay_file(i)}",
            ]  # fmt: skip
            self.launchers.append(spawn(launcher, self.base / f"rank-{i}.out", env))
        wait_for(self._all_ready, 180, "every rank to train", step=0.5)
        for pid in self.rank_pids.values():
            set_weight(pid, RANK_NICE)
        wait_for(
            lambda: (
                len([t for t in self.agent.trainers() if t.pid in self.rank_pids.values()])
                == self.ranks
            ),
            60,
            "every rank to register with the agent",
        )

    def _all_ready(self) -> bool:
        for i, launcher in enumerate(self.launchers):
            if launcher.popen.poll() is not None:
                raise AssertionError(f"rank {i}'s torchrun exited:\n{self.diagnostics()}")
            for line in launcher.lines():
                if line.startswith("ready "):
                    _, pid, _, rank = line.split()
                    self.rank_pids[int(rank)] = int(pid)
        return len(self.rank_pids) == self.ranks

    def diagnostics(self) -> str:
        """The ends of every log, for a failure message."""
        parts = []
        for p in [*self.launchers, *self.feeders]:
            parts.append(f"--- {p.out.name}:\n" + "\n".join(p.lines()[-15:]))
        if self.agent.log.exists():
            parts.append("--- agent.log:\n" + self.agent.log.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    def close(self) -> None:
        # torchrun starts its workers in a session of their own: found under it, not in its
        # process group (a rank that never got ready is not in rank_pids).
        workers = {pid for launcher in self.launchers for pid in _descendants(launcher.pid)}
        for launcher in self.launchers:
            launcher.kill()
        for pid in workers | set(self.rank_pids.values()):
            _kill_pid(pid)
        for feeder in self.feeders:
            feeder.kill()
        self.agent.stop()
        self.network.delete()

    # -- faults ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def cpu_hog(self, rank: int, nice: int = HOG_NICE) -> Iterator[Proc]:
        """A busy process named `HOG_NAME` pinned to rank ``rank``'s CPU, at ``nice``."""
        hog = spawn(
            [sys.executable, "-c", HOG_CODE, HOG_NAME, str(self.cpus[rank])],
            self.base / "hog.out",
        )
        try:
            wait_for(lambda: "spinning" in hog.lines(), 30, "the CPU hog to spin")
            set_weight(hog.pid, nice)
            yield hog
        finally:
            hog.kill()

    @contextlib.contextmanager
    def packet_loss(self, rank: int, per_mille: int) -> Iterator[None]:
        """Random loss of the TCP packets rank ``rank`` receives."""
        self.network.drop_input(rank, per_mille)
        try:
            yield
        finally:
            self.network.stop_dropping(rank)

    @contextlib.contextmanager
    def slow_link(self, rank: int, delay_ms: float, loss: float = 0.0) -> Iterator[None]:
        """Everything rank ``rank`` sends is held ``delay_ms`` on its link (and lost with
        probability ``loss``) on the way to the others; what it receives is not: a delay on
        the sender's side only, one-way loss on the wire."""
        wire_name = f"w{os.getpid() % 100000}r{rank}"
        wire = spawn(
            [sys.executable, str(WIRE), f"{wire_name}a", f"{wire_name}b", str(delay_ms), "0",
             str(loss), "0"],
            self.base / f"wire-{rank}.out",
        )  # fmt: skip
        mac = self.network.mac(rank)
        try:
            wait_for(lambda: "ready" in wire.lines(), 30, "the wire to be ready")
            self.network.to_wire(rank, wire_name)
            yield
        finally:
            wire.kill()  # its TAP devices, the rank's eth0 among them, go with it
            self.network.to_veth(rank, mac)

    @contextlib.contextmanager
    def bandwidth_cap(self, rank: int, rate: str) -> Iterator[None]:
        """What rank ``rank`` sends is limited to ``rate`` (tc's words: ``2mbit``), queued
        up to 200 ms beyond it."""
        ns = self.network.namespaces[rank]
        run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
            "rate", rate, "burst", "16kb", "latency", "200ms")  # fmt: skip
        try:
            yield
        finally:
            run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root")

    @contextlib.contextmanager
    def cpu_quota(self, rank: int, quota_us: int, period_us: int = 100_000) -> Iterator[Path]:
        """Rank ``rank``'s process (all its threads) in a cgroup of its own with ``quota_us``
        of CPU time per ``period_us``: what a Kubernetes CPU limit does."""
        root = Path("/sys/fs/cgroup/cpu")
        v2 = not (root / "cpu.cfs_quota_us").exists()
        if v2:
            root = Path("/sys/fs/cgroup")
        d = root / f"bds{os.getpid()}-r{rank}"
        d.mkdir()
        pid = self.rank_pids[rank]
        try:
            if v2:
                (d / "cpu.max").write_text(f"{quota_us} {period_us}")
            else:
                (d / "cpu.cfs_period_us").write_text(str(period_us))
                (d / "cpu.cfs_quota_us").write_text(str(quota_us))
            (d / "cgroup.procs").write_text(str(pid))
            yield d
        finally:
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(str(pid))
            d.rmdir()

    @contextlib.contextmanager
    def slow_batches(self, rank: int, ms: float = SLOW_BATCH_MS) -> Iterator[None]:
        """Rank ``rank``'s feeder waits ``ms`` before each batch."""
        self.feeders[rank].send(f"slow {ms}")
        try:
            yield
        finally:
            self.feeders[rank].send("fast")

    def worker_delay_file(self, rank: int) -> Path:
        """The file rank ``rank``'s DataLoader workers read their delay per item from."""
        return self.base / f"worker-delay-{rank}"

    @contextlib.contextmanager
    def slow_worker(self, rank: int, ms: float) -> Iterator[None]:
        """Rank ``rank``'s DataLoader workers wait ``ms`` before each item (``loader_workers``
        must be set): its main thread waits for them inside ``enumerate(DataLoader)``."""
        if not self.loader_workers:
            raise ValueError("slow_worker needs a job started with loader_workers >= 1")
        path = self.worker_delay_file(rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{ms}")
        tmp.replace(path)  # whole: a worker never reads half a number
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def knobs(self, rank: int) -> Path:
        return self.base / f"knobs-{rank}.json"

    def set_knobs(self, rank: int, **knobs: object) -> None:
        """Rank ``rank``'s fault knobs (``ddp.py --knobs``), whole: it reads them at its next
        step. Written aside and renamed, so the rank never reads half a file."""
        new = self.knobs(rank).with_suffix(".new")
        new.write_text(json.dumps(knobs))
        new.rename(self.knobs(rank))

    def data_file(self, rank: int) -> Path:
        """Rank ``rank``'s data file (`DATA_FILE_BYTES` of random bytes, on the disk under
        the job's directory), written once."""
        path = self.base / f"data-{rank}"
        if not path.exists():
            with open(path.with_suffix(".new"), "wb") as f:
                for _ in range(DATA_FILE_BYTES >> 20):
                    f.write(os.urandom(1 << 20))
                os.fsync(f.fileno())
            path.with_suffix(".new").rename(path)
        return path

    @contextlib.contextmanager
    def more_work(self, rank: int, ms: float) -> Iterator[None]:
        """Rank ``rank`` computes ``ms`` more CPU time each step."""
        self.set_knobs(rank, work_ms=ms)
        try:
            yield
        finally:
            self.set_knobs(rank)

    @contextlib.contextmanager
    def evicted_reads(self, rank: int, samples: int = 0, read_bytes: int = 0) -> Iterator[Path]:
        """Rank ``rank`` reads ``samples`` samples (64 KiB) of its data file at random places and
        ``read_bytes`` in one piece each step, the file's pages dropped from the page cache
        first: the reads go to the disk."""
        path = self.data_file(rank)
        self.set_knobs(
            rank, read_path=str(path), read_bytes=read_bytes, samples=samples, evict=True
        )
        try:
            yield path
        finally:
            self.set_knobs(rank)

    @contextlib.contextmanager
    def throttled_disk(
        self, rank: int, bytes_per_second: int, read_bytes: int = 1 << 20
    ) -> Iterator[None]:
        """Rank ``rank``'s reads from the disk of its data file limited to
        ``bytes_per_second`` (a cgroup of the blkio/io controller), while it reads
        ``read_bytes`` each step past the page cache (`evicted_reads`)."""
        disk = _whole_disk(os.stat(self.data_file(rank)).st_dev)
        root = Path("/sys/fs/cgroup/blkio")
        v2 = not (root / "blkio.throttle.read_bps_device").exists()
        if v2:
            root = Path("/sys/fs/cgroup")
        d = root / f"bds{os.getpid()}-r{rank}-io"
        d.mkdir()
        pid = self.rank_pids[rank]
        try:
            if v2:
                (d / "io.max").write_text(f"{disk} rbps={bytes_per_second}")
            else:
                (d / "blkio.throttle.read_bps_device").write_text(f"{disk} {bytes_per_second}")
            (d / "cgroup.procs").write_text(str(pid))
            with self.evicted_reads(rank, read_bytes=read_bytes):
                yield
        finally:
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(str(pid))
            d.rmdir()

    @contextlib.contextmanager
    def memory_limit(self, rank: int, limit_bytes: int, samples: int) -> Iterator[Path]:
        """Rank ``rank``'s process in a memory cgroup of its own limited to ``limit_bytes``
        (``memory.high`` in cgroup v2, ``memory.limit_in_bytes`` in v1: a Kubernetes memory
        limit), below its working set: each step it reads ``samples`` samples (64 KiB) of
        its 64 MiB data file at random places through the page cache, which the limit cannot
        hold. Its reads charge new pages at the limit, so it reclaims its own (the file's
        pages it read before) and reads them again from the disk. Without the limit the
        file stays cached and the same reads cost nothing. Its pages already cached (the
        file as written, its memory so far) stay charged where they were."""
        path = self.data_file(rank)
        fd = os.open(path, os.O_RDONLY)
        try:  # out of the page cache: the rank's reads charge its pages to its own cgroup
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        with memory_limited(f"r{rank}-mem", self.rank_pids[rank], limit_bytes) as d:
            self.set_knobs(rank, read_path=str(path), samples=samples)
            try:
                yield d
            finally:
                self.set_knobs(rank)

    @contextlib.contextmanager
    def interrupt_storm(
        self,
        rank: int,
        datagrams_per_second: int,
        size: int = 64,
        softirq_nice: int = 0,
        sender_nice: int | None = None,
    ) -> Iterator[Proc]:
        """``datagrams_per_second`` UDP datagrams of ``size`` bytes (over the link's MTU: IP
        fragments) to rank ``rank``, sent from a namespace of their own by a sender pinned to
        another CPU, and steered (RPS) to the rank's CPU: there the kernel receives them in
        softirqs, interrupting whatever runs.

        ``softirq_nice``: the weight the CPU's softirq thread (``ksoftirqd/N``, which takes
        over the softirq work that comes faster than the kernel does it on the spot) has
        meanwhile, restored afterwards. At nice 0 it gets about a third of the CPU against a
        rank at `RANK_NICE`; interrupt threads run above normal tasks on kernels booted with
        ``threadirqs`` or PREEMPT_RT, where a storm takes nearly the whole CPU.
        ``sender_nice``: the sender's weight (`set_weight`); on a loaded machine a sender at
        nice 0 gets too little of its CPU to send at the rate asked."""
        cpu = self.cpus[rank]
        others = sorted(set(range(os.cpu_count() or 1)) - {cpu}) or [cpu]
        network = self.network
        if not Path(f"/run/netns/{network.flood_ns}").exists():
            network.add_flooder()
        network.steer(network.bridge_ns, "vfl", {cpu})
        network.steer(network.namespaces[rank], "eth0", {cpu})
        flood = spawn(
            ["ip", "netns", "exec", network.flood_ns, "taskset", "-c", str(others[0]),
             sys.executable, str(FLOOD), network.addresses[rank], str(FLOOD_PORT),
             str(datagrams_per_second), str(size)],
            self.base / "flood.out",
        )  # fmt: skip
        softirqd = _softirq_thread(cpu)
        nice = os.getpriority(os.PRIO_PROCESS, softirqd)
        try:
            os.setpriority(os.PRIO_PROCESS, softirqd, softirq_nice)
            wait_for(lambda: "flooding" in flood.lines(), 30, "the interrupt storm to start")
            if sender_nice is not None:
                set_weight(flood.pid, sender_nice)
            yield flood
        finally:
            flood.kill()
            os.setpriority(os.PRIO_PROCESS, softirqd, nice)
            network.steer(network.bridge_ns, "vfl", set())
            network.steer(network.namespaces[rank], "eth0", set())

    # -- tracing -----------------------------------------------------------------------------

    def hold(self) -> int:
        """Stop every rank at the same step; returns how many steps they have made.

        Each feeder stops writing, then writes up to the count of the one furthest ahead:
        every rank takes its last batch, makes that step and blocks reading the next one.
        """
        for f in self.feeders:
            f.send("hold")
        steps = max(f.answer("held") for f in self.feeders)
        for f in self.feeders:
            f.send(f"until {steps}")
        for f in self.feeders:
            f.answer("drained")

        def reading(pid: int) -> bool:
            # The main thread asleep in the FIFO's read (pipe_read, anon_pipe_read since
            # 6.x): its step is over.
            return Path(f"/proc/{pid}/wchan").read_text().endswith("pipe_read")

        wait_for(
            lambda: all(reading(pid) for pid in self.rank_pids.values()),
            60,
            "every rank to wait for its next batch",
            step=0.02,
        )
        return steps

    def go(self) -> None:
        for f in self.feeders:
            f.send("go")

    def trace(
        self,
        name: str,
        iterations: int,
        settle: int = 10,
        timeout: float = 120,
        aligned: bool = True,
        tracks: str = "net,sched",
    ) -> Trace:
        """Trace ``iterations`` steps of every rank, with the kernel tracks ``tracks``;
        the agent's summary of the files and its verdict.

        Every rank must start at the same step, but each gets the request at its own next
        poll (up to a second apart: tens of steps here), and rounding the start up to a
        multiple of N steps still splits the ranks when a multiple falls between their
        polls. So the ranks are held at one step (`hold`) until each one's Kineto has the
        request (it logs it), then let go; they all start ``settle`` steps later.

        The previous trace is over for the agent only when each rank has polled again since
        its Kineto wrote the file: until then its last poll says its profiler is busy, and a
        request would skip it ("busy: its profiler is tracing"). So the request waits for
        every rank to be idle in the agent's own list.

        ``aligned=False`` asks as ``gputrace --job-id`` does, without the hold: each rank
        starts at its own next poll, its window apart from the others'.
        """
        started = time.monotonic()
        steps = self.hold() if aligned else 0
        pids = set(self.rank_pids.values())
        idle = tracing_pb2.TRAINER_STATE_IDLE

        def all_idle() -> bool:
            states = {t.pid: t.state for t in self.agent.trainers() if t.pid in pids}
            return set(states) == pids and all(s == idle for s in states.values())

        waited = time.monotonic()
        wait_for(all_idle, 60, "every rank's profiler to be free (its last poll says so)")
        print(f"{name}: waited {time.monotonic() - waited:.2f} s for every rank to be idle")
        with self.agent.channel() as ch:
            stub = tracing_pb2_grpc.TracingStub(ch)
            try:
                resp = stub.StartTrace(
                    tracing_pb2.StartTraceRequest(
                        job_id=JOB_ID,
                        log_file=str(self.agent.trace_dir / f"{name}.json"),
                        iterations=iterations,
                        # Kineto numbers steps from 0: the first after the hold is `steps`,
                        # and it starts at the first multiple of the round-up from there.
                        profile_start_iteration_roundup=steps + settle if aligned else 1,
                        process_limit=self.ranks,
                        kernel_tracks=tracks,
                        pre_window_seconds=0.0,
                        timeout_seconds=timeout,
                    ),
                    timeout=10,
                )
                triggered = sorted(p.pid for p in resp.triggered)
                assert triggered == sorted(self.rank_pids.values()), (resp, self.rank_pids)
                line = f"REQUEST_TRACE_ID={resp.trace_id}"
                wait_for(
                    lambda: all(line in launcher.lines() for launcher in self.launchers),
                    60,
                    f"every rank's Kineto to get trace {resp.trace_id}",
                )
            finally:
                self.go()
            status = None
            for status in stub.WatchTrace(
                tracing_pb2.GetTraceRequest(trace_id=resp.trace_id), timeout=timeout + 30
            ):
                if status.done:
                    break
            assert status is not None and status.done, status
            written = tracing_pb2.PROCESS_TRACE_STATE_WRITTEN
            assert all(p.state == written for p in status.processes), (
                f"{status}\n{self.diagnostics()}"
            )
            summary = from_pb(
                TraceSummary,
                stub.GetTraceSummary(
                    tracing_pb2.GetTraceRequest(trace_id=resp.trace_id), timeout=120
                ),
            )
        assert summary.verdict is not None, summary
        trace = Trace(
            name,
            resp.trace_id,
            list(summary.processes),
            summary.verdict,
            time.monotonic() - started,
        )
        self.traces.append(trace)
        return trace


def _softirq_thread(cpu: int) -> int:
    """The pid of CPU ``cpu``'s softirq thread (``ksoftirqd/N``, a child of kthreadd)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(entry.path, "comm").read_text().strip() == f"ksoftirqd/{cpu}":
                    return int(entry.name)
    raise AssertionError(f"no ksoftirqd/{cpu} thread on this machine")


def _whole_disk(dev: int) -> str:
    """``MAJOR:MINOR`` of the disk that holds device ``dev`` (a partition's disk: the
    throttle applies to whole disks)."""
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (sysfs / "partition").exists():
        return (sysfs.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


def short_base() -> Path:
    """A short private directory (the Kineto and gRPC socket paths must fit in 107 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="bds-", dir="/tmp"))
    base.chmod(0o755)
    return base


def describe(trace: Trace) -> str:
    """The evidence behind a verdict, rank by rank, for failure messages and measurements:
    per rank its lateness against the other ranks' median arrival, collective by collective,
    and the causes of its run-ups."""
    v = trace.verdict
    lines = [f"{trace.name}: {v.headline}"]
    for f in v.stragglers:
        lines.append(
            f"  finding rank {f.rank} {f.kind} {f.seconds * 1e3:.1f} ms ({f.share:.1%}): "
            + "; ".join(f"{c.cause} {c.seconds * 1e3:.1f} ms [{c.detail}]" for c in f.causes)
        )
    for t in v.ranks:
        lines.append(
            f"  rank {t.rank}: held {t.held_seconds * 1e3:.1f} ms "
            f"({t.held_seconds / max(v.compared_seconds, 1e-9):.1%} of "
            f"{v.compared_seconds * 1e3:.0f} ms), median lateness "
            f"{t.lateness_seconds * 1e3:.2f} ms, last in {t.last}/{t.collectives}"
        )
    for rank, ev in sorted(trace.evidence.items()):
        causes: dict[str, float] = {}
        for c in ev.collectives:
            for cause in c.before:
                causes[cause.cause] = causes.get(cause.cause, 0.0) + cause.seconds
        loss = sum(c.loss_events for c in ev.collectives)
        lines.append(
            f"  rank {rank}: {len(ev.collectives)} collectives, loss events {loss}, run-ups: "
            + ", ".join(f"{k} {s * 1e3:.1f} ms" for k, s in sorted(causes.items()))
        )
        if ev.connections:
            lines.append(
                f"  rank {rank} round trips (ms): "
                + ", ".join(
                    f"{c.peer} {c.srtt_median_ms:.2f}/{c.srtt_max_ms:.2f}" for c in ev.connections
                )
            )
        lines += [
            f"  rank {rank} quota: {q.cgroup} {q.throttled_periods}/{q.periods} throttled, "
            f"{q.throttled_seconds * 1e3:.0f} ms"
            for q in ev.cpu_quotas
        ]
    lines += [f"  note: {n}" for n in v.notes]
    return "\n".join(lines)
