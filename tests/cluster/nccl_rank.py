"""One rank of a NCCL job, as far as the agents can see one without a GPU.

    nccl_rank.py PLUGIN.so COMM_ID COMM_RANK COMM_SIZE LATE_MS SECONDS

It registers with its node's agent as a PyTorch trainer (a few optimizer steps with
``KINETO_USE_DAEMON=1`` in its environment), loads the NCCL profiler plugin and drives it as
NCCL does (`nccl_harness`, on the real clock): one AllReduce of communicator COMM_ID (hex,
NCCL's commHash) every `PERIOD_S` of wall-clock time, its sequence number the slot's number,
so every rank of the communicator reaches the same collective in the same slot; this rank
arrives LATE_MS after the slot begins. Its rank in the job is its ``RANK``.
Prints "ready <pid>" once in the communicator (it registers with the agent on Kineto's
next poll, whenever that agent is up). SIGTERM ends it cleanly (its plugin file removed).
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "nccl_profiler"))

import torch
from nccl_harness import Plugin

#: A collective every 200 ms: five a second.
PERIOD_S = 0.2

library, comm_id, comm_rank, comm_size, late_ms, seconds = sys.argv[1:7]
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch = torch.randn(16, 8)
for _ in range(3):  # the optimizer-step hook registers the process with the agent
    optimizer.zero_grad()
    model(batch).pow(2).mean().backward()
    optimizer.step()

plugin = Plugin(Path(library))
plugin.real_clock()
_, ctx, _ = plugin.init(
    int(comm_id, 16), name="pair", nnodes=2, nranks=int(comm_size), rank=int(comm_rank)
)
print(f"ready {os.getpid()}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
late_s = float(late_ms) / 1000
end = time.time() + float(seconds)
try:
    while time.time() < end:
        slot = int(time.time() / PERIOD_S) + 1
        time.sleep(max(0.0, slot * PERIOD_S + late_s - time.time()))
        coll = plugin.start_coll(ctx, seq=slot, nchannels=0, rank=int(comm_rank))
        plugin.stop(coll)  # no kernel channels or proxy steps: complete when the CPU is done
finally:
    plugin.close()  # finalizes the communicator: the plugin removes its file
# Nothing else to clean up: leave without the interpreter's teardown of torch (most of a
# second of CPU per rank on a loaded machine; the test waits for it).
sys.stdout.flush()
os._exit(0)
