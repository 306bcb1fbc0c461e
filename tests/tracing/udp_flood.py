"""Send UDP datagrams to an address as fast as asked: the packets of an interrupt storm.

Usage: udp_flood.py ADDRESS PORT DATAGRAMS_PER_SECOND [BYTES]

Sends in bursts of a millisecond's worth (datagrams of BYTES, 64 by default: larger ones
leave as IP fragments, each one a packet for the receiver to take and reassemble), sleeping
out the rest of each millisecond; prints "flooding" once the first burst is out. Runs until
killed.
"""

import socket
import sys
import time


def main() -> None:
    address, port, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    per_ms = max(1, rate // 1000)
    payload = bytes(size)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((address, port))
    tick = time.monotonic()
    said = False
    while True:
        for _ in range(per_ms):
            # ECONNREFUSED from an ICMP unreachable: keep sending. (try, not
            # contextlib.suppress: this loop is the sender's whole cost.)
            try:  # noqa: SIM105
                s.send(payload)
            except OSError:
                pass
        if not said:
            print("flooding", flush=True)
            said = True
        tick += 0.001
        pause = tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            tick = time.monotonic()  # behind: do not try to catch up


if __name__ == "__main__":
    main()
