"""Why a thread was off-CPU, in words: from its task state and the system call it blocked in.

The capture program records the task state at the switch-out (0 when the thread was
preempted while runnable) and, on x86-64, the number of the system call it was in. This
module turns the pair into a cause a reader of the trace understands:

============  =====================================================================
cause         meaning
============  =====================================================================
runnable      preempted (or yielded) while runnable: it waited for a CPU (contention)
sleep         a timed sleep (nanosleep, clock_nanosleep, pause)
lock          a futex: a mutex, condition variable, queue or thread join
io wait       waiting for a socket, pipe, event or child (poll, epoll, recv, read...)
file io       file reads, writes and syncs
disk/uninterruptible  uninterruptible sleep (state D), whatever the system call: a disk or page
blocked       anything else (the system call's name is kept)
============  =====================================================================
"""

from __future__ import annotations

import platform

from bpfdyno.rpc.kernel_tracks import SCHED_RECLAIM

RUNNABLE = "runnable"
SLEEP = "sleep"
LOCK = "lock"
IO_WAIT = "io wait"
FILE_IO = "file io"
UNINTERRUPTIBLE = "disk/uninterruptible"
BLOCKED = "blocked"

#: Not an off-CPU cause: a thread's time in direct memory reclaim (on a CPU, around the
#: off-CPU intervals inside it), the ``cause`` of its "memory reclaim" slices.
RECLAIM = SCHED_RECLAIM

#: Every cause, in the order summaries list them.
CAUSES = (RUNNABLE, LOCK, IO_WAIT, FILE_IO, SLEEP, UNINTERRUPTIBLE, BLOCKED)

#: x86-64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl) -> (name, cause).
_X86_64: dict[int, tuple[str, str]] = {
    0: ("read", IO_WAIT),
    1: ("write", IO_WAIT),
    7: ("poll", IO_WAIT),
    17: ("pread64", FILE_IO),
    18: ("pwrite64", FILE_IO),
    19: ("readv", IO_WAIT),
    20: ("writev", IO_WAIT),
    23: ("select", IO_WAIT),
    24: ("sched_yield", RUNNABLE),
    34: ("pause", SLEEP),
    35: ("nanosleep", SLEEP),
    42: ("connect", IO_WAIT),
    43: ("accept", IO_WAIT),
    44: ("sendto", IO_WAIT),
    45: ("recvfrom", IO_WAIT),
    46: ("sendmsg", IO_WAIT),
    47: ("recvmsg", IO_WAIT),
    61: ("wait4", IO_WAIT),
    74: ("fsync", FILE_IO),
    75: ("fdatasync", FILE_IO),
    128: ("rt_sigtimedwait", SLEEP),
    130: ("rt_sigsuspend", SLEEP),
    202: ("futex", LOCK),
    230: ("clock_nanosleep", SLEEP),
    232: ("epoll_wait", IO_WAIT),
    247: ("waitid", IO_WAIT),
    257: ("openat", FILE_IO),
    270: ("pselect6", IO_WAIT),
    271: ("ppoll", IO_WAIT),
    277: ("sync_file_range", FILE_IO),
    281: ("epoll_pwait", IO_WAIT),
    288: ("accept4", IO_WAIT),
    295: ("preadv", FILE_IO),
    296: ("pwritev", FILE_IO),
    299: ("recvmmsg", IO_WAIT),
    307: ("sendmmsg", IO_WAIT),
    327: ("preadv2", FILE_IO),
    328: ("pwritev2", FILE_IO),
    426: ("io_uring_enter", IO_WAIT),
    441: ("epoll_pwait2", IO_WAIT),
    449: ("futex_waitv", LOCK),
}
_TABLE = _X86_64 if platform.machine() == "x86_64" else {}

#: Task state bits (include/linux/sched.h).
_TASK_UNINTERRUPTIBLE = 0x2


def syscall_name(nr: int) -> str:
    """The system call's name ("" for -1, ``syscall_<nr>`` when not in the table)."""
    if nr < 0:
        return ""
    known = _TABLE.get(nr)
    return known[0] if known else f"syscall_{nr}"


def cause(state: int, syscall: int) -> str:
    """The cause of an off-CPU interval (one of `CAUSES`).

    The state comes first: a read(2) that sleeps uninterruptibly (D) waits for a disk or a
    page, not for a socket or pipe (those sleep interruptibly, S).
    """
    if state == 0:
        return RUNNABLE
    if state & _TASK_UNINTERRUPTIBLE:
        return UNINTERRUPTIBLE
    known = _TABLE.get(syscall)
    if known is not None and known[1] != RUNNABLE:
        return known[1]
    return BLOCKED


def state_letter(state: int) -> str:
    """The task state as ``ps`` prints it: R (runnable), S, D, or the bits in hex."""
    if state == 0:
        return "R"
    if state & 0x1:
        return "S"
    if state & _TASK_UNINTERRUPTIBLE:
        return "D"
    return f"{state:#x}"
