"""The Kineto IPC endpoint over real datagram sockets (socket-directory mode)."""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import struct
from pathlib import Path

import pytest
from tracing_harness import Harness, KinetoClient

from bpfdyno.core.status import PartState
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.ipc import wire
from bpfdyno.tracing.ipc.endpoint import SENDER_BURST, EndpointUnavailable, KinetoEndpoint


async def test_reply_comes_from_the_bound_socket_with_exact_bytes(harness: Harness) -> None:
    client = KinetoClient(str(harness.socket_dir))
    try:
        client.sock.sendto(wire.encode_request(3, 0, [4321, 4000]), client.daemon)
        data, sender = await client.recv()
        # The poller's user's reply socket, in the socket directory (where libkineto wants it).
        assert re.fullmatch(rf"{harness.socket_dir}/dynolog-reply-0-[0-9a-f]{{24}}", str(sender))
        assert data == b"\0" * 8 + b"req" + b"\0" * 29
        assert os.stat(client.daemon).st_mode & 0o777 == 0o666
        [view] = harness.service.list_trainers()
        assert (view.pid, view.ancestors, view.job_id) == (4321, (4000,), 0)
    finally:
        client.close()


async def test_config_reaches_the_client_and_context_is_counted(harness: Harness) -> None:
    client = KinetoClient(str(harness.socket_dir))
    try:
        assert await client.poll([4400, 1]) == ""
        res = harness.service.start_trace(
            TraceRequest(
                pids=(4400,),
                options=TraceSpec(log_file=str(harness.trace_dir / "t.json"), iterations=2),
            )
        )
        text = await client.poll([4400, 1])
        assert text.splitlines()[-1] == f"REQUEST_TRACE_ID={res.trace_id}"
        for pid, count in ((4400, 1), (4401, 2), (4400, 2)):
            client.sock.sendto(wire.encode_context(gpu=0, pid=pid, job_id=3), client.daemon)
            data, _ = await client.recv()
            assert wire.decode_reply(data) == ("ctxt", struct.pack("<i", count))
    finally:
        client.close()


def _malformed_datagrams(rng: random.Random, n: int) -> list[bytes]:
    valid = wire.encode_request(3, 7, [5000, 4000, 3000])
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:  # truncated anywhere, header included
            out.append(valid[: rng.randrange(0, len(valid))])
        elif kind == 1:  # random bytes whose header cannot match their length
            body = rng.randbytes(rng.randrange(0, 200))
            out.append(struct.pack("<Q", len(body) + 1 + rng.randrange(0, 1000)) + body)
        elif kind == 2:  # a well-formed header with random n / pids
            n_pids = rng.choice([0, 12, 100, -1])
            payload = struct.pack("<iiq", 3, n_pids, 0) + rng.randbytes(4 * rng.randrange(0, 12))
            out.append(wire.encode("req", payload))
        else:  # an unknown type
            out.append(wire.encode(rng.choice(["reqq", "", "ctx", "REQ"]), rng.randbytes(16)))
    return out


async def test_thousands_of_malformed_datagrams_leave_it_serving(harness: Harness) -> None:
    rng = random.Random(1234)
    senders = []
    for i in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(str(harness.socket_dir / f"fuzz{i}"))
        s.setblocking(False)
        senders.append(s)
    bad = _malformed_datagrams(rng, 200 * SENDER_BURST)
    daemon = str(harness.socket_dir / "dynolog")
    sent = 0
    try:
        for i, data in enumerate(bad):
            sock = senders[i % len(senders)]
            while True:
                try:
                    sock.sendto(data, daemon)
                    sent += 1
                    break
                except BlockingIOError:  # the daemon's queue is full: let the loop drain it
                    await asyncio.sleep(0.001)
        stats = harness.comp.endpoint.stats
        async with asyncio.timeout(10):
            while stats.received < sent:
                await asyncio.sleep(0.01)
        assert sent == 4000
        assert sum(stats.malformed.values()) == 4000
        assert stats.replied == 0
        assert set(stats.malformed) <= {
            "short_header",
            "size_mismatch",
            "bad_pid_count",
            "unknown_type",
            "bad_type",
            "short_payload",
        }
    finally:
        for s in senders:
            s.close()
    client = KinetoClient(str(harness.socket_dir))
    try:
        assert await client.poll([5100, 1], job_id=8) == ""
        assert [v.pid for v in harness.service.list_trainers()] == [5100]
        assert harness.comp.statuses()[0].state is PartState.OK
    finally:
        client.close()


async def test_a_flooding_sender_is_limited_and_others_are_answered(harness: Harness) -> None:
    flooder = KinetoClient(str(harness.socket_dir))
    others = [KinetoClient(str(harness.socket_dir)) for _ in range(5)]
    try:
        flood = wire.encode_request(3, 0, [6000])

        async def flood_for(seconds: float) -> int:
            loop = asyncio.get_running_loop()
            end, n = loop.time() + seconds, 0
            while loop.time() < end:
                try:
                    flooder.sock.sendto(flood, flooder.daemon)
                    n += 1
                except BlockingIOError:
                    await asyncio.sleep(0)
            return n

        flooding = asyncio.create_task(flood_for(1.0))
        await asyncio.sleep(0.1)
        # The others retry a full queue like libkineto does (10 times, from 10 ms, doubling).
        replies = await asyncio.gather(*(c.poll([6001 + i]) for i, c in enumerate(others)))
        assert replies == [""] * 5
        flood_sent = await flooding
        stats = harness.comp.endpoint.stats
        async with asyncio.timeout(5):
            while stats.received < flood_sent + 5:
                await asyncio.sleep(0.01)
        assert flood_sent > 1000
        # The flooder gets its burst and ~10/s; everything else of it is dropped unanswered.
        assert stats.dropped["rate_limited"] >= flood_sent - SENDER_BURST - 20
        assert harness.comp.endpoint.stats.dropped["rate_limited"] > 0
        assert sorted(v.pid for v in harness.service.list_trainers()) == [6000, *range(6001, 6006)]
    finally:
        for c in [flooder, *others]:
            c.close()


async def test_unnamed_sender_is_dropped(harness: Harness) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.sendto(wire.encode_request(3, 0, [7000]), str(harness.socket_dir / "dynolog"))
        stats = harness.comp.endpoint.stats
        async with asyncio.timeout(5):
            while stats.dropped["unnamed_sender"] == 0:
                await asyncio.sleep(0.01)
        assert harness.service.list_trainers() == []
    finally:
        s.close()


async def test_second_endpoint_on_the_same_directory_is_refused(harness: Harness) -> None:
    other = KinetoEndpoint(harness.service, str(harness.socket_dir))
    with pytest.raises(EndpointUnavailable, match="bound by a running process"):
        other.open(asyncio.get_running_loop())


async def test_stale_socket_file_is_replaced_and_removed_on_close(short_tmp: Path) -> None:
    for name in ("dynolog", "dynolog-reply-0-0badcafe"):  # a crashed daemon's leftovers:
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        stale.bind(str(short_tmp / name))
        stale.close()  # the file stays, nobody is bound
    from bpfdyno.services.tracing import TracingService
    from bpfdyno.tracing.trainers import TrainerRegistry

    svc = TracingService([str(short_tmp)], 60.0, TrainerRegistry())
    ep = KinetoEndpoint(svc, str(short_tmp))
    ep.open(asyncio.get_running_loop())
    try:
        assert not (short_tmp / "dynolog-reply-0-0badcafe").exists()
        client = KinetoClient(str(short_tmp))
        assert await client.poll([7100]) == ""
        client.close()
        assert [n.startswith("dynolog-reply-0-") for n in os.listdir(short_tmp)].count(True) == 1
    finally:
        ep.close()
    assert os.listdir(short_tmp) == []  # its own reply sockets are removed too


def test_missing_socket_dir_is_explained(tmp_path: Path) -> None:
    from bpfdyno.services.tracing import TracingService
    from bpfdyno.tracing.trainers import TrainerRegistry

    ep = KinetoEndpoint(TracingService(["/tmp"], 60.0, TrainerRegistry()), str(tmp_path / "no"))
    with pytest.raises(EndpointUnavailable, match="does not exist"):
        ep.open(asyncio.new_event_loop())


async def test_departed_clients_socket_files_are_cleaned_up(harness: Harness) -> None:
    ep = harness.comp.endpoint
    gone = KinetoClient(str(harness.socket_dir))
    alive = KinetoClient(str(harness.socket_dir))
    try:
        gone.sock.close()  # like libkineto at exit: the file stays behind
        assert ep.forget_client(gone.path.encode()) is True
        assert not os.path.exists(gone.path)
        assert ep.forget_client(alive.path.encode()) is False  # still bound: kept
        assert os.path.exists(alive.path)
        assert ep.forget_client(b"/etc/passwd") is False
        assert ep.forget_client(b"\0dynoconfigclient-abstract\0") is False
    finally:
        alive.close()


@pytest.mark.root
async def test_many_trainers_polling_at_once_fit_in_the_queue(harness: Harness) -> None:
    """The socket's queue is raised (as root) so 64 simultaneous polls need no retry."""
    qlen_sysctl = Path("/proc/sys/net/unix/max_dgram_qlen")
    before = qlen_sysctl.read_text()
    assert harness.comp.endpoint.queue_len == max(512, int(before))
    assert qlen_sysctl.read_text() == before  # only the endpoint's own socket kept it
    clients = [KinetoClient(str(harness.socket_dir)) for _ in range(64)]
    try:
        # Sent before the event loop runs again: all 64 must fit in the kernel queue.
        for i, c in enumerate(clients):
            c.sock.sendto(wire.encode_request(3, 0, [20_000 + i]), c.daemon)
        replies = await asyncio.gather(*(c.recv() for c in clients))
        assert [wire.decode_reply(data) for data, _ in replies] == [("req", b"")] * 64
    finally:
        for c in clients:
            c.close()


async def test_oversized_datagram_is_counted_not_parsed(harness: Harness) -> None:
    client = KinetoClient(str(harness.socket_dir))
    try:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        big = wire.encode("req", b"\0" * (wire.MAX_DATAGRAM + 100))
        client.sock.sendto(big, client.daemon)
        assert await client.poll([7300]) == ""  # answered after the oversized one was dropped
        assert harness.comp.endpoint.stats.malformed["too_large"] == 1
    finally:
        client.close()


@pytest.mark.parametrize("use_libc", [True, False])
def test_datagram_io_addresses(short_tmp: Path, use_libc: bool) -> None:
    """Both I/O paths report senders alike: abstract names with their NULs, plain paths."""
    from bpfdyno.tracing.ipc.rawsock import DatagramIO

    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(short_tmp / "srv"))
    server.setblocking(False)
    io = DatagramIO(server, 64, keep_gil=use_libc)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"\0bpfdyno-test-{os.getpid()}-{use_libc}\0".encode()
    abstract.bind(name)
    path_client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path_client.bind(str(short_tmp / "cli"))
    unnamed = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        with pytest.raises(BlockingIOError):
            io.recvmsg()
        abstract.sendto(b"hello", str(short_tmp / "srv"))
        assert io.recvmsg() == (b"hello", 5, name, None)  # no SO_PASSCRED: no credentials
        server.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        me = (os.getpid(), os.getuid(), os.getgid())
        path_client.sendto(b"x" * 10, str(short_tmp / "srv"))
        assert io.recvmsg() == (b"x" * 10, 10, str(short_tmp / "cli").encode(), me)
        unnamed.sendto(b"?", str(short_tmp / "srv"))
        assert io.recvmsg() == (b"?", 1, None, me)
        io.sendto(b"reply", name)
        assert abstract.recv(10) == b"reply"
        io.sendto(b"r2", str(short_tmp / "cli").encode())
        assert path_client.recv(10) == b"r2"
        path_client.close()
        with pytest.raises(ConnectionRefusedError):
            io.sendto(b"r3", str(short_tmp / "cli").encode())
    finally:
        for s in (server, abstract, path_client, unnamed):
            s.close()


async def test_reply_socket_names_are_fresh_and_a_taken_one_is_retried(short_tmp: Path) -> None:
    """Each reply socket gets a name of its own (nothing to learn from another's), and a
    name someone took first is given up for a new one."""
    from bpfdyno.services.tracing import TracingService
    from bpfdyno.tracing.ipc.replies import random_name
    from bpfdyno.tracing.trainers import TrainerRegistry

    names = [random_name(0) for _ in range(64)]
    assert len(set(names)) == 64
    assert all(re.fullmatch(r"dynolog-reply-0-[0-9a-f]{24}", n) for n in names)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    squatter.bind(str(short_tmp / "dynolog-reply-0-taken"))
    tries = iter(["dynolog-reply-0-taken", "dynolog-reply-0-free"])
    svc = TracingService([str(short_tmp)], 60.0, TrainerRegistry())
    ep = KinetoEndpoint(svc, str(short_tmp), reply_names=lambda user: next(tries))
    ep.open(asyncio.get_running_loop())
    client = KinetoClient(str(short_tmp))
    try:
        await client.send(wire.encode_request(3, 0, [7100]))
        _, sender = await client.recv()
        assert sender == str(short_tmp / "dynolog-reply-0-free")
        assert ep.stats.replies_dropped_by_user == {}
    finally:
        client.close()
        ep.close()
        squatter.close()


async def test_no_reply_socket_means_a_dropped_reply_never_the_shared_socket(
    short_tmp: Path,
) -> None:
    """When no name can be bound, the poll's reply is dropped and counted against its user
    (shown by status), instead of going out from the endpoint's socket that every user's
    replies would then share."""
    from bpfdyno.services.tracing import TracingService
    from bpfdyno.tracing.trainers import TrainerRegistry

    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    squatter.bind(str(short_tmp / "dynolog-reply-0-taken"))
    svc = TracingService([str(short_tmp)], 60.0, TrainerRegistry())
    ep = KinetoEndpoint(svc, str(short_tmp), reply_names=lambda user: "dynolog-reply-0-taken")
    ep.open(asyncio.get_running_loop())
    client = KinetoClient(str(short_tmp))
    try:
        for _ in range(3):
            await client.send(wire.encode_request(3, 0, [7100]))
        with pytest.raises(TimeoutError):
            await client.recv(timeout=0.5)
        assert ep.stats.replies_dropped_by_user == {0: 3}
        assert ep.stats.dropped == {"no_reply_socket": 3}
        assert ep.stats.summary().endswith("3 dropped (replies dropped: uid 0: 3)")
    finally:
        client.close()
        ep.close()
        squatter.close()
