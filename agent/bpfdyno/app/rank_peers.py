"""A job's other agents found from its ranks' own TCP connections, for jobs no scheduler
names (torchrun's run id, a rendezvous address): docs/detection.md, "Across nodes".

The ranks of a job talk to each other (gloo's and NCCL's bootstrap connections, the
rendezvous store), so the remote addresses of a rank's established TCP connections are the
machines its peers run on. For each of this node's ranks of the job, the socket inodes of
``/proc/<pid>/fd`` are matched in ``/proc/<pid>/net/tcp`` and ``tcp6`` (the tables of the
rank's own network namespace); every remote address that is not loopback and not one of the
namespace's own is a candidate, reached at this agent's own gRPC TCP port (a cluster runs one
configuration).

A candidate is only an address a trainer talked to, so it is not trusted with the agent's
token (`PeerTrust`): it is asked only when its address is in ``[detection] peer_networks``,
or when the agent's client verifies servers against a configured CA (``$BPFDYNO_TLS_CA``)
and a TLS handshake (no token sent) proves its certificate is signed by that CA for that
address. It is kept as a peer only when it answers `Detection.GetRankSignals` for the job
with at least one rank: an agent that holds ranks of the same job.

An address where no agent of the job answers may be a pod's on a pod network, its agent
listening on the pod's node: it is asked again at the node this node's routes lead it to
(`bpfdyno.app.node_routes`), under the same trust rule, once per node.

Bounded: at most `MAX_FDS` descriptors read per rank and `MAX_CANDIDATES` addresses per job
(the rest named in status), each probe and question within a time-out, `PROBE_CONCURRENCY`
at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bpfdyno.app.node_routes import IPAddress, NodeRoute, RouteError, node_behind
from bpfdyno.client.cluster.nodes import format_target
from bpfdyno.client.connection import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV
from bpfdyno.client.errors import AgentError
from bpfdyno.core.pidfs import socket_inodes_upto

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Descriptors read per rank at most (a rank with more sockets is named in status).
MAX_FDS = 65536
#: Candidate addresses asked per job at most, lowest first (the rest are named in status).
MAX_CANDIDATES = 64
#: Candidates probed and asked at once.
PROBE_CONCURRENCY = 16
#: How long a TLS probe (connect and handshake) may take.
PROBE_TIMEOUT_S = 3.0
#: Where an address's route leads is read again after this long (`ConnectionPeers`).
ROUTE_TTL_S = 300.0
#: Addresses whose routes are kept at most (older ones are dropped past it).
MAX_ROUTES_KEPT = 4096
#: The TCP state of an established connection, as /proc/net/tcp prints it.
TCP_ESTABLISHED = "01"


@dataclass(frozen=True, slots=True)
class TcpEntry:
    """One line of ``/proc/<pid>/net/tcp`` or ``tcp6`` (a v4-mapped IPv6 address is given
    as its IPv4 address)."""

    local: IPAddress
    local_port: int
    remote: IPAddress
    remote_port: int
    state: int
    inode: int


def _address(hex_text: str) -> IPAddress:
    """An address as the kernel prints it: 32-bit words in the host's byte order."""
    words = [int(hex_text[i : i + 8], 16) for i in range(0, len(hex_text), 8)]
    raw = b"".join(struct.pack("=I", w) for w in words)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw)
    addr = ipaddress.IPv6Address(raw)
    return addr.ipv4_mapped or addr


def parse_tcp_table(text: str) -> list[TcpEntry]:
    """The entries of a ``/proc/net/tcp`` or ``tcp6`` table (the header and lines that are
    not entries are skipped)."""
    out: list[TcpEntry] = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 10 or not f[0].endswith(":") or not f[0][:-1].isdigit():
            continue
        try:
            local, lport = f[1].split(":")
            remote, rport = f[2].split(":")
            if len(local) not in (8, 32) or len(remote) != len(local):
                continue
            out.append(
                TcpEntry(
                    _address(local),
                    int(lport, 16),
                    _address(remote),
                    int(rport, 16),
                    int(f[3], 16),
                    int(f[9]),
                )
            )
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class RankRemotes:
    """Where one rank's established TCP connections lead (its namespace's own addresses and
    loopback left out), and whether its descriptors were more than were read."""

    remotes: frozenset[IPAddress]
    truncated: bool = False


def rank_remotes(proc_root: Path, pid: int, max_fds: int = MAX_FDS) -> RankRemotes:
    """The remote addresses of a rank's established TCP connections (blocking: /proc).

    The namespace's table may hold every socket of the machine (tens of thousands of
    lines): each line is only split, and an address converted once per distinct text.
    """
    inodes, truncated = socket_inodes_upto(proc_root, pid, max_fds)
    if not inodes:
        return RankRemotes(frozenset(), truncated)
    own_hex: set[str] = set()  # every address a socket of the namespace is bound to
    remote_hex: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            text = Path(f"{os.fspath(proc_root)}/{pid}/net/{table}").read_text()
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            f = line.split(maxsplit=10)
            if len(f) < 10:
                continue
            own_hex.add(f[1].partition(":")[0])
            if f[3] == TCP_ESTABLISHED and f[9].isdigit() and int(f[9]) in inodes:
                remote_hex.add(f[2].partition(":")[0])
    try:
        # A connection from one of the node's ranks to another over the node's own
        # address leads to this machine.
        own = {_address(h) for h in own_hex}
        remotes = {_address(h) for h in remote_hex}
    except ValueError:  # not a table as the kernel writes it
        return RankRemotes(frozenset(), truncated)
    return RankRemotes(
        frozenset(
            r for r in remotes if r not in own and not r.is_loopback and not r.is_unspecified
        ),
        truncated,
    )


@dataclass(frozen=True, slots=True)
class JobRemotes:
    """The candidate addresses of a job: its ranks' remote addresses, at most ``cap`` (the
    lowest), how many there were, and the ranks whose descriptors were not all read."""

    addresses: tuple[IPAddress, ...]
    total: int
    truncated_pids: tuple[int, ...] = ()


def job_remotes(
    proc_root: Path,
    pids: Iterable[int],
    cap: int = MAX_CANDIDATES,
    max_fds: int = MAX_FDS,
) -> JobRemotes:
    """The remote addresses of the established TCP connections of a job's ranks here."""
    found: set[IPAddress] = set()
    truncated: list[int] = []
    for pid in sorted(set(pids)):
        r = rank_remotes(proc_root, pid, max_fds)
        found |= r.remotes
        if r.truncated:
            truncated.append(pid)
    ordered = sorted(found, key=lambda a: (a.version, int(a)))
    return JobRemotes(tuple(ordered[:cap]), len(ordered), tuple(truncated))


# -- trust ------------------------------------------------------------------------------------


def parse_networks(items: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``[detection] peer_networks`` as networks.

    Raises:
        ValueError: an item is not a network (``10.0.0.0/8``, ``fd00::/64``, an address).
    """
    return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in items)


@dataclass(frozen=True)
class PeerTrust:
    """The rule for handing the agent's token to a discovered address (docs/security.md):
    an address in a configured network is asked as any configured peer; any other only when
    the agent's client verifies servers against a configured CA, after a handshake has
    proved the address's certificate (signed by that CA, naming that address).

    Attributes:
        networks: ``[detection] peer_networks``.
        ca: the PEM bundle of ``$BPFDYNO_TLS_CA`` (None: none configured; the system's roots
            would verify any public certificate, so they prove nothing here).
        client_cert, client_key: ``$BPFDYNO_TLS_CERT``/``KEY`` files, offered in the probe.
        error: why the CA could not be read ("" when it was, or none is set).
    """

    networks: tuple[IPNetwork, ...] = ()
    ca: bytes | None = None
    client_cert: str = ""
    client_key: str = ""
    error: str = ""

    @classmethod
    def from_env(cls, networks: Sequence[IPNetwork]) -> PeerTrust:
        """The rule from the configured networks and the agent's client environment."""
        path = os.environ.get(TLS_CA_ENV, "")
        ca: bytes | None = None
        error = ""
        if path:
            try:
                ca = Path(path).read_bytes()
            except OSError as e:
                error = f"cannot read {path} named by ${TLS_CA_ENV} ({e.strerror})"
        return cls(
            tuple(networks),
            ca,
            os.environ.get(TLS_CERT_ENV, ""),
            os.environ.get(TLS_KEY_ENV, ""),
            error,
        )

    def in_networks(self, addr: IPAddress) -> bool:
        return any(addr in n for n in self.networks)

    def context(self) -> ssl.SSLContext | None:
        """The probe's TLS context: the configured CA only, the address checked."""
        if self.ca is None:
            return None
        ctx = ssl.create_default_context(cadata=self.ca.decode("ascii", "replace"))
        ctx.check_hostname = True
        ctx.set_alpn_protocols(["h2"])  # as gRPC offers it
        if self.client_cert and self.client_key:
            with contextlib.suppress(OSError, ssl.SSLError):
                ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


async def probe_tls(
    host: str, port: int, ctx: ssl.SSLContext, timeout_s: float
) -> tuple[str, bool]:
    """A TLS handshake with ``host:port`` that sends nothing else: ``("", False)`` when its
    certificate verifies (``ctx``'s CA, naming ``host``); else why not, and whether the
    address failed the check (True) rather than not answering (False)."""
    writer: asyncio.StreamWriter | None = None
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, server_hostname=host), timeout_s
        )
    except ssl.SSLCertVerificationError as e:
        return f"certificate not verified: {e.verify_message or e.reason}", True
    except ssl.SSLError as e:
        return f"no TLS handshake: {e.reason or e}", True
    except TimeoutError:
        return f"no answer within {timeout_s:g} s", False
    except OSError as e:
        # asyncio words a refused connection "Connect call failed (addr)": the errno's text.
        return f"no agent answers: {os.strerror(e.errno) if e.errno else e}", False
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    return "", False


# -- discovery --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """What became of one candidate address: a peer (``reason`` ""), or why not."""

    target: str
    ranks: int = 0
    reason: str = ""
    #: True when the address failed the trust rule's check (not merely absent or busy).
    refused: bool = False
    #: The addresses the ranks talk to that this node's routes lead to this target (pod
    #: addresses behind their node; () when the ranks talk to the target itself).
    via: tuple[str, ...] = ()


#: Asks the agent at a target for a job's ranks: how many it holds (raises on no answer).
AskRanks = Callable[[str, str], Awaitable[int]]
#: The node this node's routes lead an address to (None: none other; raises `RouteError`).
Route = Callable[[IPAddress], Awaitable[NodeRoute | None]]


class ConnectionPeers:
    """A job's other agents, found from its ranks' connections here (see the module).

    Args:
        port: the agents' gRPC TCP port (this agent's own).
        trust: the rule for asking a discovered address.
        ask: how a candidate is asked for the job's ranks (the normal client's
            `Detection.GetRankSignals` with the job filter).
        own_targets: this agent's ``host:port`` addresses (never its own peer).
        proc_root: where /proc is.
        cap: addresses asked per job at most.
        probe_timeout_s: how long a TLS probe may take.
        route: where this node's routes lead an address (`node_behind`).
    """

    def __init__(
        self,
        port: int,
        trust: PeerTrust,
        ask: AskRanks,
        own_targets: Collection[str] = (),
        proc_root: Path = Path("/proc"),
        cap: int = MAX_CANDIDATES,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        route: Route = node_behind,
    ) -> None:
        self.port = port
        self.trust = trust
        self._ask = ask
        self._own = frozenset(own_targets)
        self._proc = proc_root
        self._cap = cap
        self._probe_timeout_s = probe_timeout_s
        self._route = route
        # addr -> (monotonic time read, where its route leads): pod networks' routes change
        # when nodes come and go, not at every lookup, and each read runs iproute2.
        self._routes: dict[IPAddress, tuple[float, NodeRoute | None]] = {}

    async def candidates(self, job_id: str, pids: Collection[int]) -> tuple[list[Candidate], str]:
        """Every candidate address of the job and what became of it, and a note on what was
        left out ("" when nothing was)."""
        remotes = await asyncio.to_thread(job_remotes, self._proc, pids, self._cap)
        notes = []
        if remotes.total > len(remotes.addresses):
            notes.append(
                f"{remotes.total} remote addresses, only the lowest {len(remotes.addresses)} asked"
            )
        if remotes.truncated_pids:
            pids_text = ", ".join(map(str, remotes.truncated_pids))
            notes.append(f"rank pid {pids_text}: more than {MAX_FDS} descriptors, not all read")
        targets = [format_target(str(a), self.port) for a in remotes.addresses]
        todo = [
            (a, t) for a, t in zip(remotes.addresses, targets, strict=True) if t not in self._own
        ]
        gate = asyncio.Semaphore(PROBE_CONCURRENCY)

        async def one(addr: IPAddress, target: str) -> Candidate:
            async with gate:
                return await self.ask_candidate(job_id, addr, target)

        found = await asyncio.gather(*(one(a, t) for a, t in todo))
        return await self._behind(job_id, [a for a, _ in todo], list(found)), "; ".join(notes)

    async def _behind(
        self, job_id: str, addrs: Sequence[IPAddress], found: list[Candidate]
    ) -> list[Candidate]:
        """Addresses where no agent of the job answered, asked again at the node this node's
        routes lead them to (`bpfdyno.app.node_routes`: pods behind their node); a node is
        asked once, however many of its addresses the ranks talk to."""
        peers = {c.target for c in found if not c.reason}
        asked: dict[str, asyncio.Task[Candidate]] = {}
        gate = asyncio.Semaphore(PROBE_CONCURRENCY)

        async def via_node(addr: IPAddress, direct: Candidate) -> tuple[Candidate, str]:
            """(what became of the node, how the route leads there); the direct candidate
            itself with "" when no other node is behind ``addr``."""
            async with gate:
                try:
                    route = await self._node_behind(addr)
                except RouteError as e:
                    return replace(direct, reason=f"{direct.reason}; its route not read: {e}"), ""
            if route is None:
                return direct, ""
            target = format_target(str(route.node), self.port)
            if target in self._own or target == direct.target:
                return direct, ""
            if target not in asked:

                async def ask_node() -> Candidate:
                    async with gate:
                        return await self.ask_candidate(job_id, route.node, target)

                asked[target] = asyncio.ensure_future(ask_node())
            return await asked[target], route.how

        retried = [(a, c) for a, c in zip(addrs, found, strict=True) if c.reason and not c.refused]
        behind = await asyncio.gather(*(via_node(a, c) for a, c in retried))
        out = [c for c in found if not c.reason or c.refused]
        via: dict[str, list[str]] = {}
        for (addr, direct), (node, how) in zip(retried, behind, strict=True):
            if not how:
                out.append(node)  # no other node behind it: as asked
            elif not node.reason:
                via.setdefault(node.target, []).append(str(addr))
            else:
                out.append(
                    replace(
                        direct,
                        reason=f"{direct.reason}; nor at its node by this node's routes "
                        f"({how}), {node.target}: {node.reason}",
                        refused=node.refused,
                    )
                )
        for target, pods in via.items():
            if target in peers:
                continue  # the ranks talk to that node itself too: a peer already
            node = asked[target].result()
            out.append(replace(node, via=tuple(pods)))
        return out

    async def _node_behind(self, addr: IPAddress) -> NodeRoute | None:
        """Where this node's routes lead ``addr``, read at most every `ROUTE_TTL_S`."""
        now = time.monotonic()
        known = self._routes.get(addr)
        if known is not None and now - known[0] < ROUTE_TTL_S:
            return known[1]
        route = await self._route(addr)  # an error is not kept: read again next time
        if len(self._routes) >= MAX_ROUTES_KEPT:
            self._routes = {a: r for a, r in self._routes.items() if now - r[0] < ROUTE_TTL_S}
            if len(self._routes) >= MAX_ROUTES_KEPT:
                self._routes.clear()
        self._routes[addr] = (now, route)
        return route

    async def ask_candidate(self, job_id: str, addr: IPAddress, target: str) -> Candidate:
        """What becomes of one candidate: not asked (the trust rule, and why), not an agent
        of the job, or a peer with the job's ranks."""
        if not self.trust.in_networks(addr):
            ctx = self.trust.context()
            if ctx is None:
                why = self.trust.error or f"no CA configured (${TLS_CA_ENV})"
                return Candidate(
                    target, reason=f"not asked: {why} and not in [detection] peer_networks"
                )
            why, refused = await probe_tls(str(addr), self.port, ctx, self._probe_timeout_s)
            if why:
                return Candidate(target, reason=f"not asked: {why}", refused=refused)
        try:
            ranks = await self._ask(target, job_id)
        except (AgentError, TimeoutError, OSError) as e:
            return Candidate(target, reason=f"no agent answers: {_first_line(e)}")
        if ranks == 0:
            return Candidate(target, reason=f"an agent with no rank of job {job_id}")
        return Candidate(target, ranks=ranks)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]
