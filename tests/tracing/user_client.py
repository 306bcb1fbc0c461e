"""What an unprivileged local user runs against the agent in the security tests.

Usage (each prints one JSON line):

  user_client.py frame PORT HEX            send the frame (hex bytes) to the legacy port,
                                           print {"reply": hex}
  user_client.py hold PORT N               open N connections at once and send nothing;
                                           print, per connection, when and what it answered
  user_client.py impostor SOCKDIR PID S    poll the agent for S seconds claiming to be PID;
                                           print how many replies came and any config text
  user_client.py bind SOCKDIR              bind SOCKDIR/dynolog (as if it were the agent) and
                                           wait for stdin to close
  user_client.py peek SOCK TRACE_ID        ask the agent's gRPC API about a trace: GetTrace,
                                           WatchTrace, GetTraceSummary (status code or
                                           answer each) and the trainers' trace ids
  user_client.py flood SOCKDIR N SECONDS [mute]
                                           register N fake trainers (N sockets of this
                                           process) and keep them polling for SECONDS; print
                                           how many were answered in the last round (mute:
                                           never read a reply)
  user_client.py slow PORT N SECONDS HEX   open N TCP connections, send HEX on each, then one
                                           byte every 0.5 s for SECONDS; print when each ended
  user_client.py squat SOCKDIR UID SECONDS
                                           learn the agent's reply-socket names from its
                                           reply to one poll, bind the name it would give
                                           UID, hold it for SECONDS; print the names bound
  user_client.py polls SOCKDIR N           poll N times like a trainer, waiting 1 s for each
                                           reply; print how many came and from where
  user_client.py shrink SOCKDIR MIB S      map a MIB MiB file named like libkineto, poll like
                                           a trainer, and truncate and regrow the file for
                                           S seconds; print how often
  user_client.py kineto SOCKDIR SOURCE     poll like a trainer; given a config, stay busy two
                                           polls, then copy SOURCE to the file it names (with
                                           _<pid>, as Kineto); print its path; stop at EOF
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import socket
import sys
import time
import uuid

import grpc

from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.tracing.ipc import wire
from bpfdyno.tracing.paths import kineto_output_path


def kineto_bind(s: socket.socket, path: str) -> None:
    """Bind a fake trainer's socket as libkineto binds its own in a socket directory: mode
    0666, whatever this user's umask (the agent's replies must reach it also when it runs
    without CAP_DAC_OVERRIDE, as the packaged unit does)."""
    s.bind(path)
    os.chmod(path, 0o666)


def frame(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    print(json.dumps({"reply": b"".join(chunks).hex()}))


def hold(port: int, n: int) -> None:
    t0 = time.monotonic()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(n)]
    out = []
    for s in socks:
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        out.append({"after_s": time.monotonic() - t0, "reply": data[4:].decode(errors="replace")})
        s.close()
    print(json.dumps(out))


def impostor(sock_dir: str, pid: int, seconds: float) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(sock_dir, f"dynoconfigclient{uuid.uuid4()}")
    kineto_bind(s, path)
    s.settimeout(1.0)
    replies, configs = 0, []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            s.sendto(wire.encode_request(3, 0, [pid]), os.path.join(sock_dir, "dynolog"))
            try:
                data = s.recv(300_000)
            except TimeoutError:
                continue
            replies += 1
            _, payload = wire.decode_reply(data)
            if payload:
                configs.append(payload.decode())
            time.sleep(0.2)
    finally:
        s.close()
        os.unlink(path)
    print(json.dumps({"replies": replies, "configs": configs}))


def bind(sock_dir: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(os.path.join(sock_dir, "dynolog"))
    print(json.dumps({"bound": True}), flush=True)
    sys.stdin.read()
    s.close()


def peek(sock: str, trace_id: str) -> None:
    out: dict[str, object] = {}
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        stub = pb_grpc.TracingStub(ch)
        req = pb.GetTraceRequest(trace_id=trace_id)
        calls = {
            "get": lambda: stub.GetTrace(req, timeout=10).trace_id,
            "watch": lambda: next(iter(stub.WatchTrace(req, timeout=10))).trace_id,
            "summary": lambda: [p.path for p in stub.GetTraceSummary(req, timeout=60).processes],
        }
        for name, call in calls.items():
            try:
                out[name] = call()
            except grpc.RpcError as e:
                out[name] = e.code().name  # type: ignore[attr-defined]
        trainers = stub.ListTrainers(pb.ListTrainersRequest(), timeout=10).trainers
        out["trainer_trace_ids"] = {str(t.pid): t.trace_id for t in trainers}
    print(json.dumps(out))


def flood(sock_dir: str, n: int, seconds: float, mute: bool = False) -> None:
    daemon = os.path.join(sock_dir, "dynolog")
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        kineto_bind(s, os.path.join(sock_dir, f"dynoconfigclient{uuid.uuid4()}"))
        s.setblocking(False)
        socks.append(s)
    poll = wire.encode_request(3, 0, [os.getpid()])
    end = time.monotonic() + seconds
    answered = 0
    try:
        while time.monotonic() < end:
            for s in socks:  # like libkineto: a full agent queue is retried after a moment
                for _ in range(50):
                    try:
                        s.sendto(poll, daemon)
                        break
                    except BlockingIOError:
                        time.sleep(0.005)
            time.sleep(1.0)
            if mute:
                continue
            answered = 0
            for s in socks:
                try:
                    while s.recv(300_000):
                        answered += 1
                except BlockingIOError:
                    pass
    finally:
        print(json.dumps({"answered": answered}), flush=True)
        for s in socks:
            os.unlink(s.getsockname())
            s.close()


def slow(port: int, n: int, seconds: float, first: bytes) -> None:
    t0 = time.monotonic()
    sel = selectors.DefaultSelector()
    for i in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(first)
        except OSError:
            continue
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    ended: dict[int, float] = {}
    while time.monotonic() - t0 < seconds and len(ended) < n:
        for key in list(sel.get_map().values()):
            s = key.fileobj
            try:
                s.send(b" ")  # type: ignore[union-attr]
            except OSError:
                ended[key.data] = time.monotonic() - t0
                sel.unregister(s)
                s.close()  # type: ignore[union-attr]
        for key, _ in sel.select(0.5):
            s = key.fileobj
            try:
                data = s.recv(65536)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data:
                ended[key.data] = time.monotonic() - t0
                sel.unregister(s)
                s.close()  # type: ignore[union-attr]
    print(
        json.dumps(
            {"ended_after_s": sorted(ended.values()), "connected": len(ended) + len(sel.get_map())}
        )
    )


def kineto(sock_dir: str, source: str) -> None:
    """A trainer of this user that writes its own "trace" (any process may poll)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(sock_dir, f"dynoconfigclient{uuid.uuid4()}")
    kineto_bind(s, path)
    s.settimeout(0.5)
    pid = os.getpid()
    busy = 0
    target = ""
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    print(json.dumps({"pid": pid}), flush=True)
    try:
        while not sel.select(0.2):
            poll = wire.encode_request(1 if busy else 3, 0, [pid])
            with contextlib.suppress(OSError):  # the agent is gone (stopped): stop at EOF
                s.sendto(poll, os.path.join(sock_dir, "dynolog"))
            try:
                _, config = wire.decode_reply(s.recv(300_000))
            except TimeoutError:
                continue
            for line in config.decode().splitlines():
                if line.startswith("ACTIVITIES_LOG_FILE="):
                    target = kineto_output_path(line.split("=", 1)[1], pid)
                    busy = 3
            if busy:
                busy -= 1
                if not busy:
                    shutil.copyfile(source, target + ".tmp")
                    os.rename(target + ".tmp", target)
                    print(json.dumps({"wrote": target}), flush=True)
    finally:
        s.close()
        os.unlink(path)


def _poll_once(s: socket.socket, daemon: str, timeout: float) -> str | None:
    """Send one poll as this process; the reply's sender (None: no reply in time)."""
    s.sendto(wire.encode_request(3, 0, [os.getpid()]), daemon)
    s.settimeout(timeout)
    try:
        _, sender = s.recvfrom(300_000)
    except TimeoutError:
        return None
    return str(sender)


def squat(sock_dir: str, uid: int, seconds: float) -> None:
    daemon = os.path.join(sock_dir, "dynolog")
    me = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    kineto_bind(me, os.path.join(sock_dir, f"dynoconfigclient{uuid.uuid4()}"))
    held = []
    try:
        sender = _poll_once(me, daemon, 5.0)
        assert sender is not None, "the agent did not answer"
        # dynolog-reply-<my uid>-<token>: the same token would name UID's socket.
        mine = f"dynolog-reply-{os.getuid()}-"
        name = os.path.basename(sender)
        token = name[len(mine) :] if name.startswith(mine) else ""
        for guess in {f"dynolog-reply-{uid}-{token}", f"dynolog-reply-{uid}-"}:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            with contextlib.suppress(OSError):
                s.bind(os.path.join(sock_dir, guess))
                held.append(s)
        print(json.dumps({"learned": name, "bound": [s.getsockname() for s in held]}), flush=True)
        time.sleep(seconds)
    finally:
        for s in [*held, me]:
            with contextlib.suppress(OSError):
                os.unlink(s.getsockname())
            s.close()


def polls(sock_dir: str, n: int) -> None:
    daemon = os.path.join(sock_dir, "dynolog")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(sock_dir, f"dynoconfigclient{uuid.uuid4()}")
    kineto_bind(s, path)
    senders = []
    try:
        for _ in range(n):
            sender = _poll_once(s, daemon, 1.0)
            if sender is not None:
                senders.append(sender)
            time.sleep(0.2)
    finally:
        s.close()
        os.unlink(path)
    print(json.dumps({"replies": len(senders), "senders": senders}))


def shrink(sock_dir: str, mib: int, seconds: float) -> None:
    """A "trainer" whose libkineto is truncated and regrown while the agent searches it."""
    import mmap
    import threading

    lib = os.path.abspath("libkineto-shrinking.so")
    size = mib << 20
    with open(lib, "wb") as f:
        f.truncate(size)
    fd = os.open(lib, os.O_RDWR)
    mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)  # in /proc/<pid>/maps, never touched
    stop = threading.Event()
    toggles = [0]

    def toggle() -> None:
        while not stop.is_set():
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)
            toggles[0] += 1
            time.sleep(0.002)  # mostly at full size: the agent opens it and starts reading

    t = threading.Thread(target=toggle)
    t.start()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(sock_dir, f"dynoconfigclient{uuid.uuid4()}")
    kineto_bind(s, path)
    s.settimeout(0.2)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                s.sendto(wire.encode_request(3, 0, [os.getpid()]),
                         os.path.join(sock_dir, "dynolog"))  # fmt: skip
            with contextlib.suppress(OSError):
                s.recv(300_000)
            time.sleep(0.3)
    finally:
        stop.set()
        t.join()
        mapped.close()
        os.close(fd)
        s.close()
        os.unlink(path)
        os.unlink(lib)
        print(json.dumps({"pid": os.getpid(), "toggles": toggles[0]}), flush=True)


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "frame":
        frame(int(args[0]), bytes.fromhex(args[1]))
    elif cmd == "hold":
        hold(int(args[0]), int(args[1]))
    elif cmd == "impostor":
        impostor(args[0], int(args[1]), float(args[2]))
    elif cmd == "bind":
        bind(args[0])
    elif cmd == "peek":
        peek(args[0], args[1])
    elif cmd == "flood":
        flood(args[0], int(args[1]), float(args[2]), args[3:] == ["mute"])
    elif cmd == "slow":
        slow(int(args[0]), int(args[1]), float(args[2]), bytes.fromhex(args[3]))
    elif cmd == "squat":
        squat(args[0], int(args[1]), float(args[2]))
    elif cmd == "polls":
        polls(args[0], int(args[1]))

    elif cmd == "shrink":
        shrink(args[0], int(args[1]), float(args[2]))
    elif cmd == "kineto":
        kineto(args[0], args[1])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
