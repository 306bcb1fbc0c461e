"""The legacy dyno JSON RPC (TCP port 1778), so existing ``dyno`` CLIs and scripts work.

One request per connection. A frame is an ``int32`` length in native byte order followed by
that many bytes of UTF-8 JSON; the reply uses the same framing and is compact JSON with
sorted keys, as dynolog's. Unlike dynolog, every bad request gets an error reply (dynolog
closes silently and the CLI panics), frames are bounded, each connection has a deadline,
connections are served concurrently, and IPv4 works without IPv6 (and vice versa).

The port is open to every local user by design (as dynolog's), so each connection is
attributed to the uid that owns the peer's socket (`bpfdyno.server.peers`) and every trace
request acts with that uid's rights. One peer (a uid, or an address when the peer is not on
this host; root excepted) may hold `max_per_peer` connections at once, and a connection that
sends nothing for `idle_timeout_s` is closed, so no user can starve the others of
connections.

**Busy processes.** A request that reaches a process while it is tracing, or while its last
trace is being written and merged, is not dropped: as dynolog does, it waits for the process
(`BusyQueue`, up to `QUEUE_WAIT_S`) and its trace is started as soon as the process is free,
with the same rules and audit as any request. The reply lists such processes as triggered (a
dyno CLI prints their files) and, in additions dyno prints as they are, under ``queued``
with why; one that cannot wait (a request for it already waits, its file would be
overwritten) is under ``busy`` with why, and a request that traced nothing at all is a
failure with those reasons.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bpfdyno.core.connections import PEER_LIMIT, TOTAL_LIMIT, ConnectionLimits
from bpfdyno.core.errors import RequestError
from bpfdyno.core.identity import Requester
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.rpc.traces import SkippedProcess, TrainerState
from bpfdyno.server.peers import legacy_requester
from bpfdyno.services.tracing import TraceRequest, TracingService
from bpfdyno.tracing.config_text import ConfigRejected, check_config
from bpfdyno.tracing.requests import TraceStartResult, output_path

log = logging.getLogger(__name__)

_LEN = struct.Struct("=i")  # native byte order, standard size: what dyno sends
#: After an error reply to a half-read request, how long unread input is drained.
LINGER_S = 0.5
#: Largest request accepted (a config is at most 32 KiB; JSON escaping can double it).
MAX_FRAME_BYTES = 128 * 1024
#: What a request of a dyno CLI looks like when someone points a web client at the port.
_HTTP_PREFIXES = (b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC", b"CONN")
_HTTP_REPLY = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
    b"This is the dyno-compatible RPC port of bpfdyno (length-prefixed JSON), not HTTP.\n"
    b"Use `dyno --hostname HOST status` or `bpfdyno status`.\n"
)
_KINETO_EMPTY = {
    "activityProfilersBusy": 0,
    "activityProfilersTriggered": [],
    "eventProfilersBusy": 0,
    "eventProfilersTriggered": [],
    "processesMatched": [],
}
FUNCTIONS = (
    "getStatus",
    "getVersion",
    "setKinetOnDemandRequest",
    "dcgmProfPause",
    "dcgmProfResume",
)


def encode_frame(obj: dict[str, Any]) -> bytes:
    """A reply frame: length + compact JSON with sorted keys (dynolog's format)."""
    body = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    return _LEN.pack(len(body)) + body


def _error(message: str, **extra: Any) -> dict[str, Any]:
    """An error reply: ``{"status": "failed", "error": message, ...}`` (dyno prints it)."""
    return {"status": "failed", "error": message, **extra}


def _int_field(req: dict[str, Any], key: str, default: int | None) -> int:
    """A JSON integer field (its range is the service's rule, checked there)."""
    value = req.get(key, default)
    if value is None:
        raise ValueError(f"'{key}' is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"'{key}' must be an integer, got {orjson.dumps(value).decode()[:40]}")
    return value


#: How long a request for a busy process waits for it to be free. A trace is at most
#: [tracing] max_duration_ms (30 s) after a start at most max_start_delay_s (120 s) ahead.
QUEUE_WAIT_S = 180.0
#: How often a waiting request looks whether its process is free (Kineto polls every ~1 s).
QUEUE_POLL_S = 0.1
#: Requests waiting at once, in all (one per process).
MAX_QUEUED = 256


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A dyno request for one process that was busy, waiting for it."""

    pid: int
    job_id: int
    config: str
    requester: Requester
    output_path: str
    deadline: float


class BusyQueue:
    """Dyno requests for busy processes, each started once its process is free again.

    Args:
        service: where the request is started (its rules, audit and tracking as for any).
        poll_s: how often a waiting request looks at its process.
        mono: monotonic clock.
    """

    def __init__(
        self,
        service: TracingService,
        poll_s: float = QUEUE_POLL_S,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self._poll_s = poll_s
        self._mono = mono
        self._waiting: dict[int, QueuedRequest] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.started = 0
        self.expired = 0
        self.refused = 0

    def add(self, q: QueuedRequest) -> str:
        """Wait for ``q``'s process; returns "" when it waits, else why it cannot."""
        if q.pid in self._waiting:
            return "a request for it already waits until it is free; try again after that trace"
        if len(self._waiting) >= MAX_QUEUED:
            return f"{MAX_QUEUED} requests already wait for busy processes; try again later"
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return "requests cannot wait here (no event loop); try again when it is free"
        self._waiting[q.pid] = q
        task = loop.create_task(self._wait(q))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return ""

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _wait(self, q: QueuedRequest) -> None:
        try:
            while self._mono() < q.deadline:
                await asyncio.sleep(self._poll_s)
                state = self._state(q)
                if state is None:
                    log.info("dyno request for pid %d: the process is gone", q.pid)
                    return
                if state is not TrainerState.IDLE:
                    continue
                req = TraceRequest(job_id=q.job_id, pids=(q.pid,), process_limit=1, config=q.config)
                try:
                    res = self.service.start_trace(req, q.requester)
                except RequestError as e:  # recorded by the audit trail too
                    self.refused += 1
                    log.warning("dyno request for pid %d (it was busy) refused: %s", q.pid, e)
                    return
                if any(p.pid == q.pid for p in res.triggered):
                    self.started += 1
                    log.info(
                        "dyno request for pid %d (it was busy) started: trace %s, file %s",
                        q.pid,
                        res.trace_id,
                        ", ".join(p.output_path for p in res.triggered),
                    )
                    return
            self.expired += 1
            log.warning(
                "dyno request for pid %d: still busy after %g s; not traced", q.pid, QUEUE_WAIT_S
            )
        finally:
            self._waiting.pop(q.pid, None)

    def _state(self, q: QueuedRequest) -> TrainerState | None:
        for t in self.service.list_trainers(requester=q.requester):
            if t.pid == q.pid:
                return t.state
        return None


class LegacyRpcHandler:
    """Turns one request object into one reply object (no I/O but the busy queue's)."""

    def __init__(self, service: TracingService, queue: BusyQueue | None = None) -> None:
        self.service = service
        self.queue = queue or BusyQueue(service)

    def handle_bytes(self, body: bytes, requester: Requester) -> dict[str, Any]:
        """Decode, dispatch and answer one request body of ``requester``; never raises."""
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return _error(f"the request is not valid JSON ({e}); send a JSON object with 'fn'")
        if not isinstance(req, dict):
            return _error("the request must be a JSON object with an 'fn' field")
        fn = req.get("fn")
        if not isinstance(fn, str):
            return _error(f"missing 'fn'; one of: {', '.join(FUNCTIONS)}")
        try:
            return self._dispatch(fn, req, requester)
        except Exception as e:  # the port must keep serving whatever a request contains
            log.exception("legacy RPC %s failed", fn)
            return _error(f"internal error in {fn}: {e}")

    def _dispatch(self, fn: str, req: dict[str, Any], requester: Requester) -> dict[str, Any]:
        if fn == "getStatus":
            return {"status": 1}
        if fn == "getVersion":
            return {"version": self.service.version}
        if fn == "setKinetOnDemandRequest":
            return self._kineto(req, requester)
        if fn == "dcgmProfPause":
            try:
                duration = _int_field(req, "duration_s", None)
                return {"status": self.service.dcgm_pause(duration, requester)}
            except RequestError as e:  # a rule of the service: duration, unattributed
                return _error(str(e), **({"rule": e.rule} if e.rule else {}))
            except ValueError as e:  # the wrong JSON type
                return _error(str(e))
        if fn == "dcgmProfResume":
            try:
                return {"status": self.service.dcgm_resume(requester)}
            except RequestError as e:
                return _error(str(e), rule=e.rule)
        return _error(f"unknown fn {fn[:60]!r}; one of: {', '.join(FUNCTIONS)}")

    def _kineto(self, req: dict[str, Any], requester: Requester) -> dict[str, Any]:
        config, pids = req.get("config"), req.get("pids")
        # Error replies keep the result fields, so a dyno CLI prints them instead of panicking.
        if not isinstance(config, str):
            return _error("'config' (a string) is required", **_KINETO_EMPTY)
        if not isinstance(pids, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in pids
        ):
            return _error("'pids' (a list of integers; [0] = all) is required", **_KINETO_EMPTY)
        try:
            job_id = _int_field(req, "job_id", 0)
            limit = _int_field(req, "process_limit", 1000)
            res = self.service.start_trace(
                TraceRequest(job_id=job_id, pids=tuple(pids), process_limit=limit, config=config),
                requester,
            )
        except RequestError as e:  # a rule of the service (the same for every entry point)
            extra = {"rule": e.rule} if e.rule else {}
            return _error(str(e), **extra, **_KINETO_EMPTY)
        except ValueError as e:  # a field of the wrong JSON type
            return _error(str(e), **_KINETO_EMPTY)
        queued, busy = self._queue_busy(res, job_id, requester)
        files = {str(p.pid): p.output_path for p in res.triggered}
        files.update({str(q.pid): q.output_path for q in queued})
        reply: dict[str, Any] = {
            "activityProfilersBusy": len(busy),
            "activityProfilersTriggered": [p.pid for p in res.triggered] + [q.pid for q in queued],
            "eventProfilersBusy": 0,
            "eventProfilersTriggered": [],
            "processesMatched": list(res.matched),
            # Additions (ignored by dyno, which prints the reply): the truth about files.
            "traceId": res.trace_id,
            "traceFiles": files,
        }
        if queued:
            reply["queued"] = {
                str(q.pid): f"busy now; its trace starts as soon as it is free (waits up to "
                f"{QUEUE_WAIT_S:g} s; the agent's log and bpfdyno audit say when)"
                for q in queued
            }
        if busy:
            reply["busy"] = {str(s.pid): s.reason for s in busy}
            if not res.triggered and not queued:
                reply.update(
                    status="failed",
                    error="nothing was traced: "
                    + "; ".join(f"pid {s.pid}: {s.reason}" for s in busy),
                )
        return reply

    def _queue_busy(
        self, res: TraceStartResult, job_id: int, requester: Requester
    ) -> tuple[list[QueuedRequest], list[SkippedProcess]]:
        """Queue each busy process of ``res`` (`BusyQueue`); returns (queued, still busy)."""
        if not res.busy:
            return [], []
        try:
            checked = check_config(res.config_text, self.service.allowed_for(requester))
        except ConfigRejected as e:  # the start time has passed meanwhile: it cannot wait
            return [], [SkippedProcess(s.pid, s.job_id, f"{s.reason}; {e}") for s in res.busy]
        queued: list[QueuedRequest] = []
        busy: list[SkippedProcess] = []
        deadline = time.monotonic() + QUEUE_WAIT_S
        for s in res.busy:
            path = output_path(checked, s.pid)
            why = ""
            if os.path.lexists(path) or path in self._files_in_progress(s.pid, requester):
                why = (
                    f"{path} exists or is being written by its current trace, and a trace "
                    "never overwrites one: use another --log-file"
                )
            if not why:
                q = QueuedRequest(s.pid, job_id, res.config_text, requester, path, deadline)
                why = self.queue.add(q)
                if not why:
                    queued.append(q)
                    continue
            busy.append(SkippedProcess(s.pid, s.job_id, f"{s.reason}; not queued: {why}"))
        return queued, busy

    def _files_in_progress(self, pid: int, requester: Requester) -> set[str]:
        """The files the trace ``pid`` works on now writes (those ``requester`` may see)."""
        for t in self.service.list_trainers(requester=requester):
            if t.pid == pid and t.trace_id:
                view = self.service.get_trace(t.trace_id, requester)
                return {p.output_path for p in view.processes if p.pid == pid}
        return set()


class LegacyRpcServer:
    """Serves `LegacyRpcHandler` on one or more ``host:port`` addresses.

    Args:
        handler: answers the requests.
        listen: addresses such as ``127.0.0.1:1778`` and ``[::1]:1778`` (port 0 = any).
        timeout_s: a connection must deliver its whole request within this time.
        max_connections: connections served at once; more are told to retry.
        max_per_peer: connections one peer (uid, else address) may hold at once.
        idle_timeout_s: a connection must start its request within this time.
    """

    def __init__(
        self,
        handler: LegacyRpcHandler,
        listen: Sequence[str],
        timeout_s: float = 5.0,
        max_connections: int = 64,
        max_per_peer: int = 8,
        idle_timeout_s: float = 1.0,
    ) -> None:
        self.handler = handler
        self.listen = list(listen)
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self.idle_timeout_s = idle_timeout_s
        self._servers: list[asyncio.Server] = []
        #: Connections open, in all and per peer.
        self.limits = ConnectionLimits(max_connections, max_per_peer)
        self._tasks: set[asyncio.Task[None]] = set()
        #: (address, error) for each listen address that could not be bound.
        self.failures: list[tuple[str, str]] = []
        #: (host, port) actually bound, in the order of ``listen``.
        self.bound: list[tuple[str, int]] = []
        self.served = 0
        self.bad_requests = 0

    async def start(self) -> None:
        """Bind every address that can be bound; the others are listed in ``failures``."""
        for addr in self.listen:
            host, port = parse_listen(addr)
            try:
                server = await asyncio.start_server(
                    self._on_connection, host, port, reuse_address=True
                )
            except OSError as e:
                self.failures.append((addr, e.strerror or str(e)))
                log.warning("legacy dyno RPC: cannot listen on %s: %s", addr, e.strerror)
                continue
            self._servers.append(server)
            sockname = server.sockets[0].getsockname()
            self.bound.append((host, int(sockname[1])))
            log.info("legacy dyno RPC listening on %s", addr if port else f"{host}:{sockname[1]}")

    @property
    def refused_peer_limit(self) -> int:
        """Connections refused because their peer held too many (see ``max_per_peer``)."""
        return self.limits.refused[PEER_LIMIT]

    def status(self) -> PartStatus:
        """ok on every address, degraded when some could not be bound, unavailable on none."""
        bound = ", ".join(f"{h}:{p}" if ":" not in h else f"[{h}]:{p}" for h, p in self.bound)
        failed = "; ".join(f"{a}: {err}" for a, err in self.failures)
        if not self.bound:
            return PartStatus(
                "legacy_rpc",
                PartState.UNAVAILABLE,
                f"cannot listen ({failed}); free the port or change [legacy_rpc] listen",
            )
        if failed:
            return PartStatus(
                "legacy_rpc", PartState.DEGRADED, f"listening on {bound}; failed: {failed}"
            )
        limited = (
            f", {self.refused_peer_limit} refused over the per-peer limit"
            if self.refused_peer_limit
            else ""
        )
        q = self.handler.queue
        queued = (
            f"; for busy processes: {q.waiting} waiting, {q.started} started, {q.expired} "
            f"still busy after {QUEUE_WAIT_S:g} s, {q.refused} refused"
            if q.waiting or q.started or q.expired or q.refused
            else ""
        )
        return PartStatus(
            "legacy_rpc",
            PartState.OK,
            f"listening on {bound}; {self.served} requests, {self.bad_requests} bad{limited}"
            f"{queued}",
            errors=self.bad_requests,
        )

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.handler.queue.stop()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        requester = legacy_requester(
            writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        )
        # One user's connections count together wherever they come from; a peer that is not
        # on this host counts by address.
        peer_key = self.limits.peer_of(requester)
        refused = self.limits.admit(peer_key, requester.privileged)
        try:
            if refused == PEER_LIMIT:
                reply = encode_frame(
                    _error(
                        f"refused by rule '{PEER_LIMIT}': {peer_key} already has "
                        f"{self.max_per_peer} connections open to this port (legacy_rpc."
                        "max_connections_per_peer); close them or retry when they are done",
                        rule=PEER_LIMIT,
                    )
                )
                complete = False
            elif refused:
                reply = encode_frame(
                    _error(
                        f"refused by rule '{TOTAL_LIMIT}': too many connections at once "
                        "(legacy_rpc.max_connections); retry in a moment",
                        rule=TOTAL_LIMIT,
                    )
                )
                complete = False
            else:
                reply, complete = await self._serve_one(reader, requester)
            writer.write(reply)
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.drain(), self.timeout_s)
                if not complete:
                    # Unread request bytes would make close() send a reset that can destroy
                    # the reply before the client reads it: finish sending, then discard.
                    writer.write_eof()
                    await asyncio.wait_for(_discard(reader), LINGER_S)
        except asyncio.CancelledError:
            # The server is stopping. Ending normally keeps Python 3.11's stream callback
            # from logging the cancellation as an error.
            pass
        finally:
            if not refused:
                self.limits.release(peer_key)
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            if task is not None:
                self._tasks.discard(task)

    async def _serve_one(
        self, reader: asyncio.StreamReader, requester: Requester
    ) -> tuple[bytes, bool]:
        """Read one framed request within the deadline and answer it (never raises).

        Returns:
            The reply, and whether the whole request frame was read.
        """
        try:
            async with asyncio.timeout(self.timeout_s):
                # An idle connection (not one byte yet) is closed early; a request that has
                # started gets the whole deadline.
                try:
                    first = await asyncio.wait_for(reader.readexactly(1), self.idle_timeout_s)
                except TimeoutError:
                    self.bad_requests += 1
                    msg = (
                        f"nothing received within {self.idle_timeout_s:g} s "
                        "(legacy_rpc.idle_timeout_s); send the request right after connecting"
                    )
                    return encode_frame(_error(msg)), False
                head = first + await reader.readexactly(_LEN.size - 1)
                if head in _HTTP_PREFIXES:
                    self.bad_requests += 1
                    return _HTTP_REPLY, False
                (size,) = _LEN.unpack(head)
                if not 0 < size <= MAX_FRAME_BYTES:
                    self.bad_requests += 1
                    return encode_frame(
                        _error(
                            f"bad frame length {size}; a request is an int32 length "
                            f"(1..{MAX_FRAME_BYTES}) followed by that many bytes of JSON"
                        )
                    ), False
                body = await reader.readexactly(size)
        except TimeoutError:
            self.bad_requests += 1
            return encode_frame(_error(f"no complete request within {self.timeout_s:g} s")), False
        except asyncio.IncompleteReadError as e:
            self.bad_requests += 1
            msg = f"the connection closed after {len(e.partial)} bytes of a frame"
            return encode_frame(_error(msg)), True
        except OSError as e:
            self.bad_requests += 1
            return encode_frame(_error(f"read failed: {e.strerror}")), True
        self.served += 1
        reply = self.handler.handle_bytes(body, requester)
        if reply.get("status") == "failed":
            self.bad_requests += 1
        return encode_frame(reply), True


async def _discard(reader: asyncio.StreamReader, limit: int = 4 * MAX_FRAME_BYTES) -> None:
    while limit > 0:
        chunk = await reader.read(65536)
        if not chunk:
            return
        limit -= len(chunk)


def parse_listen(addr: str) -> tuple[str, int]:
    """``"127.0.0.1:1778"`` / ``"[::1]:1778"`` / ``"host:1778"`` → (host, port).

    Raises:
        ValueError: not host:port with a port in 0..65535.
    """
    host, sep, port_s = addr.rpartition(":")
    if not sep or not host or not port_s.isdigit() or int(port_s) > 65535:
        raise ValueError(f"{addr!r} is not HOST:PORT (e.g. 127.0.0.1:1778 or [::1]:1778)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_s)


__all__ = ["LegacyRpcHandler", "LegacyRpcServer", "encode_frame", "parse_listen"]
