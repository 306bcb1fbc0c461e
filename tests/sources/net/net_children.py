"""Child processes that move known numbers of bytes, for the network BPF tests.

Each child talks to the test over its stdin/stdout (pipes, not sockets, so they add nothing to
the counters): it prints ``key value`` lines and waits for a line on stdin where it must stay
alive (the kernel program forgets a process once it exits).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

TCP_SERVER = r"""
import socket, sys
host, port, reply = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((host, port))
srv.listen()
print("port", srv.getsockname()[1], flush=True)
conn, peer = srv.accept()
want = int(sys.stdin.readline())
peeked = conn.recv(100, socket.MSG_PEEK)  # must not be counted
got = 0
while got < want:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    got += len(chunk)
print("received", got, flush=True)
conn.sendall(b"r" * reply)
while conn.recv(65536):  # until the client closes
    pass
conn.close()
srv.close()
print("closed", 0, flush=True)
sys.stdin.readline()
"""

TCP_CLIENT = r"""
import socket, sys
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = socket.create_connection((host, port))
print("local", c.getsockname()[1], flush=True)
c.sendall(b"s" * size)
reply = int(sys.stdin.readline())
got = 0
while got < reply:
    got += len(c.recv(65536))
print("got", got, flush=True)
sys.stdin.readline()  # keep the connection open until told
c.close()
print("closed", 0, flush=True)
sys.stdin.readline()
"""

UDP_SERVER = r"""
import socket, sys
n, reply = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.bind(("127.0.0.1", 0))
print("port", s.getsockname()[1], flush=True)
total = 0
for _ in range(n):
    data, peer = s.recvfrom(65536)
    total += len(data)
s.sendto(b"u" * reply, peer)
print("received", total, flush=True)
sys.stdin.readline()
"""

UDP_CLIENT = r"""
import socket, sys
port, sizes = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for n in sizes:
    s.sendto(b"d" * n, ("127.0.0.1", port))
data = s.recv(65536)
print("got", len(data), flush=True)
sys.stdin.readline()
"""

REFUSED = r"""
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])))
except ConnectionRefusedError:
    print("refused", 1, flush=True)
sys.stdin.readline()
"""

CHURN_CONNECTIONS = r"""
import socket, sys
n = int(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(128)
for _ in range(n):
    c = socket.create_connection(srv.getsockname())
    a, _ = srv.accept()
    c.close()
    a.close()
print("done", n, flush=True)
sys.stdin.readline()
"""


class Child:
    """A Python child process speaking the line protocol above."""

    def __init__(self, code: str, args: Sequence[object], prefix: Sequence[str] = ()) -> None:
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", code, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid

    def expect(self, key: str) -> int:
        """Read the next ``key value`` line; fail if the child said something else."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"child {self.pid} exited (rc={self.proc.wait()}) before {key!r}")
        got_key, value = line.split()
        assert got_key == key, f"child {self.pid} said {line!r}, expected {key!r}"
        return int(value)

    def send(self, line: object = "") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        """Let the child exit (it may be waiting for any number of lines)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("\n\n\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
