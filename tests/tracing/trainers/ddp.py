"""One rank of a DistributedDataParallel job on gloo, started by torchrun.

A step: forward, backward (DDP all-reduces the gradients: one ``gloo:all_reduce`` per
step), optimizer step, then a sleep. The batch is the same random tensor every step, or,
with ``--batches FIFO``, read from that FIFO each step (``BATCH_BYTES``, 64 x 16 float32)
before the forward: another process writes them (``batch_feeder.py``), so a slow writer
makes this rank block in read(2). The compute is tiny on purpose: several ranks share a
CPU on a small machine, and only a rank that is made to suffer may be late.

With ``--loader-workers N`` each step also takes a small tensor from a ``DataLoader`` with N
worker processes (children of the rank); a worker waits ``--worker-delay-file``'s number of
milliseconds (read before each item; no file: none) before producing it: a slow DataLoader
worker the rank's main thread waits for inside ``enumerate(DataLoader)``.

Prints "ready <pid> rank <rank>" after 5 steps.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

BATCH_BYTES = 4096


class SlowItems(torch.utils.data.Dataset[torch.Tensor]):
    """Items of a DataLoader worker, each after the delay the control file says."""

    def __init__(self, delay_file: str) -> None:
        self.delay_file = delay_file

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        try:
            with open(self.delay_file) as f:
                ms = float(f.read() or 0)
        except (OSError, ValueError):
            ms = 0.0
        if ms > 0:
            time.sleep(ms / 1000)
        return torch.full((64, 16), 1e-3)


def read_batch(fd: int, buf: bytearray) -> None:
    """Fill ``buf`` from ``fd`` (a FIFO: a read may return less than asked)."""
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise SystemExit("the batch feeder closed the FIFO")
        got += n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="", help="FIFO to read each step's batch from")
    parser.add_argument("--sleep-ms", type=float, default=10.0)
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--worker-delay-file", default="")
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("TRAIN_SECONDS", 120))
    )
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fd = os.open(args.batches, os.O_RDONLY) if args.batches else -1
    buf = bytearray(BATCH_BYTES)
    x = torch.randn(32, 16)
    items = None
    if args.loader_workers:
        loader = torch.utils.data.DataLoader(
            SlowItems(args.worker_delay_file), batch_size=None, num_workers=args.loader_workers
        )
        items = iter(loader)
    end = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < end:
        if fd >= 0:
            read_batch(fd, buf)
            x = torch.frombuffer(buf, dtype=torch.float32).view(64, 16)
        if items is not None:
            x = x + next(items)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        step += 1
        if step == 5:
            # One write(2) per line: the ranks may share the launcher's stdout pipe, and
            # print() writes the text and its newline separately, so the lines could interleave.
            os.write(1, f"ready {os.getpid()} rank {rank}\n".encode())
        time.sleep(args.sleep_ms / 1000)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
