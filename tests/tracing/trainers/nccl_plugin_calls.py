"""A trainer whose every step makes one AllReduce through bpfdyno's NCCL profiler plugin,
driven as NCCL drives it (`nccl_harness.Plugin`: its v5 entry points), with no NCCL and no GPU.

The plugin's clock is the harness's: each collective's parts happen at exact offsets from
the real CLOCK_MONOTONIC time its step reached it (t0), inside a profiler annotation
``bpfdyno_test:allreduce <seq>`` that spans them:

    t0         the collective starts (seqNumber = the step's number), 1024 float32, 1 channel
    t0 + 500   its kernel channel 0 starts (GPU timer 5_000_000)
    t0 + 1000  the collective's enqueue stops; a proxy send operation on channel 0 starts
    t0 + 2000  its step 0 starts, waiting to send (SendWait), 4096 bytes
    t0 + 4000  the step stops
    t0 + 4500  the proxy operation stops; the kernel channel ends (GPU timer 5_003_000)
    t0 + 5000  the kernel channel stops: the collective is complete

argv: the plugin library. Prints "ready <pid>".
"""

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sources" / "nccl_profiler"))
from nccl_harness import KERNEL_CH_STOP, SEND_WAIT, Plugin

plugin = Plugin(Path(sys.argv[1]))
rc, ctx, _ = plugin.init(0xC0FFEE, name="world", nranks=2, rank=0)
assert rc == 0, plugin.logged


def one_allreduce(seq: int) -> None:
    t0 = time.monotonic_ns()
    plugin.now = t0
    coll = plugin.start_coll(ctx, seq=seq, count=1024, datatype="ncclFloat32", nchannels=1)
    plugin.now = t0 + 500
    ch = plugin.start_kernel_ch(ctx, coll, channel=0, gpu_start_ns=5_000_000)
    plugin.now = t0 + 1000
    plugin.stop(coll)
    op = plugin.start_proxy_op(ctx, coll, channel=0, is_send=True)
    plugin.now = t0 + 2000
    step = plugin.start_proxy_step(ctx, op, step=0)
    plugin.state(step, SEND_WAIT, trans_size=4096)
    plugin.now = t0 + 4000
    plugin.stop(step)
    plugin.now = t0 + 4500
    plugin.stop(op)
    plugin.state(ch, KERNEL_CH_STOP, p_timer=5_003_000)
    plugin.now = t0 + 5000
    plugin.stop(ch)
    while time.monotonic_ns() < t0 + 5000:
        pass  # the annotation ends after the parts' last time


model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 16)
end = time.monotonic() + 120
seq = 0
while time.monotonic() < end:
    opt.step()
    time.sleep(0.01)  # away from the step, where the profiler starts and stops
    with torch.profiler.record_function(f"bpfdyno_test:allreduce {seq}"):
        one_allreduce(seq)
    time.sleep(0.01)
    opt.zero_grad()
    model(x).sum().backward()
    seq += 1
    if seq == 5:
        print(f"ready {os.getpid()}", flush=True)
plugin.finalize(ctx)
