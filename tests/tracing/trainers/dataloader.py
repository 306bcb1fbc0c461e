"""A trainer whose DataLoader uses two spawn-context worker processes.

The workers import torch in a fresh interpreter, so they register with the daemon too.
Prints "ready <pid>" once batches flow (the workers are up).
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.full((16,), float(i % 7))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        Numbers(),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=True,
    )
    end = time.monotonic() + args.seconds
    for step, batch in enumerate(loader, start=1):
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()
        # Apart from the next step (prefetched batches would run it at once): the profiler
        # stops a fraction of a millisecond after an iteration trace's last step, and a step
        # begun meanwhile would be in the trace too.
        time.sleep(0.01)
        if step == 5:
            print(f"ready {os.getpid()}", flush=True)
        if time.monotonic() > end:
            break


if __name__ == "__main__":
    main()
