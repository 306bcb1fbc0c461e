"""A trainer whose every step talks to a TCP server and sleeps, by exact amounts.

Each step: the optimizer step, then — inside a ``record_function("bpfdyno_test:talk")``
annotation, padded by 2 ms sleeps so the annotation surely spans the calls — it sends exactly
``--send-bytes`` to the server and receives exactly ``--recv-bytes`` back, then sleeps
``--sleep-ms``, then forward and backward. So an iteration trace of K steps holds exactly K
sends, K receives and K long sleeps, each well away from the step boundaries.

Prints "ready <pid> <local port>" once a few steps have run.
"""

import argparse
import os
import socket
import time

import torch
from torch.profiler import record_function

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--send-bytes", type=int, required=True)
parser.add_argument("--recv-bytes", type=int, required=True)
parser.add_argument("--sleep-ms", type=float, required=True)
parser.add_argument("--seconds", type=float, default=120.0)
args = parser.parse_args()

sock = socket.create_connection(("127.0.0.1", args.port))
payload = b"x" * args.send_bytes
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 16)
end = time.monotonic() + args.seconds
step = 0
while time.monotonic() < end:
    opt.step()
    with record_function("bpfdyno_test:talk"):
        time.sleep(0.002)
        sock.sendall(payload)
        got = 0
        while got < args.recv_bytes:
            chunk = sock.recv(args.recv_bytes - got)
            if not chunk:
                raise SystemExit("the server closed the connection")
            got += len(chunk)
        time.sleep(0.002)
    time.sleep(args.sleep_ms / 1000)
    opt.zero_grad()
    model(x).sum().backward()
    step += 1
    if step == 5:
        print(f"ready {os.getpid()} {sock.getsockname()[1]}", flush=True)
