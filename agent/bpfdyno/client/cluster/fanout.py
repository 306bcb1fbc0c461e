"""Asking many agents at once: one `AgentClient` per agent, bounded concurrency, a deadline
per host, and one result per host — an answer or why there is none.

One host failing (not running, wrong token, too slow) never stops or delays the others: its
`HostResult` carries an `AgentError` and the rest go on. Clients (and their channels) are
kept for the life of the `FanOut`, so a sequence of calls (a clock probe, the trace request,
watching it) pays each agent's TCP and TLS handshake once.

Credentials come from the same environment variables as every other client command
(`bpfdyno.client.connection`), read once for all agents.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.cluster.nodes import Node
from bpfdyno.client.connection import CHANNEL_OPTIONS, ChannelOptions, security_from_env
from bpfdyno.client.errors import AgentError, ErrorKind, timed_out

T = TypeVar("T")

#: Deadline of one host's call (or sequence of calls) when none is given.
DEFAULT_HOST_TIMEOUT_S = 5.0
#: Calls in flight at once when no bound is given.
DEFAULT_CONCURRENCY = 128
#: What to do about a host that does not answer in time.
TIMEOUT_ADVICE = "raise the per-host timeout if it is just slow"


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
    error: AgentError | None
    elapsed_s: float

    @property
    def ok(self) -> bool:
        """Whether the host answered."""
        return self.error is None


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
        self._clients: dict[str, AgentClient] = {}
        self._slots: asyncio.Semaphore | None = None

    def client(self, node: Node) -> AgentClient:
        """The client of ``node``'s agent (made on first use, then kept)."""
        client = self._clients.get(node.target)
        if client is None:
            client = AgentClient(
                node.target,
                timeout_s=self.timeout_s,
                security=self._security,
                channel_options=self._options,
                timeout_advice=TIMEOUT_ADVICE,
            )
            self._clients[node.target] = client
        return client

    async def map(
        self,
        call: Callable[[Node, AgentClient], Awaitable[T]],
        nodes: Sequence[Node] | None = None,
        *,
        timeout_s: float | None = None,
        bounded: bool = True,
    ) -> list[HostResult[T]]:
        """Run ``call`` for every node at once; one result per node, in the nodes' order.

        Args:
            call: what to ask one agent (it gets the node and its client).
            nodes: which nodes (default: all).
            timeout_s: deadline of each host's ``call``.
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
        self, call: Callable[[Node, AgentClient], Awaitable[T]], node: Node, limit: float
    ) -> HostResult[T]:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(limit):
                value = await call(node, self.client(node))
        except TimeoutError:
            error = timed_out(node.target, limit, TIMEOUT_ADVICE)
            return HostResult(node, None, error, time.monotonic() - t0)
        except AgentError as e:
            if e.kind is ErrorKind.TIMEOUT:  # the call's own deadline: said with this one
                e = timed_out(node.target, limit, TIMEOUT_ADVICE)
            return HostResult(node, None, e, time.monotonic() - t0)
        return HostResult(node, value, None, time.monotonic() - t0)

    async def close(self) -> None:
        """Close every agent's channel (cancelling calls still on them)."""
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients))

    async def __aenter__(self) -> FanOut:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
