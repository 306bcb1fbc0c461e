"""The writer of a rank's batches (``ddp.py --batches FIFO``): writes one batch after another
into the FIFO.

The pipe holds one batch (its size is set to one page), so the writer stays at most a batch
or two ahead of its reader. Commands, one per line on stdin:

- ``slow MS``: from now on wait MS milliseconds before each batch, so the reader blocks in
  read(2) on the empty FIFO; ``fast``: no wait.
- ``hold``: write no more batches; answers ``held N`` (N batches written so far) once no
  write is under way.
- ``until N``: write batches until N have been written, then hold; answers ``drained N``
  once the reader has taken them all (the pipe is empty).
- ``go``: write again.

Answers go to stdout, one line each. It exits when the reader goes away.

Usage: batch_feeder.py FIFO
"""

import argparse
import contextlib
import fcntl
import os
import struct
import sys
import termios
import threading
import time

BATCH_FLOATS = 1024  # 4096 bytes: ddp.BATCH_BYTES


class Feeder:
    def __init__(self, fd: int, batch: bytes) -> None:
        self.fd = fd
        self.batch = batch
        self.written = 0
        self.delay = 0.0
        self.limit: int | None = None  # hold once this many are written
        self.answer = ""  # to say when holding at the limit
        self.cond = threading.Condition()

    def say(self, line: str) -> None:
        os.write(1, f"{line}\n".encode())

    def command(self, line: str) -> None:
        words = line.split()
        with self.cond:
            if words[:1] == ["slow"]:
                self.delay = float(words[1]) / 1000
            elif words == ["fast"]:
                self.delay = 0.0
            elif words == ["hold"]:
                # Answered by the writing loop, after a write under way has finished.
                self.limit, self.answer = -1, "held"
            elif words[:1] == ["until"]:
                self.limit, self.answer = int(words[1]), "drained"
            elif words == ["go"]:
                self.limit = None
            else:
                self.say(f"unknown command {line!r}")
            self.cond.notify_all()

    def queued(self) -> int:
        """Bytes in the pipe that the reader has not taken."""
        buf = bytearray(4)
        fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        return int.from_bytes(buf, sys.byteorder)

    def run(self) -> None:
        while True:
            with self.cond:
                while self.limit is not None and (self.limit < 0 or self.written >= self.limit):
                    if self.answer == "held":
                        self.say(f"held {self.written}")
                        self.answer = ""
                        self.limit = self.written
                    elif self.answer == "drained" and self.queued() == 0:
                        self.say(f"drained {self.written}")
                        self.answer = ""
                    # Woken by a command; the pipe's emptiness is looked at every 10 ms.
                    self.cond.wait(0.01 if self.answer else None)
                delay = self.delay
            if delay:
                time.sleep(delay)
            # A write of one page to a pipe of one page is atomic: it waits for the reader
            # to have taken the previous batch.
            os.write(self.fd, self.batch)
            self.written += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fifo")
    args = parser.parse_args()
    batch = struct.pack(f"{BATCH_FLOATS}f", *((i % 13) / 13.0 for i in range(BATCH_FLOATS)))
    fd = os.open(args.fifo, os.O_WRONLY)  # blocks until the rank opens it for reading
    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, len(batch))
    feeder = Feeder(fd, batch)

    def commands() -> None:
        for line in sys.stdin:
            if line.strip():
                feeder.command(line)

    threading.Thread(target=commands, daemon=True).start()
    feeder.say("feeding")
    with contextlib.suppress(BrokenPipeError):  # the rank went away
        feeder.run()


if __name__ == "__main__":
    main()
