"""The process table's vocabulary, shared by the agent and every client.

One `ProcessRow` whose field names are those of ``ProcessRow`` in ``kernel.proto`` (units in
the names; mapped to and from protobuf by `bpfdyno.rpc.wire`), the table as ``ListProcesses``
answers it (`ProcessList`), its filter language and its sort keys. The agent's table builds
these rows, its gRPC servicer sends them, and ``bpfdyno ps`` and ``bpfdyno top`` read them
back, filter and sort them with the same words.

A value that is not known (its collector is not running) is NaN for floats and None for
counts, never 0. On the wire an unknown value is an unset ``optional`` field, except for
``start_unix_seconds``, which proto3 cannot leave unset: there 0 means unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

from bpfdyno.rpc.v1 import kernel_pb2
from bpfdyno.rpc.wire import from_pb, record, to_pb

NAN = float("nan")
#: Bytes per second that count as much activity as one busy core (1 Gbit/s).
NET_ACTIVITY_SCALE = 125e6


@record(kernel_pb2.ProcessRow)
class ProcessRow:
    """One process of the agent's process table.

    Ratios and rates are over the agent's last refresh interval (a ratio above 1 means several
    cores or threads); cumulative counters are since the agent first saw the process. Unknown
    values are NaN (floats) or None (counts). Every field but ``pid`` has a default, so a
    row for a test or a demo names only what it needs.
    """

    pid: int
    ppid: int = 0
    comm: str = ""
    cmdline: str = ""
    uid: int | None = None
    user: str = ""
    state: str = ""  # kernel state letter: R, S, D, ...
    num_threads: int = 0
    start_unix_seconds: float = NAN
    cpu_ratio: float = NAN
    rss_bytes: int = 0
    oncpu_ns: int | None = None  # cumulative, from the sched collector
    offcpu_runnable_ns: int | None = None
    offcpu_blocked_ns: int | None = None
    runq_wait_ns: int | None = None
    oncpu_ratio: float = NAN  # thread-seconds per second: average threads on a CPU
    runq_wait_ratio: float = NAN  # ... waiting in a run queue
    offcpu_blocked_ratio: float = NAN  # ... blocked (sleeping, I/O, locks)
    tcp_tx_bytes: int | None = None  # cumulative payload bytes, from the net collector
    tcp_rx_bytes: int | None = None
    udp_tx_bytes: int | None = None
    udp_rx_bytes: int | None = None
    tcp_retransmits: int | None = None
    tcp_tx_bytes_per_second: float = NAN
    tcp_rx_bytes_per_second: float = NAN
    udp_tx_bytes_per_second: float = NAN
    udp_rx_bytes_per_second: float = NAN
    tcp_retransmits_per_second: float = NAN
    cgroup: str = ""
    container_id: str = ""
    k8s_pod_uid: str = ""
    slurm_job_id: str = ""
    gpu_memory_bytes: int | None = None
    pinned: bool = False  # always shown (a registered trainer), whatever its activity
    # On Kubernetes: the pod holding the process's GPU (the kubelet's pod-resources API), for
    # it and the other processes of its container.
    k8s_namespace: str = ""
    k8s_pod: str = ""
    k8s_container: str = ""
    # In a pid namespace of its own (a container): the pid it knows itself by there, which
    # its own logs and trace file names use; 0 in the agent's namespace.
    ns_pid: int = 0

    @property
    def net_bytes_per_second(self) -> float:
        """All TCP and UDP traffic of the process, both directions (NaN if unknown)."""
        return (
            self.tcp_tx_bytes_per_second
            + self.tcp_rx_bytes_per_second
            + self.udp_tx_bytes_per_second
            + self.udp_rx_bytes_per_second
        )

    @property
    def activity(self) -> float:
        """How busy the process is: see `activity`."""
        return activity(self.cpu_ratio, self.net_bytes_per_second)

    @property
    def command(self) -> str:
        """The command line, or the kernel's short name in brackets for kernel threads."""
        return self.cmdline or f"[{self.comm}]"


#: The scheduler's view of a process, column title and row field: how many of its threads
#: were on a CPU, waiting for one, and blocked, on average over the last interval. (The
#: ratios are thread-seconds per second: a trainer with 44 mostly idle threads is blocked
#: "4402 %" of the time, which reads as nothing; as threads it reads 44.)
THREAD_COLUMNS = (
    ("ONCPU", "oncpu_ratio"),
    ("RUNQ", "runq_wait_ratio"),
    ("BLOCK", "offcpu_blocked_ratio"),
)
#: What those columns mean, for a table's legend.
THREAD_COLUMNS_NOTE = "ONCPU, RUNQ, BLOCK: threads on a CPU, waiting for one, blocked"


def threads_text(threads: float) -> str:
    """An average number of threads as a column shows it: ``0.3``, ``12.0``, ``143``; ``-``
    when unknown."""
    if math.isnan(threads):
        return "-"
    return f"{threads:.1f}" if threads < 99.95 else f"{threads:.0f}"


def activity(cpu_ratio: float, net_bytes_per_second: float) -> float:
    """What picks the table's rows and the default sort: CPU plus network traffic.

    A process keeping one core busy and one moving 1 Gbit/s count the same; unknown parts
    count as 0, so a process is never hidden for lack of a collector.
    """
    cpu = 0.0 if math.isnan(cpu_ratio) else cpu_ratio
    net = 0.0 if math.isnan(net_bytes_per_second) else net_bytes_per_second
    return cpu + net / NET_ACTIVITY_SCALE


# -- protobuf conversion --------------------------------------------------------------------


def row_to_pb(row: ProcessRow) -> kernel_pb2.ProcessRow:
    """The protobuf message of a row; unknown values become unset fields."""
    return cast(kernel_pb2.ProcessRow, to_pb(row))


def row_from_pb(msg: kernel_pb2.ProcessRow) -> ProcessRow:
    """The row of a protobuf message; unset optional fields become NaN or None (unknown)."""
    return from_pb(ProcessRow, msg)


@record(kernel_pb2.ListProcessesResponse)
class ProcessList:
    """What ``ListProcesses`` answers: a snapshot of the agent's process table.

    Attributes:
        processes: the rows asked for (the most active processes plus trainers).
        unix_seconds: wall-clock time of the table's refresh.
        total_processes: processes on the host, shown or not.
        unavailable: sources whose columns are unknown: name -> reason with a fix.
    """

    processes: tuple[ProcessRow, ...] = ()
    unix_seconds: float = 0.0
    total_processes: int = 0
    unavailable: dict[str, str] = field(default_factory=dict)


# -- filtering and sorting ------------------------------------------------------------------


class QueryError(ValueError):
    """A filter or sort key the process table cannot apply; the message says what to write."""


#: A pod's uid as Kubernetes writes it (``metadata.uid``).
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_pod(value: str) -> str:
    """A pod as ``--pod`` and the ``pod=`` filter take it: ``NAMESPACE/NAME`` or its uid.

    Raises:
        QueryError: anything else, with the forms that work.
    """
    namespace, slash, name = value.partition("/")
    if (slash and namespace and name and "/" not in name) or _POD_UID.fullmatch(value):
        return value
    raise QueryError(
        f"pod {value!r}: write NAMESPACE/NAME (e.g. default/train-0) or the pod's uid "
        "(kubectl get pod -n NAMESPACE NAME -o jsonpath='{.metadata.uid}')"
    )


def pod_matches(row: ProcessRow, pod: str) -> bool:
    """Whether the process runs in ``pod`` (`check_pod`'s forms). By uid: its cgroup path
    says, on any Kubernetes node. By name: the agent knows the names of the pods that hold
    a device the kubelet's pod-resources API reports (a GPU), for every process of them."""
    if "/" in pod:
        return bool(row.k8s_pod) and f"{row.k8s_namespace}/{row.k8s_pod}" == pod
    return row.k8s_pod_uid == pod


#: ``key=value`` filter terms: how each key matches a row. ``pid`` matches the agent's pid or
#: the one in the process's own pid namespace (as ``gputrace --pids`` does), ``pod`` a
#: Kubernetes pod (`pod_matches`), ``container`` an id prefix, ``cgroup`` a substring,
#: ``user`` the name or the uid, the others exactly.
_FILTER_TERMS: dict[str, Callable[[ProcessRow, str], bool]] = {
    "pid": lambda r, v: r.pid == int(v) or (r.ns_pid != 0 and r.ns_pid == int(v)),
    "user": lambda r, v: r.user == v or (r.uid is not None and str(r.uid) == v),
    "comm": lambda r, v: r.comm == v,
    "job": lambda r, v: r.slurm_job_id == v,
    "container": lambda r, v: bool(r.container_id) and r.container_id.startswith(v),
    "cgroup": lambda r, v: v in r.cgroup,
    "pod": pod_matches,
}
#: Keys accepted in a filter term ``key=value``.
FILTER_KEYS = tuple(_FILTER_TERMS)


@dataclass(frozen=True, slots=True)
class ProcessFilter:
    """A parsed filter: every term must hold (AND).

    Attributes:
        words: lower-case words, each found in the command name or line.
        terms: ``(key, value)`` pairs, keys from `FILTER_KEYS`.
    """

    words: tuple[str, ...] = ()
    terms: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        """Whether the filter lets every row through."""
        return not self.words and not self.terms

    def matches(self, row: ProcessRow) -> bool:
        """Whether ``row`` passes every term."""
        if not all(_FILTER_TERMS[key](row, value) for key, value in self.terms):
            return False
        comm, cmdline = row.comm.lower(), row.cmdline.lower()
        return all(word in comm or word in cmdline for word in self.words)


def parse_filter(text: str) -> ProcessFilter:
    """Parse a filter such as ``python job=1234 user=alice``.

    Space-separated terms, all of which must match: ``key=value`` with a key of
    `FILTER_KEYS`, or a bare word found in the command name or line (case-insensitive).

    Raises:
        QueryError: an unknown key, an empty value or a non-numeric pid, with the fix.
    """
    words: list[str] = []
    terms: list[tuple[str, str]] = []
    for term in text.split():
        key, sep, value = term.partition("=")
        if not sep:
            words.append(term.lower())
            continue
        if key not in _FILTER_TERMS:
            raise QueryError(
                f"unknown filter key {key!r} in {term!r}; use {', '.join(FILTER_KEYS)} "
                "(key=value) or a bare word"
            )
        if not value:
            raise QueryError(f"filter term {term!r} has no value; write {key}=VALUE")
        if key == "pid" and not value.isdigit():
            raise QueryError(f"pid must be a number in {term!r}; write pid=1234")
        if key == "pod":
            check_pod(value)
        terms.append((key, value))
    return ProcessFilter(tuple(words), tuple(terms))


def filter_rows(rows: Iterable[ProcessRow], flt: ProcessFilter) -> list[ProcessRow]:
    """The rows that pass ``flt``."""
    if flt.empty:
        return list(rows)
    return [r for r in rows if flt.matches(r)]


@dataclass(frozen=True, slots=True)
class SortKey:
    """A way to order the process table.

    Attributes:
        name: the canonical word, which is also the `ProcessRow` attribute sorted by.
        descending: the natural direction (big numbers first; names and pids ascending).
        aliases: other words accepted for it (older ``bpfdyno ps`` and ``bpfdyno top`` ones).
    """

    name: str
    descending: bool = True
    aliases: tuple[str, ...] = ()

    def value(self, row: ProcessRow) -> float | int | str | None:
        """The row's value to sort by; None when unknown (NaN, None or an empty text)."""
        v: float | int | str | None = getattr(row, self.name)
        if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
            return None
        return v


#: Every sort key, the default first. The words are what ``ListProcesses.sort_by``,
#: ``bpfdyno ps --sort`` and the TUI's columns use.
SORT_KEYS: tuple[SortKey, ...] = (
    SortKey("activity"),
    SortKey("pid", descending=False),
    SortKey("user", descending=False),
    SortKey("comm", descending=False),
    SortKey("command", descending=False),
    SortKey("cpu_ratio", aliases=("cpu",)),
    SortKey("rss_bytes", aliases=("rss",)),
    SortKey("oncpu_ratio", aliases=("oncpu",)),
    SortKey("runq_wait_ratio", aliases=("runq",)),
    SortKey("offcpu_blocked_ratio", aliases=("offcpu",)),
    SortKey("net_bytes_per_second", aliases=("net",)),
    SortKey("tcp_tx_bytes_per_second", aliases=("tx",)),
    SortKey("tcp_rx_bytes_per_second", aliases=("rx",)),
    SortKey("tcp_retransmits_per_second", aliases=("retransmits", "retx")),
    SortKey("gpu_memory_bytes", aliases=("gpu_memory", "gpu")),
    SortKey("slurm_job_id", descending=False, aliases=("job",)),
)
DEFAULT_SORT = SORT_KEYS[0].name
_SORT_BY_WORD = {word: k for k in SORT_KEYS for word in (k.name, *k.aliases)}
#: Every word accepted as a sort key: the canonical ones and their aliases.
SORT_WORDS = frozenset(_SORT_BY_WORD)


def sort_key(word: str) -> SortKey:
    """The sort key a word (canonical or alias) names; an empty word is the default.

    Raises:
        QueryError: an unknown word (the message lists the canonical ones).
    """
    key = _SORT_BY_WORD.get(word or DEFAULT_SORT)
    if key is None:
        raise QueryError(
            f"unknown sort key {word!r}; use one of: {', '.join(k.name for k in SORT_KEYS)}"
        )
    return key


def sort_rows(
    rows: Iterable[ProcessRow], key: str = DEFAULT_SORT, descending: bool | None = None
) -> list[ProcessRow]:
    """Rows ordered by a sort key; unknown values last in both directions; ties by pid.

    Args:
        rows: the processes.
        key: a word of `SORT_WORDS`.
        descending: the direction; None uses the key's natural one.

    Raises:
        QueryError: an unknown key (the message lists the known ones).
    """
    by = sort_key(key)
    desc = by.descending if descending is None else descending
    known: list[tuple[float | int | str, ProcessRow]] = []
    unknown: list[ProcessRow] = []
    for r in rows:
        v = by.value(r)
        if v is None:
            unknown.append(r)
        else:
            known.append((v, r))
    # Two stable sorts, by pid first and then by the value, keep ties in pid order.
    known.sort(key=lambda kv: kv[1].pid)
    known.sort(key=lambda kv: kv[0], reverse=desc)
    unknown.sort(key=lambda r: r.pid)
    return [r for _, r in known] + unknown
