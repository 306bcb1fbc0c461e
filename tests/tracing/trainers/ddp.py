"""One rank of a 2-rank DistributedDataParallel job on gloo, started by torchrun.

Prints "ready <pid> rank <rank>" after a few synchronised optimizer steps.
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 16)
    end = time.monotonic() + float(os.environ.get("TRAIN_SECONDS", "120"))
    step = 0
    while time.monotonic() < end:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        step += 1
        if step == 5:
            # One write(2) per line: both ranks share the launcher's stdout pipe, and print()
            # writes the text and its newline separately, so the lines could interleave.
            os.write(1, f"ready {os.getpid()} rank {rank}\n".encode())
        time.sleep(0.01)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
