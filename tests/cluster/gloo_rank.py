"""One rank of a gloo job with the env:// rendezvous, as torchrun starts it (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID in its environment): an
all_reduce per step until --seconds pass. With --hold HOST:PORT it also keeps a TCP
connection to that address open (a rank talking to a machine that runs no agent); with
--busy-ms N it spins N ms of its own CPU time each step before the all_reduce (a straggler).

Prints "ready <pid> rank <rank>" after 3 steps.
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=300.0)
parser.add_argument("--hold", default="", help="HOST:PORT to keep a connection open to")
parser.add_argument("--busy-ms", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")
held = None
if args.hold:
    host, _, port = args.hold.rpartition(":")
    held = socket.create_connection((host, int(port)), timeout=30)
t = torch.ones(64)
end = time.monotonic() + args.seconds
step = 0
while time.monotonic() < end:
    spin_until = time.thread_time() + args.busy_ms / 1000
    while time.thread_time() < spin_until:
        pass
    dist.all_reduce(t)
    t.fill_(1.0)
    step += 1
    if step == 3:
        print(f"ready {os.getpid()} rank {dist.get_rank()}", flush=True)
    time.sleep(0.05)
dist.destroy_process_group()
