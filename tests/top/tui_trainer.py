"""A minimal PyTorch training loop for the UI's tracing test: Linear + SGD until killed.

Started with KINETO_USE_DAEMON=1, it registers with the agent. Prints "ready <pid>" after a
few optimizer steps, so both duration and iteration traces can start at once.
"""

import os
import sys
import time

import torch

model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch = torch.randn(16, 8)
deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 120)
for step in range(1, 10**9):
    optimizer.zero_grad()
    model(batch).pow(2).mean().backward()
    optimizer.step()
    if step == 3:
        print(f"ready {os.getpid()}", flush=True)
    if time.monotonic() > deadline:
        break
    time.sleep(0.01)
