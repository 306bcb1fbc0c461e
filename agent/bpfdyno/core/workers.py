"""Threads for work that may block, which never hold up the agent's exit or other users.

Some of what the agent does on worker threads can block for as long as someone else
decides: reading a trace file of a user's (a file on a FUSE mount its owner serves, a
network file system that hangs), merging into it, NVML on a lost GPU, ``/proc/<pid>/cmdline``
of a process whose memory map is locked. Two rules keep such a call from spreading:

* **Daemon threads, never joined at exit.** `concurrent.futures.ThreadPoolExecutor` joins
  its threads when the interpreter exits (and asyncio's default executor is joined when the
  loop closes), so one thread parked in ``open()`` kept the agent from stopping on SIGTERM.
  `DaemonExecutor` and `UserLanes` run their calls on daemon threads; stopping them cancels
  what has not started and waits for nothing that has.
* **One lane per user** (`UserLanes`): the calls made on behalf of one uid run one at a
  time, in order, in that uid's lane; lanes take turns for the threads. A user whose calls
  block stalls only its own lane — never another user's merges or summaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

from bpfdyno.core.identity import Principals

log = logging.getLogger(__name__)

_R = TypeVar("_R")

#: An idle worker thread exits after this long (a new one starts with the next call).
IDLE_EXIT_S = 30.0


@dataclass(slots=True)
class _Call:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # cancelled while it waited
        try:
            result = self.fn(*self.args)
        except BaseException as e:  # handed to whoever waits; the thread goes on
            self.future.set_exception(e)
        else:
            self.future.set_result(result)


class StoppedError(RuntimeError):
    """A call submitted after `stop` (the agent is shutting down)."""


class DaemonExecutor(Executor):
    """A `concurrent.futures.Executor` whose threads are daemon threads nobody joins.

    A drop-in for ``ThreadPoolExecutor(workers)`` where a call may block indefinitely:
    ``shutdown(wait=False)`` returns at once and the interpreter exits even while a call
    still runs (``wait=True`` waits, as the protocol says; the agent never asks it to).

    Args:
        name: thread name prefix (shown in logs and ``/proc/<pid>/task/*/comm``).
        workers: most threads at once.
    """

    def __init__(self, name: str, workers: int = 1) -> None:
        self._name = name
        self._max = workers
        self._cond = threading.Condition()
        self._queue: deque[_Call] = deque()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._stopped = False

    def submit(self, fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> Future[_R]:
        if kwargs:
            return self.submit(lambda: fn(*args, **kwargs))
        future: Future[_R] = Future()
        with self._cond:
            if self._stopped:
                raise StoppedError(f"{self._name}: no new work after shutdown")
            self._queue.append(_Call(future, fn, args))
            # More calls waiting than idle threads to take them (a woken thread counts as
            # idle until it runs): another thread, or a call could wait behind a blocked one.
            if len(self._queue) > self._idle and len(self._threads) < self._max:
                self._start_thread()
            self._cond.notify()
        return future

    def _start_thread(self) -> None:
        t = threading.Thread(
            target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
        )
        self._threads.add(t)
        t.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._idle += 1
                    woken = self._cond.wait(IDLE_EXIT_S)
                    self._idle -= 1
                    if not woken and not self._queue:
                        self._threads.discard(me)
                        return
                if self._stopped and not self._queue:
                    self._threads.discard(me)
                    return
                call = self._queue.popleft()
            call.run()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._stopped = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft().future.cancel()
            threads = list(self._threads)
            self._cond.notify_all()
        if wait:
            for t in threads:
                t.join()


class UserLanes:
    """Calls made on behalf of users, one lane per uid, on at most ``threads`` threads.

    A uid's calls run one at a time in the order they came; whenever a thread is free it
    takes the next call of the lane that has waited longest (round robin), so a uid with
    many calls queued does not delay another uid's single one. A call that blocks holds its
    lane and one thread, nothing else: the other lanes keep the other threads.

    A lane is a user's, not a uid's: a subordinate uid (``/etc/subuid``, a rootless
    container's) counts as the user it is delegated to (`bpfdyno.core.identity.Principals`),
    so one user with a range of 65536 uids cannot hold every thread.

    Args:
        name: thread name prefix.
        threads: most threads at once (so at most this many users' calls can be blocked
            at once before other users wait too).
        principals: who stands behind a uid (default: the system's /etc/subuid).
    """

    def __init__(self, name: str, threads: int = 16, principals: Principals | None = None) -> None:
        self._name = name
        self._principals = principals or Principals()
        self._threads = DaemonExecutor(name, threads)
        self._lock = threading.Lock()
        self._lanes: dict[int, deque[_Call]] = {}
        #: uids with a call waiting and none running, longest waiting first; each entry has
        #: one `_next` queued on the threads.
        self._ready: deque[int] = deque()
        self._running: set[int] = set()
        self._stopped = False

    def submit(self, uid: int, fn: Callable[..., _R], *args: Any) -> Future[_R]:
        """Queue ``fn(*args)`` in the lane of ``uid``'s user.

        Raises:
            StoppedError: after `stop`.
        """
        future: Future[_R] = Future()
        uid = self._principals.of(uid)
        with self._lock:
            if self._stopped:
                raise StoppedError(f"{self._name}: the agent is stopping")
            lane = self._lanes.setdefault(uid, deque())
            lane.append(_Call(future, fn, args))
            if uid not in self._running and len(lane) == 1:
                self._make_ready(uid)
        return future

    async def run(self, uid: int, fn: Callable[..., _R], *args: Any) -> _R:
        """`submit` and await the result on the running loop.

        Raises:
            StoppedError: after `stop`.
        """
        return await asyncio.wrap_future(self.submit(uid, fn, *args))

    def _make_ready(self, uid: int) -> None:
        self._ready.append(uid)
        self._threads.submit(self._next)

    def _next(self) -> None:
        """On a thread: run the next call of the lane that has waited longest."""
        with self._lock:
            if not self._ready:
                return  # stopped meanwhile
            uid = self._ready.popleft()
            call = self._lanes[uid].popleft()
            self._running.add(uid)
        try:
            call.run()
        finally:
            with self._lock:
                self._running.discard(uid)
                if not self._lanes[uid]:
                    del self._lanes[uid]
                elif not self._stopped:
                    self._make_ready(uid)  # behind the lanes that waited meanwhile

    def busy(self) -> dict[int, int]:
        """Per user (its uid) with work: calls queued plus running."""
        with self._lock:
            return {
                uid: len(self._lanes.get(uid, ())) + (uid in self._running)
                for uid in set(self._lanes) | self._running
            }

    def stop(self) -> None:
        """No new calls; cancel every queued one; leave running calls to finish or not
        (their threads are daemon threads: the agent exits regardless)."""
        with self._lock:
            self._stopped = True
            for lane in self._lanes.values():
                while lane:
                    lane.popleft().future.cancel()
            self._ready.clear()
            running = sorted(self._running)
        self._threads.shutdown(wait=False, cancel_futures=True)
        if running:
            log.warning(
                "%s: not waiting for calls still running for uid %s (blocked on a user's file?)",
                self._name,
                ", ".join(str(u) for u in running),
            )


async def wait_bounded(
    what: str, awaitables: list[asyncio.Future[Any]] | list[asyncio.Task[Any]], timeout_s: float
) -> None:
    """Wait up to ``timeout_s`` for ``awaitables``; log (never raise) those still pending."""
    if not awaitables:
        return
    done, pending = await asyncio.wait(awaitables, timeout=timeout_s)
    for fut in done:
        with contextlib.suppress(BaseException):
            fut.result()  # retrieved: nothing to log as "never retrieved"
    if pending:
        log.warning(
            "%s: %d still running after %.1f s; stopping without them",
            what,
            len(pending),
            timeout_s,
        )
        for fut in pending:
            fut.cancel()
