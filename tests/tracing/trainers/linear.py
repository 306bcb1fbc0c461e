"""A tiny trainer: nn.Linear + SGD steps until killed (or --seconds pass).

Prints "ready <pid>" once a few optimizer steps have run, so iteration-based traces (which
need the optimizer-step hook to have counted steps) can start right away.
"""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=120.0)
parser.add_argument("--step-sleep", type=float, default=0.01)
parser.add_argument("--cpu", type=int, default=-1, help="pin the process to this CPU")
parser.add_argument(
    "--busy-ms", type=float, default=0.0, help="also spin this much CPU time in each step"
)
parser.add_argument(
    "--load", default="", help="load this shared library first (as libtorch_cpu.so would be)"
)
args = parser.parse_args()
if args.load:
    import ctypes

    ctypes.CDLL(args.load)

import torch  # noqa: E402 (after --load: the agent looks at the libraries at the first poll)

if args.cpu >= 0:
    os.sched_setaffinity(0, {args.cpu})

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 16)
end = time.monotonic() + args.seconds
step = 0
while time.monotonic() < end:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    if args.busy_ms > 0:
        spin_until = time.thread_time() + args.busy_ms / 1000
        while time.thread_time() < spin_until:
            pass
    step += 1
    if step == 5:
        print(f"ready {os.getpid()}", flush=True)
    if args.step_sleep > 0:
        time.sleep(args.step_sleep)
