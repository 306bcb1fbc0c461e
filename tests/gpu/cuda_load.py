"""A steady CUDA load for the GPU acceptance suite: bf16 matrix products on one GPU.

Its memory is allocated once, before "ready", so the GPU's memory use stays constant while
the suite compares readings; the products keep the GPU (and its tensor cores) busy. Runs
until killed or ``--seconds`` pass. Prints ``ready {"pid": ..., "torch": ...}``.
"""

import argparse
import json
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=600.0)
parser.add_argument("--size", type=int, default=8192)
args = parser.parse_args()

device = torch.device("cuda", 0)
a = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
b = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
c = torch.empty(args.size, args.size, device=device, dtype=torch.bfloat16)
for _ in range(20):  # cuBLAS picks its kernels and allocates its workspace now
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
facts = {"pid": os.getpid(), "torch": torch.__version__, "cuda": torch.version.cuda}
print("ready " + json.dumps(facts), flush=True)
end = time.monotonic() + args.seconds
while time.monotonic() < end:
    for _ in range(50):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
