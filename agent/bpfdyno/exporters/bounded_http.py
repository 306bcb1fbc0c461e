"""A threaded WSGI server that no client can hold: bounded connections, each with a deadline.

prometheus_client's own server starts a thread for every connection and waits for each
request as long as the client likes, so clients that connect and send a byte now and then
(or never read the answer) pile up threads until the agent can start no more — no scrape,
no merge, no collector thread. This one serves at most ``limits.max_total`` connections at
once and ``limits.max_per_peer`` of one user (or address), refuses the rest at once with
``503`` naming the rule, and closes a connection that is not done ``timeout_s`` after it
was accepted, however it trickles. Threads are daemon threads; the accept loop runs on one.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from bpfdyno.core.connections import ConnectionLimits
from bpfdyno.core.identity import Requester

log = logging.getLogger(__name__)

#: Who is on the other end of a TCP connection: (peer address, our address) -> requester.
Identify = Callable[[tuple[Any, ...], tuple[Any, ...]], Requester]
#: How often connections past their deadline are looked for (the accept loop's poll).
REAP_INTERVAL_S = 0.5


def by_address(peer: tuple[Any, ...], _local: tuple[Any, ...]) -> Requester:
    """Every peer counted by its address (when nothing can tell its user)."""
    return Requester(uid=None, transport="http", peer=f"{peer[0]}:{peer[1]}")


class _QuietHandler(WSGIRequestHandler):
    """A request handler that logs nothing (a scrape every few seconds is not news)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    """Serves ``app`` on ``address``, one daemon thread per admitted connection.

    Args:
        address: (host, port); port 0 picks one.
        app: the WSGI application.
        limits: connections at once, in all and per peer.
        timeout_s: a connection is closed this long after it was accepted (and a read or
            write that stalls this long fails).
        identify: who a connection is from (default: its address).
    """

    daemon_threads = True
    block_on_close = False
    #: Connections the kernel queues before they are accepted (socketserver's 5 would make
    #: clients beyond it wait seconds for their SYN to be retried, refused or not).
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        app: Callable[..., Any],
        limits: ConnectionLimits,
        timeout_s: float,
        identify: Identify = by_address,
    ) -> None:
        self.address_family = socket.getaddrinfo(
            address[0], address[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0][0]
        handler = type("Handler", (_QuietHandler,), {"timeout": timeout_s})
        super().__init__(address, handler)
        self.set_app(app)
        self.limits = limits
        self.timeout_s = timeout_s
        self._identify = identify
        self._lock = threading.Lock()
        #: Admitted connections: socket -> (its peer key, its deadline on the monotonic clock).
        self._open: dict[socket.socket, tuple[str, float]] = {}
        self.timed_out = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        requester = self._identify(client_address, request.getsockname())
        peer = self.limits.peer_of(requester)
        rule = self.limits.admit(peer, requester.privileged)
        if rule:
            _refuse(request, rule, peer, self.limits)
            self.shutdown_request(request)
            return
        with self._lock:
            self._open[request] = (peer, time.monotonic() + self.timeout_s)
        try:
            super().process_request(request, client_address)  # starts its thread
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: socket.socket) -> None:
        with self._lock:
            entry = self._open.pop(request, None)
        if entry is not None:
            self.limits.release(entry[0])

    def service_actions(self) -> None:
        """On the accept loop, every `REAP_INTERVAL_S`: end connections past their deadline
        (their thread's read or write fails at once and it finishes)."""
        now = time.monotonic()
        with self._lock:
            late = [s for s, (_, deadline) in self._open.items() if deadline <= now]
        for s in late:
            self.timed_out += 1
            with contextlib.suppress(OSError):  # already closed by its thread
                s.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-answer is not an error of ours; anything else is logged
        # once per kind, not with a traceback on stderr for every connection.
        log.debug("HTTP connection from %s ended with an error", client_address, exc_info=True)

    def serve(self, name: str) -> threading.Thread:
        """Start the accept loop on a daemon thread named ``name``."""
        t = threading.Thread(
            target=self.serve_forever, args=(REAP_INTERVAL_S,), name=name, daemon=True
        )
        t.start()
        return t


def _refuse(request: socket.socket, rule: str, peer: str, limits: ConnectionLimits) -> None:
    """Tell a refused client why, without waiting for it (it may read nothing)."""
    if rule == "peer_connection_limit":
        why = f"{peer} already has {limits.max_per_peer} connections open here"
    else:
        why = f"{limits.max_total} connections are open here"
    body = f"refused by rule '{rule}': {why}; retry when they are done\n".encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError):  # a client that is gone or reads nothing
        request.setblocking(False)
        request.send(head + body)
