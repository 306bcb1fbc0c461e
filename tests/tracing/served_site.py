"""A shared node for attack tests: a real `bpfdyno serve` process at its defaults for access
(the gRPC socket open to every local user, the legacy port, the Kineto socket directory
shared by everyone), and real unprivileged users who run the CLI, trainers and clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from local_user import LocalUser, local_user
from tracing_harness import TRAINERS, TrainerProc, trainer_env

from bpfdyno.rpc.v1 import agent_pb2 as apb
from bpfdyno.rpc.v1 import agent_pb2_grpc as apb_grpc
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc

USER_CLIENT = str(Path(__file__).with_name("user_client.py"))
#: The agent must be gone this long after SIGTERM, whatever was done to it.
STOP_WITHIN_S = 5.0
#: What these tests do not need (they test tracing, not the collectors).
LIGHT = [
    f"collectors.{name}.enabled=false"
    for name in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs")
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@dataclass
class ServedSite:
    """The agent, its users, and a directory of each user's own for traces."""

    base: Path
    agent: subprocess.Popen[bytes]
    sock: str
    socket_dir: Path
    legacy_port: int
    users: dict[str, LocalUser]
    dirs: dict[str, Path]
    log: Path
    #: The agent's uid: 0, or its own user's under the unit (`RUN_MODES`).
    agent_uid: int = 0
    trainers: list[TrainerProc] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        """The agent's own directory (/run/bpfdyno's stand-in, owned by its user)."""
        return Path(self.sock).parent

    # -- users ------------------------------------------------------------------------------

    async def run(
        self, user: str, *argv: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` as ``user`` (without blocking the test's loop)."""
        return await asyncio.to_thread(self.users[user].run, list(argv), timeout)

    async def cli(
        self, user: str, *argv: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``bpfdyno ARGV --socket <the agent>`` as ``user``."""
        return await self.run(
            user, sys.executable, "-m", "bpfdyno", argv[0], "--socket", self.sock, *argv[1:],
            timeout=timeout,
        )  # fmt: skip

    async def client(self, user: str, *argv: str, timeout: float = 120) -> object:
        """``user_client.py ARGV`` as ``user``; its JSON output."""
        r = await self.run(user, sys.executable, USER_CLIENT, *argv, timeout=timeout)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def spawn_trainer(
        self, user: str, *args: str, env: dict[str, str] | None = None
    ) -> TrainerProc:
        """A real PyTorch trainer of ``user`` (``trainers/linear.py ARGS``, more ``env``)."""
        u = self.users[user]
        full_env = trainer_env(str(self.socket_dir))
        full_env.update({k: v for k, v in u.env().items() if k in ("HOME", "TMPDIR", "USER")})
        full_env.update(env or {})
        log = open(self.base / f"trainer-{len(self.trainers)}.log", "w")  # noqa: SIM115
        popen = subprocess.Popen(
            u.wrap([sys.executable, str(TRAINERS / "linear.py"), *args]),
            env=full_env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
            cwd=u.home,
        )  # fmt: skip
        log.close()
        proc = TrainerProc(popen, Path(log.name))
        proc.start_reader()
        self.trainers.append(proc)
        return proc

    # -- the agent --------------------------------------------------------------------------

    def stub(self) -> pb_grpc.TracingStub:
        return pb_grpc.TracingStub(grpc.aio.insecure_channel(f"unix:{self.sock}"))

    async def wait_registered(self, pid: int, timeout: float = 60) -> None:
        async with grpc.aio.insecure_channel(f"unix:{self.sock}") as ch:
            stub = pb_grpc.TracingStub(ch)
            async with asyncio.timeout(timeout):
                while True:
                    resp = await stub.ListTrainers(pb.ListTrainersRequest())
                    if any(t.pid == pid for t in resp.trainers):
                        return
                    await asyncio.sleep(0.1)

    async def wait_done(self, trace_id: str, timeout: float = 90) -> pb.TraceStatus:
        """The trace once every process has ended (as root, who sees every trace)."""
        async with grpc.aio.insecure_channel(f"unix:{self.sock}") as ch:
            views = []
            async with asyncio.timeout(timeout):
                async for view in pb_grpc.TracingStub(ch).WatchTrace(
                    pb.GetTraceRequest(trace_id=trace_id)
                ):
                    views.append(view)
        assert views and views[-1].done, views[-1:]
        return views[-1]

    def stop(self) -> float:
        """SIGTERM the agent; the seconds until it was gone."""
        t0 = time.monotonic()
        self.agent.send_signal(signal.SIGTERM)
        try:
            self.agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            self.agent.wait()
            return float("inf")
        return time.monotonic() - t0

    def agent_log(self) -> str:
        return self.log.read_text(errors="replace")

    def diagnostics(self) -> str:
        """The end of the agent's log and of each trainer's (Kineto's messages)."""
        trainers = "".join(f"\ntrainer {t.pid}: {t.log_tail(1500)}" for t in self.trainers)
        return f"\nagent log: {self.agent_log()[-3000:]}{trainers}"


async def _ready(sock: str, agent: subprocess.Popen[bytes], log: Path) -> None:
    async with asyncio.timeout(120):
        while True:
            if agent.poll() is not None:
                raise AssertionError(f"the agent exited {agent.returncode}: {log.read_text()}")
            if os.path.exists(sock):
                async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        st = await apb_grpc.AgentStub(ch).GetStatus(apb.GetStatusRequest())
                        capture = {c.name: c for c in st.collectors}.get("capture")
                        # Traces with kernel tracks wait for the capture's programs.
                        if capture is None or capture.state != apb.COLLECTOR_STATE_STARTING:
                            return
            await asyncio.sleep(0.2)


#: The two ways a node runs the agent: as root, and as the Debian package's unit (its own
#: user with the unit's ambient capabilities, umask and NoNewPrivileges).
RUN_MODES = ("root", "unit")


@contextlib.asynccontextmanager
async def served_site(
    base: Path,
    users: Sequence[str] = ("alice", "mallory"),
    sets: Sequence[str] = (),
    mode: str = "root",
) -> AsyncIterator[ServedSite]:
    """Start the agent as `bpfdyno serve` would run on a node, with ``users`` created;
    ``mode`` (`RUN_MODES`) says how it runs."""
    os.chmod(base, 0o755)
    socket_dir = base / "sock"
    socket_dir.mkdir()
    os.chmod(socket_dir, 0o1777)  # trainers of every user bind their sockets here
    port = free_port()
    run_dir = base / "run"  # the agent's own (/run/bpfdyno)
    run_dir.mkdir()
    sock = str(run_dir / "agent.sock")
    log = base / "agent.log"
    with contextlib.ExitStack() as stack:
        agent_user = stack.enter_context(local_user()) if mode == "unit" else None
        if agent_user is not None:
            os.chown(run_dir, agent_user.uid, agent_user.gid)
            # The unit's user cannot write /var/cache: the headers its BPF programs need are
            # made by root beforehand, as a root-run doctor or agent would have.
            from bpfdyno.ebpf.kheaders import ensure_headers

            for flavour in ("minimal", "btf"):
                await asyncio.to_thread(ensure_headers, flavour)  # type: ignore[arg-type]
        made = {name: stack.enter_context(local_user()) for name in users}
        dirs = {}
        for name, u in made.items():
            d = base / name
            d.mkdir()
            os.chown(d, u.uid, u.gid)
            dirs[name] = d
        config = base / "bpfdyno.toml"
        config.write_text("")  # the defaults, whatever this machine's /etc/bpfdyno says
        argv = [
            sys.executable, "-m", "bpfdyno", "serve", "--config", str(config), "--socket", sock,
            f"--set=kineto.socket_dir={json.dumps(str(socket_dir))}",
            f"--set=tracing.allowed_dirs={json.dumps([str(base)])}",
            # Its own parent of the per-user trace directories: an agent run as a test user
            # must not leave /tmp/bpfdyno owned by a uid that is deleted after the test.
            f"--set=tracing.user_dirs={json.dumps(str(base / 'user-dirs'))}",
            f'--set=legacy_rpc.listen=["127.0.0.1:{port}"]',
            *(f"--set={s}" for s in (*LIGHT, *sets)),
        ]  # fmt: skip
        env = None
        if agent_user is not None:
            argv, env = agent_user.wrap(argv, unit=True), agent_user.env()
        with open(log, "wb") as out:
            agent = subprocess.Popen(argv, stderr=out, start_new_session=True, env=env)
        agent_uid = agent_user.uid if agent_user is not None else 0
        site = ServedSite(base, agent, sock, socket_dir, port, made, dirs, log, agent_uid)
        try:
            await _ready(sock, agent, log)
            yield site
        finally:
            for t in site.trainers:
                t.kill()
            if agent.poll() is None:
                agent.kill()
                agent.wait()


# -- what attack tests do after each attack ---------------------------------------------


async def trainer(site: ServedSite, user: str, *args: str, **env: str) -> int:
    """A registered PyTorch trainer of ``user``; its pid."""
    proc = site.spawn_trainer(user, *args, env=env)
    [pid] = await proc.wait_ready()
    await site.wait_registered(pid)
    return pid


async def traced(site: ServedSite, user: str, pid: int) -> None:
    """``user`` traces its trainer ``pid`` (2 iterations, ``bpfdyno gputrace --wait``): written."""
    log_file = str(site.dirs[user] / "t.json")
    r = await site.cli(user, "gputrace", "--pids", str(pid), "--iterations", "2",
                       "--log-file", log_file, "--wait", "--timeout", "60")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr + site.diagnostics()
    assert "written" in r.stdout


def stops_in_time(site: ServedSite) -> None:
    took = site.stop()
    print(f"agent stopped {took:.2f} s after SIGTERM")  # shown with -s
    assert took < STOP_WITHIN_S, f"stopped {took:.1f} s after SIGTERM\n{site.agent_log()[-3000:]}"
