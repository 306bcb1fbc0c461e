"""A job's other agents found from its ranks' TCP connections (`bpfdyno.app.rank_peers`): the
/proc tables read as the kernel writes them, and the rule that decides whether a found
address is trusted with the agent's token, against real TLS servers."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import pytest
from cluster_harness import Pki, free_port, make_pki

from bpfdyno.app.detection_peers import Peer, PeerSignals, _Lookup
from bpfdyno.app.node_routes import IPAddress, NodeRoute, RouteError
from bpfdyno.app.rank_peers import (
    MAX_FDS,
    Candidate,
    ConnectionPeers,
    PeerTrust,
    job_remotes,
    parse_networks,
    parse_tcp_table,
    rank_remotes,
)
from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.core.config import ConfigError, load
from bpfdyno.core.pidfs import socket_inodes_upto
from bpfdyno.core.status import PartState

# Lines as a little-endian kernel prints them (addresses are 32-bit words in host order):
# 10.77.0.1 is 01004D0A; fd00:77::5 is 770000FD 00000000 00000000 05000000.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:4E23 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4061106 1 0000000062fc968c 100 0 0 10 0
   1: 01004D0A:B752 02004D0A:4E23 01 00000000:00000000 00:00000000 00000000     0        0 4061107 1 0000000026db7cb3 20 4 30 10 -1
   2: 0100007F:869D 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4061108 1 000000003e36d44c 20 4 30 10 -1
   3: 01004D0A:B760 07004D0A:01BB 06 00000000:00000000 03:00000BF4 00000000     0        0 0 3 0000000026db7cb3
   4: 01004D0A:C001 09004D0A:4E23 01 00000000:00000000 00:00000000 00000000     0        0 5550001 1 00000000e0ec9018 20 4 30 10 -1
   5: 01004D0A:C002 01004D0A:4E23 01 00000000:00000000 00:00000000 00000000     0        0 4061109 1 00000000e0ec9019 20 4 30 10 -1
"""  # noqa: E501
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:4E24 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4061110 1 00000000216e852b 100 0 0 10 0
   1: 0000000000000000FFFF000001004D0A:4E24 0000000000000000FFFF000003004D0A:AAA2 01 00000000:00000000 00:00000000 00000000     0        0 4061111 1 00000000361ff26f 20 0 0 10 -1
   2: 770000FD000000000000000001000000:D431 770000FD000000000000000005000000:4E24 01 00000000:00000000 00:00000000 00000000     0        0 4061112 2 00000000e0ec9018 20 0 0 10 -1
   3: 00000000000000000000000001000000:AAA2 00000000000000000000000001000000:9135 01 00000000:00000000 00:00000000 00000000     0        0 4061113 2 00000000e0ec9018 20 0 0 10 -1
"""  # noqa: E501

ip = ipaddress.ip_address
PID = 4242


def test_tcp_tables_read_as_the_kernel_writes_them_ipv4_ipv6_and_v4_mapped() -> None:
    v4 = parse_tcp_table(TCP)
    assert [(str(e.local), e.local_port, str(e.remote), e.remote_port, e.state, e.inode)
            for e in v4] == [
        ("0.0.0.0", 20003, "0.0.0.0", 0, 0x0A, 4061106),
        ("10.77.0.1", 46930, "10.77.0.2", 20003, 0x01, 4061107),
        ("127.0.0.1", 34461, "127.0.0.1", 8080, 0x01, 4061108),
        ("10.77.0.1", 46944, "10.77.0.7", 443, 0x06, 0),
        ("10.77.0.1", 49153, "10.77.0.9", 20003, 0x01, 5550001),
        ("10.77.0.1", 49154, "10.77.0.1", 20003, 0x01, 4061109),
    ]  # fmt: skip
    v6 = parse_tcp_table(TCP6)
    assert [(str(e.local), e.local_port, str(e.remote), e.remote_port, e.state, e.inode)
            for e in v6] == [
        ("::", 20004, "::", 0, 0x0A, 4061110),
        # A v4-mapped address is its IPv4 address: the same machine either way.
        ("10.77.0.1", 20004, "10.77.0.3", 43682, 0x01, 4061111),
        ("fd00:77::1", 54321, "fd00:77::5", 20004, 0x01, 4061112),
        ("::1", 43682, "::1", 37173, 0x01, 4061113),
    ]  # fmt: skip
    assert parse_tcp_table("garbage\n  7: 0100:zz 00:00 01\n") == []


def _fake_proc(root: Path, fds: dict[str, str]) -> Path:
    """A /proc/<PID> with these descriptors and the tables above."""
    (root / str(PID) / "fd").mkdir(parents=True)
    (root / str(PID) / "net").mkdir()
    for fd, link in fds.items():
        os.symlink(link, root / str(PID) / "fd" / fd)
    (root / str(PID) / "net" / "tcp").write_text(TCP)
    (root / str(PID) / "net" / "tcp6").write_text(TCP6)
    return root


RANK_FDS = {
    "0": "/dev/null",
    "3": "socket:[4061107]",  # to 10.77.0.2
    "4": "socket:[4061108]",  # loopback
    "5": "pipe:[77]",
    "6": "socket:[4061111]",  # v4-mapped, to 10.77.0.3
    "7": "socket:[4061112]",  # to fd00:77::5
    "8": "socket:[4061106]",  # a listener
    "9": "socket:[4061109]",  # to its own namespace's address
}


def test_a_rank_s_remotes_are_its_own_established_connections_not_local_or_loopback(
    tmp_path: Path,
) -> None:
    proc = _fake_proc(tmp_path, RANK_FDS)
    inodes, truncated = socket_inodes_upto(proc, PID, MAX_FDS)
    assert inodes == {4061107, 4061108, 4061111, 4061112, 4061106, 4061109}
    assert not truncated
    # 10.77.0.9's connection (inode 5550001) is another process's: not this rank's peer.
    got = rank_remotes(proc, PID)
    assert got.remotes == {ip("10.77.0.2"), ip("10.77.0.3"), ip("fd00:77::5")}
    assert not got.truncated
    assert rank_remotes(proc, PID + 1).remotes == frozenset()  # gone


def test_a_job_s_remotes_are_bounded_and_say_what_was_left_out(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, RANK_FDS)
    _, truncated = socket_inodes_upto(proc, PID, 3)
    assert truncated
    capped = job_remotes(proc, [PID, PID + 1], cap=2)
    assert capped.addresses == (ip("10.77.0.2"), ip("10.77.0.3"))
    assert capped.total == 3
    assert capped.truncated_pids == ()
    few_fds = job_remotes(proc, [PID], max_fds=2)
    assert few_fds.truncated_pids == (PID,)


def test_peer_networks_are_parsed_and_bad_ones_refused() -> None:
    nets = parse_networks(["10.77.0.0/16", "fd00:77::/64", "192.0.2.7"])
    trust = PeerTrust(nets)
    assert trust.in_networks(ip("10.77.3.4"))
    assert trust.in_networks(ip("fd00:77::5"))
    assert trust.in_networks(ip("192.0.2.7"))
    assert not trust.in_networks(ip("10.78.0.1"))
    with pytest.raises(ValueError):
        parse_networks(["10.77.0.0/33"])


# -- the trust rule, against real TLS servers ---------------------------------------------------


@pytest.fixture(scope="module")
def tls_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@asynccontextmanager
async def tls_server(host: str, port: int, cert: Path, key: Path) -> AsyncIterator[list[bytes]]:
    """A TLS server at ``host:port``; yields what clients sent it after the handshake."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(ssl.SSLError, OSError):
            got.append(await reader.read(4096))
        writer.close()

    server = await asyncio.start_server(serve, host, port, ssl=ctx)
    try:
        yield got
    finally:
        server.close()
        await server.wait_closed()


class Asked:
    """Records which targets were asked for a job's ranks (the token would go there)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.targets: list[tuple[str, str]] = []

    async def __call__(self, target: str, job_id: str) -> int:
        self.targets.append((target, job_id))
        return self.ranks


def _peers(port: int, trust: PeerTrust, asked: Asked) -> ConnectionPeers:
    return ConnectionPeers(port, trust, asked, probe_timeout_s=5.0)


def test_without_a_ca_or_a_network_a_found_address_is_never_asked() -> None:
    port = free_port(["127.0.0.11"])
    asked = Asked(2)
    c = asyncio.run(_peers(port, PeerTrust(), asked).ask_candidate("run-7", ip("127.0.0.11"), "t"))
    assert c == Candidate(
        "t",
        reason="not asked: no CA configured ($BPFDYNO_TLS_CA) and not in [detection] peer_networks",
    )
    assert asked.targets == []


def test_an_address_in_a_configured_network_is_asked_without_a_certificate() -> None:
    asked = Asked(2)
    trust = PeerTrust(parse_networks(["127.0.0.0/24"]))
    c = asyncio.run(_peers(1, trust, asked).ask_candidate("run-7", ip("127.0.0.11"), "t"))
    assert c == Candidate("t", ranks=2)
    assert asked.targets == [("t", "run-7")]


def test_a_certificate_the_ca_did_not_sign_is_not_asked_and_gets_nothing(tls_pki: Pki) -> None:
    port = free_port(["127.0.0.11"])
    trust = PeerTrust(ca=tls_pki.ca.read_bytes())
    asked = Asked(2)

    async def run() -> tuple[Candidate, list[bytes]]:
        other_key = tls_pki.other_ca.with_suffix(".key")
        async with tls_server("127.0.0.11", port, tls_pki.other_ca, other_key) as got:
            c = await _peers(port, trust, asked).ask_candidate(
                "run-7", ip("127.0.0.11"), f"127.0.0.11:{port}"
            )
            await asyncio.sleep(0.1)
            return c, got

    c, got = asyncio.run(run())
    assert c.target == f"127.0.0.11:{port}"
    assert c.reason == "not asked: certificate not verified: self-signed certificate"
    assert c.refused
    assert asked.targets == []
    assert got == []  # the handshake failed on the client's side: nothing was sent


def test_a_certificate_for_another_address_is_not_asked(tls_pki: Pki) -> None:
    # The server's certificate names 127.0.0.11..14 only.
    port = free_port(["127.0.0.21"])
    asked = Asked(2)

    async def run() -> Candidate:
        async with tls_server("127.0.0.21", port, tls_pki.cert, tls_pki.key):
            return await _peers(port, PeerTrust(ca=tls_pki.ca.read_bytes()), asked).ask_candidate(
                "run-7", ip("127.0.0.21"), "t"
            )

    c = asyncio.run(run())
    assert (
        c.reason == "not asked: certificate not verified: IP address mismatch, certificate "
        "is not valid for '127.0.0.21'."
    )
    assert c.refused
    assert asked.targets == []


def test_a_verified_agent_is_asked_and_kept_only_with_ranks_of_the_job(tls_pki: Pki) -> None:
    port = free_port(["127.0.0.12"])
    trust = PeerTrust(ca=tls_pki.ca.read_bytes())

    async def run(asked: Asked) -> Candidate:
        async with tls_server("127.0.0.12", port, tls_pki.cert, tls_pki.key):
            return await _peers(port, trust, asked).ask_candidate("run-7", ip("127.0.0.12"), "t")

    with_ranks = Asked(3)
    assert asyncio.run(run(with_ranks)) == Candidate("t", ranks=3)
    assert with_ranks.targets == [("t", "run-7")]
    without = Asked(0)
    assert asyncio.run(run(without)) == Candidate("t", reason="an agent with no rank of job run-7")


def test_an_address_where_nothing_listens_is_no_agent(tls_pki: Pki) -> None:
    port = free_port(["127.0.0.13"])
    asked = Asked(2)
    c = asyncio.run(
        _peers(port, PeerTrust(ca=tls_pki.ca.read_bytes()), asked).ask_candidate(
            "run-7", ip("127.0.0.13"), "t"
        )
    )
    assert c == Candidate("t", reason="not asked: no agent answers: Connection refused")
    assert asked.targets == []


def test_a_bad_peer_network_in_the_configuration_is_refused_with_what_to_write() -> None:
    cfg = load(None, [("detection.peer_networks", '["10.77.0.0/16", "fd00:77::/64"]')])
    assert cfg.detection.peer_networks == ["10.77.0.0/16", "fd00:77::/64"]
    with pytest.raises(ConfigError, match=r"'detection.peer_networks' must list networks like "
                       r"10.0.0.0/8 or fd00::/64, got '10.77.0.0/33'"):  # fmt: skip
        load(None, [("detection.peer_networks", '["10.77.0.0/33"]')])


# -- pods behind their nodes ------------------------------------------------------------------


class Agents:
    """The agents the test says are there (target -> ranks of the job); anywhere else the
    connection is refused. Records every question."""

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = ranks
        self.asked: list[str] = []

    async def __call__(self, target: str, job_id: str) -> int:
        self.asked.append(target)
        if target not in self.ranks:
            raise AgentError(ErrorKind.UNREACHABLE, f"cannot reach {target}: Connection refused")
        return self.ranks[target]


class Routes:
    """This node's routes as the test gives them: address -> node, how; or why unreadable."""

    def __init__(self, routes: dict[str, tuple[str, str] | str]) -> None:
        self.routes = routes
        self.read: list[str] = []

    async def __call__(self, addr: IPAddress) -> NodeRoute | None:
        self.read.append(str(addr))
        r = self.routes.get(str(addr))
        if r is None:
            return None
        if isinstance(r, str):
            raise RouteError(r)
        return NodeRoute(ip(r[0]), r[1])


TRUSTED = PeerTrust(parse_networks(["10.0.0.0/8", "fd00::/8"]))


def _candidates(
    tmp_path: Path, agents: Agents, routes: Routes, own: tuple[str, ...] = (), looks: int = 1
) -> list[Candidate]:
    """What one lookup (of ``looks`` in a row, the last) found."""
    connections = ConnectionPeers(
        50051, TRUSTED, agents, own_targets=own, proc_root=_fake_proc(tmp_path, RANK_FDS),
        route=routes,
    )  # fmt: skip
    for _ in range(looks):
        found, note = asyncio.run(connections.candidates("run-7", [PID]))
        assert note == ""
    return found


def test_pod_addresses_are_asked_again_at_their_node_once_and_named_with_it(
    tmp_path: Path,
) -> None:
    """The ranks talk to two pods of one node and to an address whose route cannot be read:
    the node is asked once and becomes the peer, for both pods; the other says why."""
    agents = Agents({"10.88.0.2:50051": 1})
    routes = Routes({
        "10.77.0.2": ("10.88.0.2", "VXLAN flannel.1"),
        "10.77.0.3": ("10.88.0.2", "VXLAN flannel.1"),
        "fd00:77::5": "cannot run ip (No such file or directory): install iproute2",
    })  # fmt: skip
    found = _candidates(tmp_path, agents, routes, looks=2)
    refused = "no agent answers: cannot reach [fd00:77::5]:50051: Connection refused"
    assert sorted(found, key=lambda c: c.target) == [
        Candidate("10.88.0.2:50051", ranks=1, via=("10.77.0.2", "10.77.0.3")),
        Candidate(
            "[fd00:77::5]:50051",
            reason=f"{refused}; its route not read: cannot run ip (No such file or directory): "
            "install iproute2",
        ),
    ]
    assert sorted(agents.asked) == sorted(2 * [
        "10.77.0.2:50051", "10.77.0.3:50051", "10.88.0.2:50051", "[fd00:77::5]:50051"
    ])  # fmt: skip
    # Asked again at the second look; the routes read once (kept 5 minutes), but the one
    # that could not be read is read again.
    assert sorted(routes.read) == ["10.77.0.2", "10.77.0.3", "fd00:77::5", "fd00:77::5"]


def test_a_node_with_no_agent_of_the_job_or_this_node_itself_leaves_the_address_as_it_was(
    tmp_path: Path,
) -> None:
    agents = Agents({"10.88.0.3:50051": 0})  # an agent with no rank of the job
    routes = Routes({
        "10.77.0.2": ("10.88.0.9", "gateway on eth0"),  # nothing listens there
        "10.77.0.3": ("10.88.0.1", "VXLAN flannel.1"),  # this node
        "fd00:77::5": ("10.88.0.3", "gateway on eth0"),
    })  # fmt: skip
    found = _candidates(tmp_path, agents, routes, own=("10.88.0.1:50051",))

    def refused(target: str) -> str:
        return f"no agent answers: cannot reach {target}: Connection refused"

    assert sorted(found, key=lambda c: c.target) == [
        Candidate(
            "10.77.0.2:50051",
            reason=f"{refused('10.77.0.2:50051')}; nor at its node by this node's routes "
            f"(gateway on eth0), 10.88.0.9:50051: {refused('10.88.0.9:50051')}",
        ),
        Candidate("10.77.0.3:50051", reason=refused("10.77.0.3:50051")),
        Candidate(
            "[fd00:77::5]:50051",
            reason=f"{refused('[fd00:77::5]:50051')}; nor at its node by this node's routes "
            "(gateway on eth0), 10.88.0.3:50051: an agent with no rank of job run-7",
        ),
    ]
    assert "10.88.0.1:50051" not in agents.asked  # never its own peer


def test_status_names_every_found_address_not_asked_without_trust_and_what_was_left_out(
    tmp_path: Path,
) -> None:
    proc = _fake_proc(tmp_path, RANK_FDS)
    asked = Asked(2)
    peers = PeerSignals(
        [],
        1.0,
        rank_pids=lambda: {"run-7": [PID], "": [PID + 1]},
        connections=ConnectionPeers(
            50051, PeerTrust(), asked, proc_root=proc, cap=2, route=Routes({})
        ),
    )
    assert asyncio.run(peers._find_peers()) == []
    assert asked.targets == []
    (part,) = peers.statuses()
    assert part.state is PartState.OK
    why = "not asked: no CA configured ($BPFDYNO_TLS_CA) and not in [detection] peer_networks"
    assert part.reason == (
        "no peers: no agent at the addresses this node's ranks talk to holds ranks of their "
        f"jobs; not peers: 10.77.0.2:50051 ({why}), 10.77.0.3:50051 ({why}); job run-7: 3 "
        "remote addresses, only the lowest 2 asked"
    )


class Hangs:
    """An agent that takes the connection and never answers."""

    async def __call__(self, target: str, job_id: str) -> int:
        await asyncio.sleep(3600)
        return 1


def test_a_lookup_that_hangs_does_not_hold_up_the_pulls(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, RANK_FDS)
    trust = PeerTrust(parse_networks(["10.77.0.0/16", "fd00:77::/64"]))
    peers = PeerSignals(
        [],
        1.0,
        rank_pids=lambda: {"run-7": [PID]},
        connections=ConnectionPeers(50051, trust, Hangs(), proc_root=proc),
    )

    async def run() -> tuple[list[Peer], float, int]:
        t0 = time.monotonic()
        found = await asyncio.wait_for(peers._find_peers(), 60)
        took = time.monotonic() - t0
        looking = len(peers._looking)
        await peers.stop()
        return found, took, looking

    found, took, looking = asyncio.run(run())
    # The round waited half an interval for the lookup, not for the agents that hang.
    assert found == []
    assert looking == 1
    assert took < 10, took


def test_a_job_whose_addresses_hold_no_peer_is_looked_at_again_backing_off() -> None:
    peers = PeerSignals([], 1.0, rediscover_s=60.0)
    retry = peers._retry_after
    assert [retry(_Lookup(0.0, (), misses=m)) for m in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert retry(_Lookup(0.0, (Peer("10.77.0.2:50051", "10.77.0.2", "run-7"),))) == 60
    slow = PeerSignals([], 5.0, rediscover_s=60.0)  # three intervals above 5 s
    assert [slow._retry_after(_Lookup(0.0, (), misses=m)) for m in (1, 2, 3)] == [15, 30, 60]
