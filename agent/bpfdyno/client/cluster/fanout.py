"""Asking many agents at once: one gRPC channel per agent, bounded concurrency, a deadline
per host, and one result per host — an answer or why there is none.

One host failing (not running, wrong token, too slow) never stops or delays the others: its
`HostResult` carries a `HostError` and the rest go on. Channels are kept for the life of the
`FanOut`, so a sequence of calls (a clock probe, the trace request, watching it) pays each
agent's TCP and TLS handshake once.

Credentials come from the same environment variables as every other client command
(`bpfdyno.client.connection`), read once for all agents.
"""

from __future__ import annotations

import asyncio
import enum
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc

from bpfdyno.client.cluster.nodes import Node
from bpfdyno.client.connection import (
    CHANNEL_OPTIONS,
    ChannelOptions,
    aio_channel,
    security_from_env,
)

T = TypeVar("T")

#: Deadline of one host's call (or sequence of calls) when none is given.
DEFAULT_HOST_TIMEOUT_S = 5.0
#: Calls in flight at once when no bound is given.
DEFAULT_CONCURRENCY = 128


class HostErrorKind(enum.StrEnum):
    """Why a host gave no answer (the value is what ``--json`` writes)."""

    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    REFUSED = "refused"
    UNIMPLEMENTED = "unimplemented"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class HostError:
    """Why one host has no answer, in words that say what to do."""

    kind: HostErrorKind
    message: str


@dataclass(frozen=True, slots=True)
class HostResult(Generic[T]):
    """One host's answer (``value``) or why there is none (``error``).

    Attributes:
        node: the host.
        value: what the call returned; None when it failed.
        error: why it failed; None when it answered.
        elapsed_s: how long the host took, queueing for a concurrency slot excluded.
    """

    node: Node
    value: T | None
    error: HostError | None
    elapsed_s: float

    @property
    def ok(self) -> bool:
        """Whether the host answered."""
        return self.error is None


def _cause(details: str) -> str:
    """The useful part of gRPC's connection error: "failed to connect to all addresses; last
    error: UNKNOWN: ipv4:10.0.0.5:50051: Failed to connect to remote host: Connection refused"
    -> "Failed to connect to remote host: Connection refused"."""
    text = details.rsplit("last error: ", 1)[-1]
    text = re.sub(r"^[A-Z_]+: (?:ipv4|ipv6|unix):\S+?: ", "", text).removesuffix(": OK")
    tls = re.search(r"OPENSSL_internal:(.+)$", text)
    return (tls.group(1) if tls else text).strip() or "no answer"


def host_error(e: grpc.RpcError | TimeoutError, node: Node, timeout_s: float) -> HostError:
    """The `HostError` for a failed call to ``node``'s agent."""
    if isinstance(e, TimeoutError):
        return HostError(
            HostErrorKind.TIMEOUT,
            f"no answer from the agent at {node.target} within {timeout_s:g} s (overloaded, or "
            "a firewall drops the packets?); raise the per-host timeout if it is just slow",
        )
    code = e.code() if isinstance(e, grpc.aio.AioRpcError) else None
    details = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
    details = details or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        if "handshake failed" in details.lower():
            return HostError(
                HostErrorKind.UNREACHABLE,
                f"the TLS handshake with the agent at {node.target} failed ({_cause(details)}): "
                "is $BPFDYNO_TLS_CA the CA that signed its certificate, and does the "
                "certificate name this address?",
            )
        return HostError(
            HostErrorKind.UNREACHABLE,
            f"cannot reach the agent at {node.target} ({_cause(details)}): is `bpfdyno serve` "
            "running there with [grpc] tcp on this port?",
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return host_error(TimeoutError(), node, timeout_s)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return HostError(HostErrorKind.UNAUTHENTICATED, f"refused the credentials: {details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return HostError(HostErrorKind.PERMISSION_DENIED, f"permission denied: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return HostError(HostErrorKind.REFUSED, f"refused the request: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return HostError(
            HostErrorKind.UNIMPLEMENTED,
            f"the agent at {node.target} does not serve this call (an older bpfdyno?): {details}",
        )
    name = code.name if code is not None else "an error"
    return HostError(HostErrorKind.FAILED, f"the agent answered {name}: {details}")


class FanOut:
    """Concurrent calls to the agents of many nodes.

    Args:
        nodes: the agents to ask.
        timeout_s: default deadline of each host's part of a `map`.
        concurrency: most hosts in flight at once in a bounded `map`.
        channel_options: gRPC channel options for every agent.

    Raises:
        ClientSetupError: the TLS/token environment variables are unusable (said once,
            before any agent is asked).
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        timeout_s: float = DEFAULT_HOST_TIMEOUT_S,
        concurrency: int = DEFAULT_CONCURRENCY,
        channel_options: ChannelOptions = CHANNEL_OPTIONS,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.nodes = tuple(nodes)
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self._options = channel_options
        self._security = security_from_env()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._slots: asyncio.Semaphore | None = None

    def channel(self, node: Node) -> grpc.aio.Channel:
        """The channel to ``node``'s agent (made on first use, then kept)."""
        ch = self._channels.get(node.target)
        if ch is None:
            ch = aio_channel(node.target, self._options, self._security)
            self._channels[node.target] = ch
        return ch

    async def map(
        self,
        call: Callable[[Node, grpc.aio.Channel], Awaitable[T]],
        nodes: Sequence[Node] | None = None,
        *,
        timeout_s: float | None = None,
        bounded: bool = True,
    ) -> list[HostResult[T]]:
        """Run ``call`` for every node at once; one result per node, in the nodes' order.

        Args:
            call: what to ask one agent (it gets the node and its channel).
            nodes: which nodes (default: all).
            timeout_s: deadline of each host's ``call`` (default: the FanOut's).
            bounded: hold one of ``concurrency`` slots during the call; False for long,
                idle calls such as watching a trace.
        """
        limit = self.timeout_s if timeout_s is None else timeout_s
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        slots = self._slots

        async def one(node: Node) -> HostResult[T]:
            if bounded:
                async with slots:
                    return await self._run(call, node, limit)
            return await self._run(call, node, limit)

        targets = self.nodes if nodes is None else nodes
        return list(await asyncio.gather(*(one(n) for n in targets)))

    async def _run(
        self, call: Callable[[Node, grpc.aio.Channel], Awaitable[T]], node: Node, limit: float
    ) -> HostResult[T]:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(limit):
                value = await call(node, self.channel(node))
        except (grpc.RpcError, TimeoutError) as e:
            return HostResult(node, None, host_error(e, node, limit), time.monotonic() - t0)
        return HostResult(node, value, None, time.monotonic() - t0)

    async def close(self) -> None:
        """Close every channel (cancelling calls still on them)."""
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(ch.close() for ch in channels))

    async def __aenter__(self) -> FanOut:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
