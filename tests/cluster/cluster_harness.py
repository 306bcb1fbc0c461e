"""A real SLURM cluster and one real agent per node, on this one machine.

- **SLURM**: Debian's ``munged``, ``slurmctld`` and four ``slurmd -N nX`` (nodes n1..n4 at
  the loopback addresses 127.0.0.11..14), each with its own spool, all from a temporary
  configuration on free ports. No system service is used or touched: the daemons run in
  the foreground as our children and are stopped with ``scancel`` then SIGTERM.
- **Agents**: one ``bpfdyno serve`` per node, as production runs it for a cluster: gRPC on
  TCP at the node's address with TLS and a bearer token (certificates made here with
  openssl), the Unix socket in a private directory, and its own Kineto socket directory so
  that the trainers of a node register with that node's agent. Only the collectors the
  tests read run (``host``, ``self``).
- **Trainers**: real PyTorch CPU processes (``tests/tracing/trainers/linear.py``) started by
  ``srun`` inside ``sbatch`` jobs with ``KINETO_USE_DAEMON=1``; a small wrapper points each
  at its node's socket directory (``$SLURMD_NODENAME``), as a site's prolog would.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bpfdyno.rpc.v1 import agent_pb2, agent_pb2_grpc, tracing_pb2, tracing_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
TRAINERS = ROOT / "tests" / "tracing" / "trainers"
NODES = ("n1", "n2", "n3", "n4")
ADDRESSES = {name: f"127.0.0.{11 + i}" for i, name in enumerate(NODES)}
TOKEN = "cluster-test-token-4f1c2a"
#: Collectors the agents do not run: BPF, hardware and GPU ones (these tests read none).
OFF_COLLECTORS = ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "irq")


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    """Poll ``pred`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def free_port(hosts: Sequence[str] = ("0.0.0.0",)) -> int:
    """A TCP port free on every one of ``hosts`` right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            port = int(s.getsockname()[1])
        try:
            for host in hosts:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise AssertionError("no free TCP port found")


# -- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    token: Path
    wrong_token: Path
    other_ca: Path  # a CA that signed nothing here


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def make_pki(d: Path, addresses: Sequence[str] = tuple(ADDRESSES.values())) -> Pki:
    """A CA and one server certificate valid for every node's address (``addresses``); a
    token, a wrong one."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        _openssl(d, "req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN=bpfdyno-test-{ca}")  # fmt: skip
    sans = ",".join(["DNS:localhost", *(f"IP:{a}" for a in addresses)])
    (d / "server.ext").write_text(f"subjectAltName={sans}\n")
    _openssl(d, "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=node")
    _openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2",
             "-extfile", "server.ext")  # fmt: skip
    token, wrong = d / "token", d / "wrong-token"
    token.write_text(TOKEN + "\n")
    wrong.write_text("not-the-token\n")
    for p in (token, wrong, d / "server.key"):
        p.chmod(0o600)
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", token, wrong, d / "other-ca.pem")


def client_env(
    pki: Pki, slurm_conf: Path | None = None, token: Path | None = None
) -> dict[str, str]:
    """The environment of a user running ``bpfdyno`` against the cluster's agents."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BPFDYNO_", "SLURM_"))}
    env.update(BPFDYNO_TLS_CA=str(pki.ca), BPFDYNO_TOKEN_FILE=str(token or pki.token))
    if slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm_conf)
    return env


# -- SLURM -------------------------------------------------------------------------------------

SLURM_CONF = """\
ClusterName={cluster}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MaxArraySize=100
KillWait=2
SlurmdParameters=config_overrides
NodeName=n[1-4] NodeHostname=localhost NodeAddr=127.0.0.[11-14] {node_settings}
PartitionName=test Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class SlurmCluster:
    """munged, slurmctld and four slurmd in the foreground, from a private configuration."""

    def __init__(self, base: Path, extra_conf: str = "") -> None:
        self.base = base
        #: slurm.conf lines added to the test cluster's own (a Prolog, an Epilog...).
        self.extra_conf = extra_conf
        self.conf = base / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)

    def start(self) -> None:
        b = self.base
        for d in ("state", "log", "munge", *(f"spool/{n}" for n in NODES)):
            (b / d).mkdir(parents=True, exist_ok=True)
        (b / "munge").chmod(0o711)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = b / "munge" / "munge.sock"
        self._spawn(
            ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--log-file={b}/log/munged.log", f"--pid-file={b}/munge/munged.pid",
             f"--seed-file={b}/munge/seed", "--num-threads=2"],
            "munged",
        )  # fmt: skip
        wait_for(sock.exists, 10, "munged's socket")
        ctld_port = free_port()
        ports = ",".join(str(free_port()) for _ in NODES)
        self.conf.write_text(
            SLURM_CONF.format(
                cluster=f"bdc{os.getpid()}",
                ctld_port=ctld_port,
                slurmd_port=ports.split(",")[0],
                munge_socket=sock,
                base=b,
                node_settings=f"Port=[{ports}] CPUs=4 State=UNKNOWN",
            )
            + self.extra_conf
        )
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for name in NODES:
            self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}")
        wait_for(self._all_idle, 60, "every slurmd to register as idle", step=0.2)

    def _spawn(self, argv: list[str], name: str) -> None:
        out = open(self.base / "log" / f"{name}.out", "wb")  # noqa: SIM115
        try:
            self.procs.append(
                subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
            )
        finally:
            out.close()

    def _all_idle(self) -> bool:
        r = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return sorted(states) == list(NODES) and all(s == "idle" for s in states.values())

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A SLURM client command against this cluster."""
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {r.stderr}")
        return r

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Submit a batch job; returns its id."""
        r = subprocess.run(
            ["sbatch", "--parsable", *args],
            cwd=self.base,  # where jobs without --output write slurm-<id>.out
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if r.returncode != 0:
            raise AssertionError(f"sbatch {' '.join(args)} failed: {r.stderr}")
        return r.stdout.strip().split(";")[0]

    def squeue(self, job: str, fmt: str) -> list[str]:
        """squeue's lines for ``job`` in format ``fmt`` (no header)."""
        r = self.run("squeue", "--noheader", "--jobs", job, "--format", fmt, check=False)
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def wait_running(self, job: str, parts: int = 1, timeout: float = 90) -> None:
        """Wait until ``parts`` lines of ``job`` (tasks or components) are running."""

        def running() -> bool:
            return sum(s == "RUNNING" for s in self.squeue(job, "%T")) >= parts

        wait_for(running, timeout, f"job {job} to run", step=0.2)

    def job_nodes(self, job: str) -> list[str]:
        """The job's nodes as SLURM itself expands them."""
        (nodelist,) = self.squeue(job, "%N")
        return self.run("scontrol", "show", "hostnames", nodelist).stdout.split()

    def scancel(self, job: str) -> None:
        self.run("scancel", job, check=False)

    def jobs(self) -> list[str]:
        """Every job SLURM still lists."""
        r = self.run("squeue", "--noheader", "--format=%i", check=False)
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def stop(self) -> None:
        self.run("scancel", "--user", "root", check=False)
        # Let slurmd kill the job steps (the trainers) before it is stopped itself.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not self.jobs(), 20, "the jobs to end", step=0.2)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- agents ------------------------------------------------------------------------------------


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class NodeAgent:
    """One node's ``bpfdyno serve``."""

    name: str
    address: str
    port: int
    base: Path
    pki: Pki
    trace_dir: Path
    #: Added to the agent's environment (the SLURM configuration and the client TLS settings
    #: its detection reaches its job's other agents with).
    env: dict[str, str] = field(default_factory=dict)
    #: Lines appended to its configuration (sections of a test's own).
    extra_config: tuple[str, ...] = ()
    #: The network namespace it runs in ("": this one).
    netns: str = ""
    proc: subprocess.Popen[str] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir = self.base / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir = self.base / "k" / self.name  # trainers' KINETO_IPC_SOCKET_DIR
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.sock = self.dir / "agent.sock"
        self.log = self.dir / "agent.log"
        self.config = self.dir / "bpfdyno.toml"
        lines = [
            "[daemon]",
            "interval_s = 1.0",
            "[grpc]",
            f"socket = {_toml_str(str(self.sock))}",
            f"tcp = {_toml_str(self.target)}",
            f"tls_cert = {_toml_str(str(self.pki.cert))}",
            f"tls_key = {_toml_str(str(self.pki.key))}",
            f"token_file = {_toml_str(str(self.pki.token))}",
            "tcp_uid = 0",  # the job's operator starts traces over TCP
            "[kineto]",
            f"socket_dir = {_toml_str(str(self.socket_dir))}",
            "[tracing]",
            f"allowed_dirs = [{_toml_str(str(self.trace_dir))}]",
            "[legacy_rpc]",
            "enabled = false",
            "[budget]",  # a known budget: the agents measure, never reduce
            "enabled = false",
            "[collectors.detection]",  # peers found and pulled within a test's patience
            "interval_s = 1.0",
        ]
        for c in OFF_COLLECTORS:
            lines += [f"[collectors.{c}]", "enabled = false"]
        lines += self.extra_config
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"

    def start(self) -> None:
        log = open(self.log, "a")  # noqa: SIM115
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETO_", "SLURM_"))}
            env.update(self.env)
            netns = ["ip", "netns", "exec", self.netns] if self.netns else []
            self.proc = subprocess.Popen(
                [*netns, sys.executable, "-m", "bpfdyno", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        finally:
            log.close()

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"agent {self.name} exited:\n{self.log.read_text()[-3000:]}")
            try:
                self.status()
            except grpc.RpcError:
                return False
            return True

        wait_for(ready, timeout, f"agent {self.name}", step=0.1)

    def status(self) -> agent_pb2.Status:
        with grpc.insecure_channel(f"unix:{self.sock}") as ch:
            st: agent_pb2.Status = agent_pb2_grpc.AgentStub(ch).GetStatus(
                agent_pb2.GetStatusRequest(), timeout=2
            )
            return st

    def trainers(self, job_id: int | None = None) -> list[tracing_pb2.Trainer]:
        req = tracing_pb2.ListTrainersRequest()
        if job_id is not None:
            req.job_id = job_id
        with grpc.insecure_channel(f"unix:{self.sock}") as ch:
            resp = tracing_pb2_grpc.TracingStub(ch).ListTrainers(req, timeout=5)
            return list(resp.trainers)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def node_agents(
    base: Path,
    pki: Pki,
    trace_dir: Path,
    slurm: SlurmCluster,
    extra_config: tuple[str, ...] = (),
) -> Iterator[dict[str, NodeAgent]]:
    """An agent per node, all on one free port, started and ready; stopped on leaving.

    Each has, as a site runs them, SLURM's configuration and the client side of the agents'
    TLS in its environment (its detection reaches its job's other agents with them)."""
    port = free_port(list(ADDRESSES.values()))
    env = {
        "SLURM_CONF": str(slurm.conf),
        "BPFDYNO_TLS_CA": str(pki.ca),
        "BPFDYNO_TOKEN_FILE": str(pki.token),
    }
    nodes = {
        n: NodeAgent(
            n, ADDRESSES[n], port, base, pki, trace_dir, env=env, extra_config=extra_config
        )
        for n in NODES
    }
    try:
        for a in nodes.values():
            a.start()
        for a in nodes.values():
            a.wait_ready()
        yield nodes
    finally:
        for a in nodes.values():
            a.stop()


# -- trainer jobs ------------------------------------------------------------------------------

WRAPPER = """#!/bin/sh
# One rank: register with this node's agent (its socket directory), then train.
export KINETO_IPC_SOCKET_DIR="{base}/k/$SLURMD_NODENAME"
exec "{python}" "{trainer}" --seconds "$1"
"""


def trainer_env() -> dict[str, str]:
    """What a job's environment needs for on-demand tracing, plus Kineto's INFO log (it
    prints each config it receives, which the tests read)."""
    return {
        "KINETO_USE_DAEMON": "1",
        "KINETO_CONFIG": str(TRAINERS / "kineto.conf"),
        "KINETO_LOG_LEVEL": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class TrainerJob:
    """A SLURM job whose every task is a PyTorch trainer."""

    job: str
    out_dir: Path

    def rank_logs(self) -> list[Path]:
        return sorted(self.out_dir.glob("rank-*.err"))

    def received_configs(self) -> dict[str, str]:
        """trace id -> the config text a rank logged as received from its agent (Kineto's
        INFO log prints every config it gets)."""
        configs = {}
        for log in self.rank_logs():
            text = log.read_text(errors="replace")
            for m in re.finditer(r"Received config from dyno:\n((?:[A-Z_]+=.*\n)+)", text):
                trace = re.search(r"^REQUEST_TRACE_ID=(\w+)$", m.group(1), re.M)
                if trace:
                    configs[trace.group(1)] = m.group(1)
        return configs


def write_wrapper(base: Path) -> Path:
    path = base / "rank.sh"
    path.write_text(
        WRAPPER.format(base=base, python=sys.executable, trainer=TRAINERS / "linear.py")
    )
    path.chmod(0o755)
    return path


def submit_trainers(
    slurm: SlurmCluster, base: Path, name: str, sbatch_args: Sequence[str], seconds: int = 600
) -> TrainerJob:
    """``sbatch`` a job running one trainer per task with ``srun`` (ranks on their nodes)."""
    out_dir = base / "jobs" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapper = base / "rank.sh"
    step = (
        f"srun --ntasks-per-node=1 --output={out_dir}/rank-%j-%t.out "
        f"--error={out_dir}/rank-%j-%t.err {wrapper} {seconds}"
    )
    job = slurm.sbatch(
        f"--job-name={name}",
        f"--output={out_dir}/batch-%j.out",
        *sbatch_args,
        "--wrap",
        step,
        env=trainer_env(),
    )
    return TrainerJob(job, out_dir)


def cleanup(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)


def wait_registered(
    agents: dict[str, NodeAgent], job: TrainerJob, nodes: Sequence[str], job_id: int
) -> None:
    """Wait until each of ``nodes``' agents has a trainer of ``job_id`` registered."""

    def registered() -> bool:
        return all(agents[n].trainers(job_id) for n in nodes)

    try:
        wait_for(registered, 120, f"job {job.job}'s ranks to register on {nodes}", step=0.5)
    except AssertionError as e:
        logs = "\n".join(p.read_text()[-1500:] for p in job.rank_logs())
        raise AssertionError(f"{e}\nrank logs:\n{logs}") from None


def wait_idle(agents: dict[str, NodeAgent], nodes: Sequence[str], job_id: int) -> None:
    """Wait until the job's trainers on ``nodes`` are registered (again, after an agent's
    restart) and idle (a previous trace has ended and their profilers said so in a poll),
    so a new trace can trigger them."""

    def idle() -> bool:
        for n in nodes:
            trainers = agents[n].trainers(job_id)
            if not trainers or any(t.state != tracing_pb2.TRAINER_STATE_IDLE for t in trainers):
                return False
        return True

    wait_for(idle, 60, f"the trainers of job {job_id} on {nodes} to be idle", step=0.2)
