"""Helpers for the tracing tests: a daemon-side component on the test's event loop, real
PyTorch trainer processes, a legacy RPC client and a Kineto datagram client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import orjson
import psutil

from bpfdyno.app.tracing import TracingComponent
from bpfdyno.cli import trace_summary, tracing
from bpfdyno.core.config import Config, load
from bpfdyno.core.events import FlightRecorder
from bpfdyno.server.unix_front import UnixFront
from bpfdyno.services.tracing import TracingService, TrainerView
from bpfdyno.tracing.capture.fabric import InterruptTimeSource
from bpfdyno.tracing.capture.gpu import GpuCounterSource
from bpfdyno.tracing.capture.manager import CaptureManager
from bpfdyno.tracing.ipc import wire
from bpfdyno.tracing.traces import TraceView

TRAINERS = Path(__file__).resolve().parent / "trainers"
KINETO_BASE_CONFIG = TRAINERS / "kineto.conf"


def make_config(
    socket_dir: str,
    allowed: list[str],
    legacy: bool = True,
    overrides: Sequence[tuple[str, str]] = (),
) -> Config:
    """A daemon config for tests: socket-dir IPC, legacy RPC on an ephemeral port."""
    return load(
        None,
        [
            ("kineto.socket_dir", json.dumps(socket_dir)),
            ("tracing.allowed_dirs", json.dumps(allowed)),
            ("legacy_rpc.enabled", "true" if legacy else "false"),
            ("legacy_rpc.listen", '["127.0.0.1:0"]'),
            *overrides,
        ],
    )


def trainer_env(socket_dir: str | None, job_id: int | None = None) -> dict[str, str]:
    """The environment of an unmodified PyTorch job started with the daemon enabled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KINETO_"))}
    env.update(
        KINETO_USE_DAEMON="1",
        KINETO_CONFIG=str(KINETO_BASE_CONFIG),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    if socket_dir is not None:
        env["KINETO_IPC_SOCKET_DIR"] = socket_dir
    if job_id is not None:
        env["SLURM_JOB_ID"] = str(job_id)
    return env


@dataclass
class TrainerProc:
    """A trainer process group we started; its stdout lines are collected by a thread."""

    popen: subprocess.Popen[str]
    log: Path | None = None
    lines: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def start_reader(self) -> None:
        def read() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                self.lines.append(line.rstrip("\n"))

        self._thread = threading.Thread(target=read, daemon=True)
        self._thread.start()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of its stderr log (Kineto's messages), if it has one."""
        if self.log is None or not self.log.exists():
            return ""
        return "\n" + self.log.read_text(errors="replace")[-chars:]

    def ready_pids(self) -> list[int]:
        """Pids from the "ready <pid> ..." lines printed so far."""
        return [int(line.split()[1]) for line in self.lines if line.startswith("ready ")]

    async def wait_ready(self, count: int = 1, timeout: float = 60.0) -> list[int]:
        try:
            async with asyncio.timeout(timeout):
                while len(self.ready_pids()) < count:
                    if self.popen.poll() is not None:
                        raise AssertionError(f"trainer exited early:\n{self.diagnostics()}")
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(
                f"{count} trainer(s) not ready in {timeout} s:\n{self.diagnostics()}"
            ) from None
        return self.ready_pids()

    def diagnostics(self) -> str:
        err = self.log.read_text()[-3000:] if self.log and self.log.exists() else ""
        return f"stdout: {self.lines[-20:]}\nstderr: {err}"

    def kill(self) -> None:
        """SIGKILL the process group we created (the trainer and any children it left), and
        every descendant in a session of its own (torchrun starts its ranks that way: they
        would train on, orphaned, for minutes)."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.popen.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


class Harness:
    """A `TracingComponent` plus the trainers of one test.

    With ``capture``, the component records kernel tracks (a real `CaptureManager`: BPF
    programs, so root) with the ``[capture]`` settings of ``capture_settings`` (``--set``
    pairs), the flight recorder ``recorder``, GPU counters from ``gpu``, interrupt times from
    ``interrupts`` and RDMA ports and NICs from the sysfs under ``sysfs_root``.
    """

    def __init__(
        self,
        base: Path,
        legacy: bool = True,
        capture: bool = False,
        capture_settings: list[tuple[str, str]] | None = None,
        recorder: FlightRecorder | None = None,
        gpu: GpuCounterSource | None = None,
        interrupts: InterruptTimeSource | None = None,
        sysfs_root: Path = Path("/"),
        allowed: list[str] | None = None,
        overrides: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.base = base
        self.socket_dir = base / "sock"
        self.trace_dir = base / "traces"
        self.socket_dir.mkdir(exist_ok=True)
        self.trace_dir.mkdir(exist_ok=True)
        self.cfg = make_config(
            str(self.socket_dir),
            allowed or [str(self.trace_dir)],
            legacy,
            [*overrides, *(capture_settings or [])],
        )
        self._capture = capture
        self._recorder = recorder
        self._gpu = gpu
        self._interrupts = interrupts
        self._sysfs_root = sysfs_root
        self.comp = self._component()
        self.trainers: list[TrainerProc] = []

    def _component(self) -> TracingComponent:
        if not self._capture:
            return TracingComponent(self.cfg)
        manager = CaptureManager(
            self.cfg.capture,
            gpu=self._gpu,
            interrupts=self._interrupts,
            sysfs_root=self._sysfs_root,
        )
        return TracingComponent(self.cfg, capture=manager, recorder=self._recorder)

    async def start(self) -> None:
        """Start the component; with a capture, wait until its programs are loaded."""
        await self.comp.start()
        if self.comp.capture is not None:
            assert await asyncio.to_thread(self.comp.capture.wait_loaded, 120)

    async def __aenter__(self) -> Harness:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Kill the trainers and stop the component."""
        self.close()
        await self.comp.stop()

    @property
    def service(self) -> TracingService:
        return self.comp.service

    @property
    def legacy_port(self) -> int:
        assert self.comp.legacy is not None
        return self.comp.legacy.bound[0][1]

    async def restart(self) -> None:
        """Stop the component and start a fresh one (empty registry) on the same config."""
        await self.comp.stop()
        self.comp = self._component()
        await self.start()

    def spawn(
        self,
        argv: list[str],
        job_id: int | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> TrainerProc:
        env = trainer_env(str(self.socket_dir), job_id)
        env.update(extra_env or {})
        log_path = self.base / f"trainer-{len(self.trainers)}.log"
        log = open(log_path, "w")  # noqa: SIM115
        popen = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
            cwd=self.base,
        )
        log.close()
        proc = TrainerProc(popen, log_path)
        proc.start_reader()
        self.trainers.append(proc)
        return proc

    def spawn_script(self, script: str, *args: str, job_id: int | None = None) -> TrainerProc:
        return self.spawn([sys.executable, str(TRAINERS / script), *args], job_id=job_id)

    async def wait_trainers(
        self, pred: Callable[[list[TrainerView]], bool], timeout: float = 60.0
    ) -> list[TrainerView]:
        async with asyncio.timeout(timeout):
            while True:
                trainers = self.service.list_trainers()
                if pred(trainers):
                    return trainers
                await asyncio.sleep(0.05)

    async def wait_done(self, trace_id: str, timeout: float = 60.0) -> TraceView:
        """The trace once every part has ended; on a timeout, fail saying where each stands."""
        view = self.service.get_trace(trace_id)
        try:
            async with asyncio.timeout(timeout):
                async for latest in self.service.watch_trace(trace_id):
                    view = latest
        except TimeoutError:
            parts = view.processes if view is not None else ()
            trainers = [(t.pid, t.state.value) for t in self.service.list_trainers()]
            raise AssertionError(
                f"trace {trace_id} not done in {timeout:g} s: "
                + "; ".join(f"pid {p.pid} {p.state.value}: {p.reason}" for p in parts)
                + f"; trainers {trainers}"
                + "".join(f"\ntrainer {t.pid}: {t.lines[-5:]}{t.log_tail()}" for t in self.trainers)
            ) from None
        return view

    def close(self) -> None:
        for t in self.trainers:
            t.kill()


@contextlib.asynccontextmanager
async def grpc_api(
    path: str, *factories: Callable[[grpc.aio.Server], None]
) -> AsyncIterator[grpc.aio.Server]:
    """A gRPC server with ``factories``' servicers behind the agent's Unix front at ``path``,
    as `bpfdyno serve` serves them: every call is attributed to its client's uid."""
    server = grpc.aio.server()
    for add in factories:
        add(server)
    front = UnixFront(path)
    server.add_insecure_port(front.internal_target)
    front.bind()
    os.chmod(path, 0o666)  # any local user may connect; the front tells them apart
    await server.start()
    await front.start()
    try:
        yield server
    finally:
        await front.stop()
        await server.stop(0)


def trace_json(path: str) -> dict[str, object]:
    with open(path, encoding="utf-8") as f:
        data: dict[str, object] = json.load(f)
    return data


def dyno_gputrace_bytes(log_file: str) -> bytes:
    """What `dyno gputrace --log-file <log_file>` sends, with every default (dyno 0.6)."""
    body = (
        b'\n{\n    "fn": "setKinetOnDemandRequest",\n    "config": "ACTIVITIES_LOG_FILE='
        + log_file.encode()
        + b"\\nPROFILE_START_TIME=0\\nACTIVITIES_DURATION_MSECS=500\\nPROFILE_REPORT_INPUT_"
        b"SHAPES=false\\nPROFILE_WITH_STACK=false\\nPROFILE_WITH_FLOPS=false\\nPROFILE_WITH_"
        b'MODULES=false",\n    "job_id": 0,\n    "pids": [0],\n    "process_limit": 3\n}'
    )
    return struct.pack("<i", len(body)) + body


async def legacy_call(port: int, frame: bytes, host: str = "127.0.0.1") -> bytes:
    """Send raw bytes to the legacy RPC port, return everything it answers until it closes."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(frame)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class KinetoClient:
    """A datagram socket speaking the Kineto side of the protocol, as libkineto does."""

    def __init__(self, socket_dir: str) -> None:
        self.daemon = os.path.join(socket_dir, "dynolog")
        self.path = os.path.join(socket_dir, f"dynoconfigclient{uuid.uuid4()}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)

    async def poll(
        self, pids: list[int], job_id: int = 0, config_type: int = 3, timeout: float = 5.0
    ) -> str:
        """Send one ``req`` and return the config text of the reply."""
        await self.send(wire.encode_request(config_type, job_id, pids))
        data, sender = await self.recv(timeout)
        # From the agent's reply socket for this user, in the same directory (libkineto takes
        # a reply from any name there).
        assert str(sender).startswith(f"{self.daemon}-reply-"), f"reply came from {sender!r}"
        msg_type, payload = wire.decode_reply(data)
        assert msg_type == "req"
        return payload.decode()

    async def send(self, data: bytes) -> None:
        """Send like libkineto: on a full daemon queue retry 10 times, backing off from 10 ms."""
        delay = 0.01
        for _ in range(10):
            try:
                self.sock.sendto(data, self.daemon)
                return
            except BlockingIOError:
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("the daemon's queue stayed full through 10 retries")

    async def recv(self, timeout: float = 5.0) -> tuple[bytes, object]:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    return self.sock.recvfrom(300_000)
                except BlockingIOError:
                    fut: asyncio.Future[None] = loop.create_future()
                    loop.add_reader(self.sock.fileno(), fut.set_result, None)
                    try:
                        await fut
                    finally:
                        loop.remove_reader(self.sock.fileno())

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def frame(obj: object) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack("<i", len(body)) + body


def unframe(data: bytes) -> dict[str, object]:
    (size,) = struct.unpack_from("<i", data)
    assert len(data) == 4 + size, "exactly one reply frame, then the connection closes"
    reply: dict[str, object] = orjson.loads(data[4:])
    return reply


async def run_cli(*argv: str) -> tuple[int, str, str]:
    """Run a tracing subcommand (or ``trace-summary``) in a thread (it blocks on gRPC);
    return (rc, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="bpfdyno")
    sub = parser.add_subparsers(dest="command")
    tracing.register(sub)
    trace_summary.register(sub)
    args = parser.parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc: int = args.handler(args)
            return rc

    rc = await asyncio.to_thread(call)
    return rc, out.getvalue(), err.getvalue()


async def behave_like_kineto(
    client: KinetoClient, pids: list[int], job: int, write: Path | None, stop: asyncio.Event
) -> None:
    """Poll every 0.1 s; on a config, be busy for two polls, write ``write`` (if given)."""
    busy_polls = 0
    while not stop.is_set():
        text = await client.poll(pids, job_id=job, config_type=1 if busy_polls else 3)
        if text and write is not None:
            busy_polls = 3
        elif busy_polls:
            busy_polls -= 1
            if busy_polls == 0 and write is not None:
                write.write_text('{"traceEvents": []}')
        await asyncio.sleep(0.1)
