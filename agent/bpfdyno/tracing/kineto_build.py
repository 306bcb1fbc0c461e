"""What a trainer's own libkineto will do with an on-demand log file, learned from outside.

Since pytorch/kineto commit 9ea826e ("Restrict on-demand trace output path to a safe
directory", PR #1426, 2026-06-11), libkineto ignores an on-demand ``ACTIVITIES_LOG_FILE``
that does not start with ``$KINETO_ONDEMAND_TRACE_DIR`` (``/tmp/`` when unset; a ``/`` is
appended when missing) or that contains ``..`` anywhere — a plain string test, made on the
value as sent. It logs a warning in the trainer and writes
``/tmp/libkineto_activities_<pid>.json`` instead. The agent would then follow a file that
never comes and end the trace failed while it exists elsewhere. PyTorch 2.13.0's libkineto
(in its ``libtorch_cpu.so``) has no such rule; builds whose kineto includes that commit do.

The agent cannot ask the trainer, so it looks: when a trainer registers, its mapped libraries
(``/proc/<pid>/maps``) that can hold libkineto (``libtorch_cpu.so``, ``libkineto.so``) are
searched for the variable's name — the string ``getenv`` is called with, present exactly in
the builds that have the rule — and its initial environment for the variable. That is done
in the trainer owner's lane (`bpfdyno.core.workers.UserLanes`) with the owner's file rights,
once per process (one may poll from many sockets) and once per library file (a library is
100s of MB; the result is cached by device, inode, size and time).

The file is the trainer's owner's: she may truncate or rewrite it at any moment. It is
therefore read with bounded ``pread`` calls, chunk by chunk with a marker-length overlap,
never mapped (a mapped file truncated under a search kills the reader with SIGBUS: the
whole agent). What one user's files cost is bounded: a file larger than
`MAX_LIBRARY_BYTES` is not searched, and each user (subordinate uids counted as their
user) may have `SCAN_BYTES_PER_USER` searched per `SCAN_WINDOW_S`; past that her trainers
stay unchecked until the window turns (nothing is refused for them, as for an unreadable
library). The search is requested work: its CPU is kept out of the overhead budget's
collection decisions (`bpfdyno.core.budget.excluded_work`). A request whose log
file such a trainer would ignore is refused up front with the reason and the fix (rule
``kineto_ondemand_dir``). Until a trainer's libraries have been looked at, or where they
cannot be, nothing is refused (as before).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.core.budget import excluded_work
from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.identity import (
    FileIdentityError,
    Principals,
    files_as,
    owner_or_root,
    primary_gid,
)
from bpfdyno.core.pidfs import read_environ_raw, read_stat
from bpfdyno.core.rootfs import open_in_root
from bpfdyno.core.text import shown
from bpfdyno.core.workers import StoppedError, UserLanes

log = logging.getLogger(__name__)

#: The environment variable that moves libkineto's on-demand directory.
ONDEMAND_DIR_ENV = "KINETO_ONDEMAND_TRACE_DIR"
#: libkineto's on-demand directory when the variable is unset or empty.
DEFAULT_ONDEMAND_DIR = "/tmp/"
#: In a library's read-only data exactly when its libkineto has the rule.
RULE_MARKER = ONDEMAND_DIR_ENV.encode() + b"\0"
#: Mapped files that can hold libkineto (PyTorch links it into libtorch_cpu.so).
_LIBRARY_PREFIXES = ("libtorch_cpu.so", "libkineto.so", "libkineto-")
#: Larger files are not searched (PyTorch 2.13's CPU libtorch_cpu.so is 414 MiB; CUDA
#: builds keep the CUDA code in libtorch_cuda.so, which holds no libkineto).
MAX_LIBRARY_BYTES = 1 << 30
#: Bytes of libraries searched per user and window; more waits for the next window.
SCAN_BYTES_PER_USER = 4 << 30
SCAN_WINDOW_S = 600.0
#: One read of the search.
CHUNK_BYTES = 4 << 20
#: Trainers (and library files) remembered; more are forgotten oldest first.
MAX_REMEMBERED = 8192

RULE = "kineto_ondemand_dir"


@dataclass(frozen=True, slots=True)
class OnDemandRule:
    """A trainer's libkineto restricts on-demand log files to ``directory``.

    Attributes:
        directory: the allowed prefix, ending in ``/`` (as libkineto compares it).
        library: the library file the rule was found in (for the message).
        from_env: the directory comes from the trainer's ``KINETO_ONDEMAND_TRACE_DIR``.
    """

    directory: str
    library: str
    from_env: bool

    def ignores(self, log_file: str) -> bool:
        """Whether libkineto would ignore ``log_file`` (its own test, to the letter)."""
        return not log_file.startswith(self.directory) or ".." in log_file


@dataclass(frozen=True, slots=True)
class _Identity:
    dev: int
    ino: int
    size: int
    mtime_ns: int


class KinetoBuilds:
    """The on-demand rule of each registered trainer's libkineto, looked up in the background.

    Args:
        lanes: where the lookups run, in each trainer owner's lane.
        proc_root: where /proc is.
    """

    def __init__(
        self,
        lanes: UserLanes,
        proc_root: Path = Path("/proc"),
        allowance: ScanAllowance | None = None,
    ) -> None:
        self._lanes = lanes
        self._proc = proc_root
        self.allowance = allowance or ScanAllowance()
        self._rules: OrderedDict[bytes, OnDemandRule | None] = OrderedDict()
        self._pending: dict[bytes, Future[OnDemandRule | None]] = {}
        self._libraries: OrderedDict[_Identity, bool] = OrderedDict()
        #: (pid, start time) -> its rule, as looked up.
        self._processes: OrderedDict[tuple[int, int], OnDemandRule | None] = OrderedDict()

    def learn(self, address: bytes, host_pid: int, uid: int | None) -> None:
        """Look at the trainer at ``address`` (once; called at every poll, costs nothing then)."""
        if address in self._rules or address in self._pending or host_pid <= 0:
            return
        try:
            fut = self._lanes.submit(owner_or_root(uid), self._look, host_pid, uid)
        except StoppedError:
            return
        self._pending[address] = fut
        fut.add_done_callback(lambda f: self._learned(address, f))

    def _learned(self, address: bytes, fut: Future[OnDemandRule | None]) -> None:
        # On the lane's thread: dict operations are atomic; the loop only reads.
        self._pending.pop(address, None)
        if fut.cancelled():
            return
        try:
            rule = fut.result()
        except Exception:
            log.exception("looking at the libkineto of a trainer failed; not checked")
            return
        self._rules[address] = rule
        while len(self._rules) > MAX_REMEMBERED:
            self._rules.popitem(last=False)

    def rule(self, address: bytes) -> OnDemandRule | None:
        """The trainer's rule; None when it has none or is not (yet) known."""
        return self._rules.get(address)

    def forget(self, address: bytes) -> None:
        self._rules.pop(address, None)

    def check(self, log_file: str, trainers: list[tuple[int, bytes]]) -> None:
        """Refuse ``log_file`` if the libkineto of any of ``trainers`` (pid, address) would
        ignore it.

        Raises:
            InvalidArgument: rule ``kineto_ondemand_dir``, naming the processes, their
                directory and the fix.
        """
        ignoring = [(pid, r) for pid, a in trainers if (r := self.rule(a)) and r.ignores(log_file)]
        if not ignoring:
            return
        pid, rule = ignoring[0]
        pids = ", ".join(str(p) for p, _ in ignoring)
        # The directory and the library's path are the trainer's choice: shown escaped.
        directory, library = shown(rule.directory), shown(rule.library)
        inside = log_file.startswith(rule.directory)
        why = "it contains '..'" if inside else f"it is not under {directory}"
        where = (
            f"{ONDEMAND_DIR_ENV}={directory.rstrip('/')} in its environment"
            if rule.from_env
            else f"{ONDEMAND_DIR_ENV} unset, so {DEFAULT_ONDEMAND_DIR}"
        )
        raise InvalidArgument(
            f"refused by rule '{RULE}': the PyTorch of pid {pids} (libkineto in "
            f"{library}) accepts on-demand trace files only under its "
            f"{ONDEMAND_DIR_ENV} ({where}) and without '..'; it would ignore {log_file} "
            f"({why}) and write /tmp/libkineto_activities_{pid}.json instead. Choose a log "
            f"file under {directory}, or start the job with {ONDEMAND_DIR_ENV} set to "
            "the directory you want (e.g. export "
            f"{ONDEMAND_DIR_ENV}={os.path.dirname(log_file) or '/'})",
            rule=RULE,
        )

    # -- in the owner's lane --------------------------------------------------------------

    def _look(self, host_pid: int, uid: int | None) -> OnDemandRule | None:
        """The process's rule: looked up once per process (a process may bind many sockets,
        each a trainer of its own), by pid and start time (pids are reused)."""
        st = read_stat(self._proc, host_pid)
        if st is None:
            return None  # gone
        key = (host_pid, st.start_ticks)
        if key in self._processes:
            return self._processes[key]
        rule = self._look_up(host_pid, uid)
        self._processes[key] = rule
        while len(self._processes) > MAX_REMEMBERED:
            self._processes.popitem(last=False)
        return rule

    def _look_up(self, host_pid: int, uid: int | None) -> OnDemandRule | None:
        owner = owner_or_root(uid)
        try:
            # The owner's own groups only: never a group the process or a file carries.
            with files_as(owner, primary_gid(owner)):
                library = self._library_with_rule(host_pid, owner)
                if library is None:
                    return None
                env = read_environ_raw(self._proc, host_pid, (ONDEMAND_DIR_ENV,)).get(
                    ONDEMAND_DIR_ENV
                )
        except FileIdentityError as e:
            log.info("not looking at pid %d's libkineto: %s", host_pid, e)
            return None
        directory = os.fsdecode(env) if env else DEFAULT_ONDEMAND_DIR
        if not directory.endswith("/"):
            directory += "/"
        return OnDemandRule(directory, library, bool(env))

    def _library_with_rule(self, host_pid: int, uid: int) -> str | None:
        """The first mapped libkineto of the process that has the rule (None: none has)."""
        root = str(self._proc / str(host_pid) / "root")
        for path in _kineto_libraries(self._proc, host_pid):
            if self._has_rule(root, path, uid):
                return path
        return None

    def _has_rule(self, root: str, path: str, uid: int) -> bool:
        try:
            # Resolved inside the process's root: a container's absolute links stay in it.
            fd = open_in_root(root, path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= MAX_LIBRARY_BYTES:
                return False
            ident = _Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            known = self._libraries.get(ident)
            if known is None:
                if not self.allowance.take(uid, st.st_size):
                    return False
                with excluded_work():
                    known = holds(fd, st.st_size, RULE_MARKER)
                self._libraries[ident] = known
                while len(self._libraries) > MAX_REMEMBERED:
                    self._libraries.popitem(last=False)
            return known
        except OSError:
            return False
        finally:
            os.close(fd)


def holds(fd: int, size: int, marker: bytes, chunk: int = CHUNK_BYTES) -> bool:
    """Whether the first ``size`` bytes of the file ``fd`` hold ``marker``: bounded reads,
    each overlapping the last by the marker's length less one, so a marker across two reads
    is found. A file that shrinks meanwhile ends the search at its new end (a short read);
    one that grows is searched to ``size`` only."""
    keep = len(marker) - 1
    tail = b""
    offset = 0
    while offset < size:
        data = os.pread(fd, min(chunk, size - offset), offset)
        if not data:
            return False  # truncated under the search
        window = tail + data
        if marker in window:
            return True
        tail = window[-keep:] if keep else b""
        offset += len(data)
    return False


class ScanAllowance:
    """Bytes of library files searched per user (a subordinate uid counts as its user) and
    window: one user's trainers cannot make the agent read without end.

    Args:
        per_user: bytes per user and window.
        window_s: the window.
        principals: who stands behind a uid.
        clock: monotonic seconds (replaceable in tests).
    """

    def __init__(
        self,
        per_user: int = SCAN_BYTES_PER_USER,
        window_s: float = SCAN_WINDOW_S,
        principals: Principals | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_user = per_user
        self.window_s = window_s
        self._principals = principals or Principals()
        self._clock = clock
        self._lock = threading.Lock()  # taken from every user's lane
        self._used: dict[int, tuple[float, int]] = {}  # user -> (window start, bytes)
        #: Searches refused for being over the allowance, per user (for status).
        self.refused: dict[int, int] = {}

    def take(self, uid: int, size: int) -> bool:
        """Count ``size`` bytes against ``uid``'s user; False (and nothing counted) when they
        would exceed its allowance in the current window."""
        user = self._principals.of(uid)
        now = self._clock()
        with self._lock:
            start, used = self._used.get(user, (now, 0))
            if now - start >= self.window_s:
                start, used = now, 0
            if used + size > self.per_user:
                self.refused[user] = self.refused.get(user, 0) + 1
                if self.refused[user] == 1:
                    log.warning(
                        "uid %d's trainers asked for more than %d MiB of library searches in "
                        "%.0f s; their libkineto is not checked until the window turns",
                        user, self.per_user >> 20, self.window_s,
                    )  # fmt: skip
                return False
            self._used[user] = (start, used + size)
            return True


def _kineto_libraries(proc_root: Path, pid: int) -> list[str]:
    """Paths (in the process's view) of its mapped files that can hold libkineto."""
    out: dict[str, None] = {}  # in the order they are mapped, once each
    with contextlib.suppress(OSError), open(proc_root / str(pid) / "maps", "rb") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            path = os.fsdecode(fields[5].rstrip(b"\n")) if len(fields) == 6 else ""
            if path.startswith("/") and os.path.basename(path).startswith(_LIBRARY_PREFIXES):
                out[path] = None
    return list(out)
