"""One rank of a small NCCL job for the profiler plugin's GPU test (test_nccl_plugin.py).

    python nccl_ranks.py RANK WORLD PORT

Joins the job on GPU RANK, does one all-reduce of 1 Mi float32 (4 MiB), prints
``ready {"pid": ..., "rank": ...}``, then obeys its stdin: ``run N`` (N all-reduces, then
``done``), ``quit`` (leaves the job: NCCL finalizes the plugin).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    rank, world, port = (int(a) for a in sys.argv[1:4])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
        device_id=device,
    )  # fmt: skip
    x = torch.ones(1 << 20, device=device)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print("ready " + json.dumps({"pid": os.getpid(), "rank": rank}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[0] == "run":
            for _ in range(int(words[1])):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            print("done", flush=True)
        elif words[0] == "quit":
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
