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

With ``--knobs FILE`` (JSON, re-read when it changes; absent or empty: none), a step also
does what a fault asks of this rank, before its forward:

- ``work_ms``: more work per step: this thread computes (matrix products) until it has
  spent that much more CPU time (its own CPU time, so the work is the same on a loaded
  machine);
- ``read_path``, ``read_bytes``, ``samples``: read ``read_bytes`` of a data file, the next
  piece each step (wrapping at its end), and ``samples`` samples of it (``SAMPLE`` bytes)
  at random places, as a data loader reads its samples; with ``evict`` the file's pages
  are dropped from the page cache first (posix_fadvise DONTNEED), so the reads go to the
  disk.

Prints "ready <pid> rank <rank>" after 5 steps.
"""

import argparse
import json
import os
import random
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

BATCH_BYTES = 4096
SAMPLE = 64 << 10


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


@dataclass
class Knobs:
    """The fault knobs of ``--knobs FILE`` (module doc), re-read when the file changes."""

    path: str
    mtime_ns: int = -1
    work_ms: float = 0.0
    read_path: str = ""
    read_bytes: int = 0
    samples: int = 0
    evict: bool = False
    offset: int = 0
    fd: int = -1
    sample: bytearray = field(default_factory=lambda: bytearray(SAMPLE))

    def refresh(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            mtime = 0
        if mtime == self.mtime_ns:
            return
        self.mtime_ns = mtime
        text = ""
        if mtime:
            with open(self.path) as f:
                text = f.read()
        knobs = json.loads(text or "{}")
        self.work_ms = float(knobs.get("work_ms", 0.0))
        self.read_bytes = int(knobs.get("read_bytes", 0))
        self.samples = int(knobs.get("samples", 0))
        self.evict = bool(knobs.get("evict", False))
        path = str(knobs.get("read_path", ""))
        if path != self.read_path:
            if self.fd >= 0:
                os.close(self.fd)
            self.fd = os.open(path, os.O_RDONLY) if path else -1
            self.read_path, self.offset = path, 0
            if self.fd >= 0:  # samples at random places: no readahead around them
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def step(self) -> None:
        if self.fd >= 0:
            size = os.fstat(self.fd).st_size
            if self.evict:
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if self.read_bytes:
                if self.offset + self.read_bytes > size:
                    self.offset = 0
                os.pread(self.fd, self.read_bytes, self.offset)
                self.offset += self.read_bytes
            for _ in range(self.samples):  # into one buffer, as a loader fills its batch
                os.preadv(self.fd, [self.sample], random.randrange(size // SAMPLE) * SAMPLE)
        if self.work_ms:
            end = time.thread_time() + self.work_ms / 1000
            a = torch.randn(128, 128)
            while time.thread_time() < end:
                a = torch.tanh(a @ a)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="", help="FIFO to read each step's batch from")
    parser.add_argument("--sleep-ms", type=float, default=10.0)
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--worker-delay-file", default="")
    parser.add_argument("--knobs", default="", help="JSON file of fault knobs (module doc)")
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
    knobs = Knobs(args.knobs) if args.knobs else None
    step = 0
    while time.monotonic() < end:
        if fd >= 0:
            read_batch(fd, buf)
            x = torch.frombuffer(buf, dtype=torch.float32).view(64, 16)
        if items is not None:
            x = x + next(items)
        if knobs is not None:
            knobs.refresh()
            knobs.step()
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
