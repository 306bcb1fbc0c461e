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
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid

from bpfdyno.tracing.ipc import wire


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
    s.bind(path)
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
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
