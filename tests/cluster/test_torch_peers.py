"""Detection peers without SLURM and without configuration: a torchrun-style job (gloo,
env:// rendezvous, TORCHELASTIC_RUN_ID) across two network namespaces, one real agent in each
(TCP with TLS and a token, no ``[detection] peers``). Each agent finds the other from its
rank's own TCP connections, asks it for the job's ranks and pulls them; the addresses the ranks
also talk to that are not agents of the job are named in status and never trusted: one where
nothing listens on the agents' port, one where a server whose certificate the agents' CA did
not sign does."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cluster_harness import NodeAgent, Pki, cleanup, make_pki, trainer_env, wait_for

from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.v1 import agent_pb2, detection_pb2, detection_pb2_grpc
from bpfdyno.rpc.wire import from_pb

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
RANK = HERE / "gloo_rank.py"
LINEAR = HERE.parent / "tracing" / "trainers" / "linear.py"
#: Node A (rank 0, the rendezvous host) and node B (rank 1); .3 on B and .4 on A run no agent.
A, B, NO_AGENT, IMPOSTOR = "10.231.7.1", "10.231.7.2", "10.231.7.3", "10.231.7.4"
PORT = 50651  # the agents' port (fresh namespaces: free)
SIDE_PORT = 7000  # where the ranks' extra connections go
RUN_ID = "tp-run-42"

#: A server in a namespace: holds every connection; with a certificate and key, TLS.
LISTENER = """\
import socket, ssl, sys
host, port = sys.argv[1], int(sys.argv[2])
ctx = None
if len(sys.argv) > 3:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(sys.argv[3], sys.argv[4])
s = socket.create_server((host, port))
print("listening", flush=True)
held = []
while True:
    c, _ = s.accept()
    if ctx is not None:
        try:
            c = ctx.wrap_socket(c, server_side=True)
        except (ssl.SSLError, OSError):
            c.close()
            continue
    held.append(c)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def two_nodes() -> Iterator[tuple[str, str, str, str]]:
    """Two network namespaces joined by a veth pair: (namespace, interface) of A and B."""
    tag = str(os.getpid() % 100000)
    na, nb, va, vb = f"bdtp{tag}a", f"bdtp{tag}b", f"tpa{tag}", f"tpb{tag}"
    try:
        _ip("netns", "add", na)
        _ip("netns", "add", nb)
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", na)
        _ip("link", "set", vb, "netns", nb)
        for ns, dev, addrs in ((na, va, (A, IMPOSTOR)), (nb, vb, (B, NO_AGENT))):
            for addr in addrs:
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield na, va, nb, vb
    finally:
        for ns in (na, nb):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def listen(procs: list[subprocess.Popen[bytes]], ns: str, host: str, port: int, *tls: str) -> None:
    p = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", LISTENER, host, str(port), *tls],
        stdout=subprocess.PIPE,
    )
    procs.append(p)
    assert p.stdout is not None
    assert p.stdout.readline() == b"listening\n"


def start_rank(
    procs: list[subprocess.Popen[bytes]],
    ns: str,
    dev: str,
    rank: int,
    agent: NodeAgent,
    log: Path,
    *args: str,
    world: int = 2,
    master: str = A,
) -> None:
    """One rank as torchrun starts it: the env:// rendezvous variables (rank 0 at
    ``master``) and its run id."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BPFDYNO_", "KINETO_"))}
    env.update(trainer_env())
    env.update(
        KINETO_IPC_SOCKET_DIR=str(agent.socket_dir),
        RANK=str(rank),
        LOCAL_RANK="0",
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR=master,
        MASTER_PORT="29500",
        TORCHELASTIC_RUN_ID=RUN_ID,
        GLOO_SOCKET_IFNAME=dev,
    )
    with open(log, "wb") as out:
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, str(RANK), *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )


def _peers_part(agent: NodeAgent) -> agent_pb2.CollectorStatus:
    (part,) = [c for c in agent.status().collectors if c.name == "detection_peers"]
    return part


@contextlib.contextmanager
def started_agents(
    nodes: dict[str, tuple[str, str]],
    port: int,
    base: Path,
    pki: Pki,
    trace_dir: Path,
    env: dict[str, str],
) -> Iterator[dict[str, NodeAgent]]:
    """One agent per node (name -> (address, namespace)) on ``port``, started and ready;
    stopped after."""
    agents = {
        name: NodeAgent(name, addr, port, base, pki, trace_dir, env=env, netns=ns)
        for name, (addr, ns) in nodes.items()
    }
    try:
        for agent in agents.values():
            agent.start()
        for agent in agents.values():
            agent.wait_ready()
        yield agents
    finally:
        for agent in agents.values():
            agent.stop()


def wait_for_peer_parts(
    agents: dict[str, NodeAgent], expected: dict[str, tuple[int, str]], logs: list[Path]
) -> None:
    """Wait until each agent's `detection_peers` part is (state, reason) as ``expected``;
    on a time-out, fail with what they said and the ranks' and agents' logs."""

    def parts() -> dict[str, tuple[int, str]]:
        return {n: (p.state, p.reason) for n, a in agents.items() for p in [_peers_part(a)]}

    try:
        wait_for(lambda: parts() == expected, 150, "each agent to pull the other's rank")
    except AssertionError:
        ranks = "\n".join(p.read_text(errors="replace")[-1500:] for p in logs)
        agent_logs = "\n".join(a.log.read_text(errors="replace")[-3000:] for a in agents.values())
        raise AssertionError(
            f"expected {expected}\ngot {parts()}\nranks:\n{ranks}\nagents:\n{agent_logs}"
        ) from None


def test_each_agent_finds_the_other_from_its_rank_s_connections_and_trusts_only_verified(
    torch_python: str,
) -> None:
    base = Path(tempfile.mkdtemp(prefix="bdtp-", dir="/tmp"))
    base.chmod(0o755)
    try:
        pki: Pki = make_pki(base / "pki", [A, B])
        trace_dir = base / "traces"
        trace_dir.mkdir()
        # The client side of the agents' TLS, as a site gives it to every agent.
        env = {"BPFDYNO_TLS_CA": str(pki.ca), "BPFDYNO_TOKEN_FILE": str(pki.token)}
        with two_nodes() as (na, va, nb, vb), processes() as procs:
            nodes = {"a": (A, na), "b": (B, nb)}
            with started_agents(nodes, PORT, base, pki, trace_dir, env) as agents:
                # Rank 0 also talks to a machine with no agent; rank 1 to one where another
                # TLS server (its own self-signed certificate) holds the agents' port.
                listen(procs, nb, NO_AGENT, SIDE_PORT)
                listen(procs, na, IMPOSTOR, SIDE_PORT)
                other_key = str(pki.other_ca.with_suffix(".key"))
                listen(procs, na, IMPOSTOR, PORT, str(pki.other_ca), other_key)
                logs = [base / "rank-0.log", base / "rank-1.log"]
                start_rank(
                    procs, na, va, 0, agents["a"], logs[0], "--hold", f"{NO_AGENT}:{SIDE_PORT}"
                )
                start_rank(
                    procs, nb, vb, 1, agents["b"], logs[1], "--hold", f"{IMPOSTOR}:{SIDE_PORT}"
                )
                found = "found from its ranks' connections"
                expected = {
                    "a": (
                        agent_pb2.COLLECTOR_STATE_OK,
                        f"pulling rank signals from 1 peers of job {RUN_ID} ({found}) "
                        f"({B}: 1 ranks); not peers: {NO_AGENT}:{PORT} (not asked: no agent "
                        "answers: Connection refused)",
                    ),
                    "b": (
                        # Something that is no agent of the CA answers where a rank talks.
                        agent_pb2.COLLECTOR_STATE_DEGRADED,
                        f"pulling rank signals from 1 peers of job {RUN_ID} ({found}) "
                        f"({A}: 1 ranks); not peers: {IMPOSTOR}:{PORT} (not asked: "
                        "certificate not verified: self-signed certificate)",
                    ),
                }
                wait_for_peer_parts(agents, expected, logs)
    finally:
        cleanup(base)


#: The trace: 2 s from one start time (the trainers' next poll and Kineto's warm-up ahead).
AUTO_TRACE = ("[detection]", "auto_trace = true", "auto_trace_seconds = 2")


def events(agent: NodeAgent, job: str) -> list[DetectionEvent]:
    with grpc.insecure_channel(f"unix:{agent.sock}") as ch:
        listed = detection_pb2_grpc.DetectionStub(ch).ListEvents(
            detection_pb2.ListEventsRequest(job_id=job), timeout=10
        )
    return [from_pb(DetectionEvent, m) for m in listed.events]


def test_a_confirmed_straggler_of_a_torchrun_job_is_traced_on_the_peer_found_from_its_ranks(
    torch_python: str,
) -> None:
    """Three ranks, two on A (rank 0 spins 60 ms more per step) and one on B: A's agent
    confirms rank 0 against its other rank and B's pulled one, and traces the job on both
    nodes; B's rank is named to B's agent by the pid B reported (the job has no SLURM id), so
    another trainer registered on B, of no job, is not traced."""
    base = Path(tempfile.mkdtemp(prefix="bdtp-", dir="/tmp"))
    base.chmod(0o755)
    written: list[Path] = []
    try:
        pki = make_pki(base / "pki", [A, B])
        trace_dir = base / "traces"
        trace_dir.mkdir()
        env = {"BPFDYNO_TLS_CA": str(pki.ca), "BPFDYNO_TOKEN_FILE": str(pki.token)}
        with two_nodes() as (na, va, nb, vb), processes() as procs:
            agents = {
                name: NodeAgent(
                    name, addr, PORT, base, pki, trace_dir, env=env, extra_config=AUTO_TRACE,
                    netns=ns,
                )
                for name, addr, ns in (("a", A, na), ("b", B, nb))
            }  # fmt: skip
            try:
                for agent in agents.values():
                    agent.start()
                for agent in agents.values():
                    agent.wait_ready()
                # A trainer of no job on B, registered with B's agent first.
                other = os.environ | trainer_env()
                other["KINETO_IPC_SOCKET_DIR"] = str(agents["b"].socket_dir)
                procs.append(
                    subprocess.Popen(
                        [
                            "ip",
                            "netns",
                            "exec",
                            nb,
                            sys.executable,
                            str(LINEAR),
                            "--seconds",
                            "300",
                        ],
                        env={
                            k: v
                            for k, v in other.items()
                            if k not in ("RANK", "BPFDYNO_TOKEN_FILE")
                        },
                        stdout=subprocess.DEVNULL,
                    )
                )
                wait_for(lambda: len(agents["b"].trainers()) == 1, 60, "B's other trainer")
                logs = [base / f"rank-{r}.log" for r in range(3)]
                start_rank(procs, na, va, 0, agents["a"], logs[0], "--busy-ms", "60", world=3)
                start_rank(procs, nb, vb, 1, agents["b"], logs[1], world=3)
                start_rank(procs, na, va, 2, agents["a"], logs[2], world=3)
                deadline = time.monotonic() + 240
                traced: list[DetectionEvent] = []
                while time.monotonic() < deadline and not traced:
                    traced = [
                        e for e in events(agents["a"], RUN_ID) if e.kind is DetectionKind.TRACED
                    ]
                    time.sleep(1.0)
                held = events(agents["a"], RUN_ID)
                if not traced:
                    agent_logs = "\n".join(
                        a.log.read_text(errors="replace")[-3000:] for a in agents.values()
                    )
                    raise AssertionError(f"no traced event on A in 240 s: {held}\n{agent_logs}")
                (e,) = traced
                # The agents write into their own trace directory: remove them after.
                written.extend(Path(f.split(":", 1)[-1]) for f in e.trace_files)
                confirmed = [x for x in held if x.kind is DetectionKind.CONFIRMED]
                assert confirmed and confirmed[0].rank == 0, held
                assert e.rank == 0
                # Two files here by path, B's one as B:path; all written.
                local = sorted(f for f in e.trace_files if f.startswith("/"))
                remote = [f for f in e.trace_files if not f.startswith("/")]
                assert len(local) == 2 and len(remote) == 1, e.trace_files
                assert remote[0].startswith(f"{B}:"), remote
                for f in e.trace_files:
                    assert Path(f.split(":", 1)[-1]).is_file(), f
                assert e.summary.startswith(
                    f"job {RUN_ID} rank 0: automatic trace {e.trace_id} of 3 rank(s) on "
                    "2 node(s): verdict: "
                ), e.summary
                v = e.verdict
                assert v is not None, e.summary
                assert {t.host for t in v.ranks} == {socket.gethostname(), B}, e.verdict_text
                assert {t.path for t in v.ranks} == {f.split(":", 1)[-1] for f in e.trace_files}
                # On B only the rank was traced, not the other trainer there.
                assert len(agents["b"].trainers()) == 2
                # B's agent traced for it, and posted no trace of its own.
                assert not [
                    x for x in events(agents["b"], RUN_ID) if x.kind is DetectionKind.TRACED
                ]
            finally:
                for agent in agents.values():
                    agent.stop()
    finally:
        for f in written:
            f.unlink(missing_ok=True)
        cleanup(base)
