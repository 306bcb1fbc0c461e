"""A trainer that calls the real libnccl (the nvidia-nccl-cu12 wheel's) every step, with no GPU.

The calls still enter the library (they return an error without a communicator), which is
all the NCCL track needs. Each step, with the arguments `CALLS` lists: ncclGroupStart,
ncclSend, ncclRecv, ncclGroupEnd, ncclAllReduce, ncclBroadcast, ncclReduce (eight
arguments: its last two travel on the stack on x86-64).

Prints "results <json>" (what each function returned) and "ready <pid>".
"""

import ctypes
import importlib.util
import json
import os
import time

import torch

spec = importlib.util.find_spec("nvidia.nccl")
assert spec is not None and spec.submodule_search_locations, "nvidia-nccl-cu12 is not installed"
LIB = os.path.join(next(iter(spec.submodule_search_locations)), "lib", "libnccl.so.2")
nccl = ctypes.CDLL(LIB)
P = ctypes.c_void_p
N = ctypes.c_size_t
NULL_COMM = None  # NCCL checks the communicator first and returns ncclInvalidArgument

CALLS = [
    ("ncclGroupStart", ()),
    ("ncclSend", (P(0x1000), N(33), 2, 1, NULL_COMM, P(0x5150))),
    ("ncclRecv", (P(0x2000), N(44), 9, 2, NULL_COMM, P(0x5151))),
    ("ncclGroupEnd", ()),
    ("ncclAllReduce", (P(0x3000), P(0x4000), N(4096), 7, 0, NULL_COMM, P(0x5152))),
    ("ncclBroadcast", (P(0x5000), P(0x6000), N(77), 4, 3, NULL_COMM, P(0x5153))),
    ("ncclReduce", (P(0x7000), P(0x8000), N(5), 8, 2, 6, NULL_COMM, P(0x5154))),
]

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 16)
end = time.monotonic() + 120
step = 0
while time.monotonic() < end:
    opt.step()
    time.sleep(0.01)  # away from the step, where the profiler starts and stops
    results = {name: getattr(nccl, name)(*fn_args) for name, fn_args in CALLS}
    time.sleep(0.01)
    opt.zero_grad()
    model(x).sum().backward()
    step += 1
    if step == 5:
        print("results " + json.dumps(results), flush=True)
        print(f"ready {os.getpid()}", flush=True)
