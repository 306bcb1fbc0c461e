"""How far an agent's wall clock is from ours, the way NTP measures it.

The client notes when it sends a ``GetClock`` request (t1) and when the reply arrives (t4);
the agent answers when it received the request (t2) and when it sent the reply (t3). Then

    offset     = ((t2 - t1) + (t3 - t4)) / 2     # agent clock minus ours
    round trip = (t4 - t1) - (t3 - t2)           # time on the wire, both ways

and the offset is right to within half the round trip (the two directions may differ). The
first call on a new channel also carries the TCP and TLS handshakes, which would skew it, so
the best of a few samples (the shortest round trip) is kept.

A synchronised trace start is a wall-clock time each agent's processes read with their own
clock: an offset of +2 s means that host starts 2 s early. Users see every offset in the
report of a job-wide trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bpfdyno.client.agent import AgentClient

#: Samples taken per agent; the one with the shortest round trip is kept.
CLOCK_SAMPLES = 2


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """One agent's clock against ours.

    Attributes:
        offset_s: the agent's wall clock minus ours, in seconds.
        round_trip_s: network time of the best sample, both ways, in seconds.
    """

    offset_s: float
    round_trip_s: float

    @property
    def uncertainty_s(self) -> float:
        """How wrong ``offset_s`` can be: half the round trip."""
        return self.round_trip_s / 2


def offset_from_times(t1: float, t2: float, t3: float, t4: float) -> ClockOffset:
    """The NTP estimate from send (t1), agent receive (t2), agent send (t3), receive (t4)."""
    return ClockOffset(
        offset_s=((t2 - t1) + (t3 - t4)) / 2,
        round_trip_s=max(0.0, (t4 - t1) - (t3 - t2)),
    )


async def measure_clock(
    agent: AgentClient,
    *,
    samples: int = CLOCK_SAMPLES,
    timeout_s: float | None = None,
    clock: Callable[[], float] = time.time,
) -> ClockOffset:
    """Measure the clock of ``agent`` against ``clock`` (ours), each call within
    ``timeout_s`` (default: the client's).

    Raises:
        AgentError: the agent did not answer (kind ``unimplemented``: it predates
            ``GetClock``).
    """
    best: ClockOffset | None = None
    for _ in range(max(1, samples)):
        t1 = clock()
        reply = await agent.clock(timeout_s)
        t4 = clock()
        sample = offset_from_times(t1, reply.receive_unix_seconds, reply.transmit_unix_seconds, t4)
        if best is None or sample.round_trip_s < best.round_trip_s:
            best = sample
    assert best is not None
    return best
