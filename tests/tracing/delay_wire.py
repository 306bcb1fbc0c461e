"""A network link that delays, and may drop, the frames crossing it: two TAP devices joined by
this process, which holds each frame for a fixed time before passing it on.

This kernel has no netem qdisc (nor fq, for departure times), so added latency is made here,
on the wire between two namespaces: a frame read from one TAP device is written to the other
``delay`` ms later, or dropped with probability ``loss`` (per direction). Neither end's stack
sees anything but a slow or lossy link: what a slow switch port or a long path does.

Run as a process of its own (``python delay_wire.py A B DELAY_AB DELAY_BA LOSS_AB LOSS_BA``):
it creates TAP devices ``A`` and ``B`` in its network namespace, prints ``ready``, and
forwards until killed; the devices go with it. The caller moves them where they belong
(``ip link set A netns X``: the open file keeps them) and configures them.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import os
import random
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
#: The largest frame read at once (the devices' MTU is 1500; GSO is off on a TAP device
#: opened without IFF_VNET_HDR).
FRAME = 65536


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def forward(
    fds: tuple[int, int], delays_s: tuple[float, float], losses: tuple[float, float]
) -> None:
    """Frames from fds[i] go to fds[1 - i] after delays_s[i], unless dropped (losses[i])."""
    due: list[tuple[float, int, int, bytes]] = []  # (when, seq, out fd, frame)
    seq = 0
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    while True:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, frame = heapq.heappop(due)
            # The other end may be down (being moved or configured): lost on the wire.
            with contextlib.suppress(OSError):
                os.write(out, frame)
        timeout_ms = max(0.0, (due[0][0] - now) * 1000) if due else 1000.0
        for fd, _ in poller.poll(timeout_ms):
            i = fds.index(fd)
            while True:
                try:
                    frame = os.read(fd, FRAME)
                except BlockingIOError:
                    break
                if losses[i] and random.random() < losses[i]:
                    continue
                seq += 1
                heapq.heappush(due, (time.monotonic() + delays_s[i], seq, fds[1 - i], frame))


def main() -> None:
    a, b = sys.argv[1], sys.argv[2]
    delays = (float(sys.argv[3]) / 1000, float(sys.argv[4]) / 1000)
    losses = (float(sys.argv[5]), float(sys.argv[6]))
    fds = (open_tap(a), open_tap(b))
    print("ready", flush=True)
    forward(fds, delays, losses)


if __name__ == "__main__":
    main()
