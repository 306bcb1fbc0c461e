"""The pull of a job's other agents' rank signals, so every agent compares all of the job's
ranks, not only those on its node (docs/detection.md, "Across nodes").

Every interval, each peer in ``[detection] peers`` is asked `Detection.GetRankSignals` with
the client every tool uses (`bpfdyno.client.agent.AgentClient`: a Unix socket, or TCP with the
TLS and token its environment names, under the peer's same authorisation). What came back is
kept until it is older than two intervals; the detection collector reads it on its thread
(the list is swapped whole). A peer that does not answer is named in ``bpfdyno status`` and
left out until it does; the local comparison goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.errors import AgentError
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.detection.signals import RankSignals, from_record

log = logging.getLogger(__name__)


class PeerSignals:
    """A component: pulls the peers' rank signals every ``interval_s``."""

    name = "detection_peers"

    def __init__(self, targets: Sequence[str], interval_s: float) -> None:
        self._targets = list(targets)
        self._interval_s = interval_s
        self._timeout_s = max(1.0, interval_s / 2)
        #: Per peer: (monotonic time of the answer, its ranks).
        self._got: dict[str, tuple[float, list[RankSignals]]] = {}
        self._failing: dict[str, str] = {}
        self._pulls = 0
        self._task: asyncio.Task[None] | None = None

    def signals(self) -> list[RankSignals]:
        """The peers' ranks from answers at most two intervals old (any thread may ask)."""
        fresh_after = time.monotonic() - 2 * self._interval_s
        got = dict(self._got)
        return [s for at, signals in got.values() if at >= fresh_after for s in signals]

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="detection-peers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def statuses(self) -> list[PartStatus]:
        if self._failing:
            why = "; ".join(f"{t}: {e}" for t, e in sorted(self._failing.items()))
            return [
                PartStatus(
                    self.name,
                    PartState.DEGRADED,
                    f"{len(self._failing)} of {len(self._targets)} peers not answering ({why})",
                    self._interval_s,
                    self._pulls,
                )
            ]
        return [
            PartStatus(
                self.name,
                PartState.OK,
                f"pulling rank signals from {len(self._targets)} peers",
                self._interval_s,
                self._pulls,
            )
        ]

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self._pull(t) for t in self._targets))
            self._pulls += 1
            await asyncio.sleep(self._interval_s)

    async def _pull(self, target: str) -> None:
        try:
            async with AgentClient(target) as client:
                records = await asyncio.wait_for(client.rank_signals(), self._timeout_s)
        except (AgentError, TimeoutError, OSError) as e:
            if target not in self._failing:
                log.warning("detection: peer %s does not answer: %s", target, e)
            self._failing[target] = str(e) or type(e).__name__
            return
        if self._failing.pop(target, None) is not None:
            log.info("detection: peer %s answers again", target)
        self._got[target] = (time.monotonic(), [from_record(r) for r in records])
