"""A CUDA training loop for the GPU acceptance suite, traced on demand like any unmodified job
started with ``KINETO_USE_DAEMON=1``.

Each step, in this order: forward and backward of bf16 ``Linear`` layers; two all-reduces
through NCCL with known arguments (world size 1: NCCL launches no kernel, but the calls are
made); `SEND_BYTES` sent over a loopback TCP connection to itself and read back; the
optimizer step (where Kineto starts and stops iteration traces). So every step between two
optimizer steps holds exactly one of each call, away from the trace's edges.

Prints ``ready {...}`` (its pid, versions and the connection's addresses) after 5 steps.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist

#: The all-reduces of each step: (elements, dtype, op). The suite expects these exactly.
SUM_COUNT = 1_048_583
MAX_COUNT = 4_099
#: Bytes sent (and read back) over loopback TCP each step.
SEND_BYTES = 65_521

parser = argparse.ArgumentParser()
parser.add_argument("--store", required=True, help="file for the process group's FileStore")
parser.add_argument("--seconds", type=float, default=600.0)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--width", type=int, default=4096)
args = parser.parse_args()

torch.cuda.set_device(0)
device = torch.device("cuda", 0)
# A FileStore, not TCP: the only TCP traffic in the traces is the connection below.
dist.init_process_group("nccl", init_method=f"file://{args.store}", rank=0, world_size=1)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
model = model.to(device=device, dtype=torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(args.width, args.width, device=device, dtype=torch.bfloat16)
sums = torch.ones(SUM_COUNT, device=device, dtype=torch.float32)
maxes = torch.ones(MAX_COUNT, device=device, dtype=torch.bfloat16)

server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
payload = b"x" * SEND_BYTES
inbox = bytearray(SEND_BYTES)


def read_back() -> None:
    view = memoryview(inbox)
    got = 0
    while got < SEND_BYTES:
        n = peer.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the loopback connection closed")
        got += n


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def nccl_version() -> str:
    v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # a tuple in recent PyTorch, an int in old ones
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


end = time.monotonic() + args.seconds
step = 0
while time.monotonic() < end:
    opt.zero_grad(set_to_none=True)
    model(x).float().square().mean().backward()
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
    client.sendall(payload)
    read_back()
    opt.step()
    step += 1
    if step == 5:
        facts = {
            "pid": os.getpid(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": nccl_version(),
            "client": address(client),
            "server": address(server),
        }
        print("ready " + json.dumps(facts), flush=True)
dist.destroy_process_group()
