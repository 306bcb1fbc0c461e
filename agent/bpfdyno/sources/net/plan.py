"""Which network tracepoints this kernel has, and how to build net.bpf.c for it.

Tracepoint layouts change between kernel versions (``sock:sock_send_length`` only exists from
about 6.3; ``tcp:tcp_send_reset`` gained ``reason`` and sockaddr-sized addresses later), so the
collector reads each event's ``format`` file in tracefs, and compiles only the parts whose
fields are all there (``-DNET_NO_<PART>`` leaves a part out). The per-process byte counts come
from ``sock:sock_{send,recv}_length`` when present, else from the socket syscalls. With the
kernel's BTF, the programs on hot paths (the two per-call byte programs, ``tcp:tcp_probe``
at every received segment, the cleanup at every task's end) are BTF-typed (tp_btf) on the
same tracepoints: the kernel calls them with its own arguments instead of filling a trace
record for every event first (``-DNET_BTF``, built against the BTF header tree).

Also here: decoding ``__print_symbolic`` tables from a format's ``print fmt`` (the names of
``enum skb_drop_reason`` and ``enum sk_rst_reason`` as this kernel numbers them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bpfdyno.ebpf.tracefs import read_format

#: The kernel's BTF: the per-call byte programs are BTF-typed where it exists.
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")
#: The -D flag that makes the attachments marked ``btf`` BTF-typed.
BTF_FLAG = "-DNET_BTF"

#: Where the per-process byte counts come from.
BYTES_SOCK = "sock"  # sock:sock_{send,recv}_length (exact, every socket call)
BYTES_SYSCALLS = "syscalls"  # sendto/sendmsg/recvfrom/recvmsg exits (protocol unknown)


@dataclass(frozen=True, slots=True)
class Field:
    """A tracepoint field the program reads; ``size`` is checked when given."""

    name: str
    size: int | None = None


@dataclass(frozen=True, slots=True)
class Attachment:
    """Attach BPF function ``fn`` to tracepoint ``category:event``.

    ``fields``, when given, replaces the part's field list for this tracepoint.
    """

    tracepoint: str
    fn: str
    fields: tuple[Field, ...] = ()
    #: With the kernel's BTF ``fn`` is BTF-typed: attached by the event's name (tp_btf).
    btf: bool = False

    @property
    def event(self) -> str:
        """The tracepoint's name without its category (what a tp_btf attaches to)."""
        return self.tracepoint.split(":", 1)[1]


@dataclass(frozen=True, slots=True)
class Part:
    """One independently optional piece of net.bpf.c."""

    name: str
    attachments: tuple[Attachment, ...]
    fields: tuple[Field, ...]
    #: Compile flag that leaves the part out ("" for parts that cannot be left out).
    disable_flag: str = ""
    #: Optional fields: present -> this -D flag is added.
    optional: Mapping[str, str] = field(default_factory=dict)


_TUPLE_FIELDS = (
    Field("sport"),
    Field("dport"),
    Field("family"),
    Field("saddr", 4),
    Field("daddr", 4),
    Field("saddr_v6", 16),
    Field("daddr_v6", 16),
)

SOCK_BYTES = Part(
    "bytes",
    (
        Attachment("sock:sock_send_length", "bpfdyno_nsend", btf=True),
        Attachment("sock:sock_recv_length", "bpfdyno_nrecv", btf=True),
    ),
    (Field("sk"), Field("family"), Field("protocol"), Field("ret"), Field("flags")),
)
SYSCALL_BYTES = Part(
    "bytes",
    (
        Attachment("syscalls:sys_exit_sendto", "bpfdyno_nsc_tx"),
        Attachment("syscalls:sys_exit_sendmsg", "bpfdyno_nsc_tx"),
        Attachment("syscalls:sys_enter_recvfrom", "bpfdyno_nsc_rxf", (Field("flags"),)),
        Attachment("syscalls:sys_enter_recvmsg", "bpfdyno_nsc_rxm", (Field("flags"),)),
        Attachment("syscalls:sys_exit_recvfrom", "bpfdyno_nsc_rx"),
        Attachment("syscalls:sys_exit_recvmsg", "bpfdyno_nsc_rx"),
    ),
    (Field("ret"),),
)
OPTIONAL_PARTS = (
    Part(
        "connections",
        (Attachment("sock:inet_sock_set_state", "bpfdyno_nstate"),),
        (Field("skaddr"), Field("oldstate"), Field("newstate"), Field("protocol"), *_TUPLE_FIELDS),
        "NET_NO_STATE",
    ),
    Part(
        "retransmits",
        (Attachment("tcp:tcp_retransmit_skb", "bpfdyno_nretx"),),
        (Field("skaddr"), Field("state"), *_TUPLE_FIELDS),
        "NET_NO_RETX",
        {"err": "NET_RETX_HAS_ERR"},
    ),
    Part(
        "rtt",
        (Attachment("tcp:tcp_probe", "bpfdyno_nprobe", btf=True),),
        (
            Field("skaddr"),
            Field("srtt"),
            Field("snd_cwnd"),
            Field("saddr", 28),
            Field("daddr", 28),
        ),
        "NET_NO_PROBE",
    ),
    Part(
        "resets_sent",
        (Attachment("tcp:tcp_send_reset", "bpfdyno_nrstsnd"),),
        (Field("skaddr"), Field("state"), Field("saddr", 28), Field("daddr", 28)),
        "NET_NO_RST_SENT",
        {"reason": "NET_RST_HAS_REASON"},
    ),
    Part(
        "resets_received",
        (Attachment("tcp:tcp_receive_reset", "bpfdyno_nrstrcv"),),
        (Field("skaddr"), *_TUPLE_FIELDS),
        "NET_NO_RST_RECV",
    ),
    Part(
        "drops",
        (Attachment("skb:kfree_skb", "bpfdyno_ndrop"),),
        (Field("reason"),),
        "NET_NO_DROPS",
    ),
)
#: Without it exited processes stay in the map until it fills; it exists on every kernel
#: with BPF, so its absence is an error rather than a degraded mode.
CLEANUP = Part(
    "cleanup",
    (Attachment("sched:sched_process_free", "bpfdyno_nexit", btf=True),),
    (Field("pid"),),
)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to compile and attach on this kernel."""

    byte_source: str
    cflags: tuple[str, ...]
    parts: tuple[Part, ...]
    #: Part name -> why it is left out (and what would bring it back).
    unavailable: Mapping[str, str]
    #: The attachments marked ``btf`` are BTF-typed (built against the BTF header tree);
    #: False: every program is on a classic tracepoint.
    btf: bool = False

    @property
    def header_flavour(self) -> Literal["minimal", "btf"]:
        """The kernel header tree the program is built against."""
        return "btf" if self.btf else "minimal"


class PlanError(Exception):
    """The kernel lacks what the collector cannot do without; says what and how to fix."""


_FIELD_RE = re.compile(r"^\s*field:(?P<decl>[^;]+);\s*offset:\d+;\s*size:(?P<size>\d+);", re.M)


def format_fields(fmt: str) -> dict[str, int]:
    """Field name -> size in bytes, from a tracepoint ``format`` text."""
    out: dict[str, int] = {}
    for m in _FIELD_RE.finditer(fmt):
        decl = m.group("decl").strip()
        name = decl.split("[", 1)[0].split()[-1].lstrip("*")
        out[name] = int(m.group("size"))
    return out


def missing_fields(fmt: str, wanted: tuple[Field, ...]) -> list[str]:
    """The wanted fields absent from ``fmt`` (or of another size), as readable strings."""
    have = format_fields(fmt)
    out = []
    for f in wanted:
        size = have.get(f.name)
        if size is None:
            out.append(f.name)
        elif f.size is not None and size != f.size:
            out.append(f"{f.name} (size {size}, expected {f.size})")
    return out


def _check_part(tracefs: Path, part: Part) -> tuple[str, list[str]]:
    """("" or the reason the part cannot work, -D flags for its optional fields)."""
    flags: list[str] = []
    for a in part.attachments:
        tp = a.tracepoint
        fmt = read_format(tracefs, tp)
        if fmt is None:
            return f"tracepoint {tp} does not exist on this kernel", []
        missing = missing_fields(fmt, a.fields or part.fields)
        if missing:
            return f"tracepoint {tp} lacks fields {', '.join(missing)}", []
        have = format_fields(fmt)
        flags += [flag for name, flag in part.optional.items() if name in have]
    return "", flags


def select_byte_source(tracefs: Path) -> str | None:
    """`BYTES_SOCK` if the sock length tracepoints exist, else `BYTES_SYSCALLS`, else None."""
    if not _check_part(tracefs, SOCK_BYTES)[0]:
        return BYTES_SOCK
    if not _check_part(tracefs, SYSCALL_BYTES)[0]:
        return BYTES_SYSCALLS
    return None


def make_plan(tracefs: Path, byte_source: str = "auto", *, btf: bool = False) -> Plan:
    """Decide what to compile and attach, from the kernel's tracefs.

    Args:
        tracefs: the tracefs mount point.
        byte_source: ``auto``, `BYTES_SOCK` or `BYTES_SYSCALLS` (forcing one, e.g. to test
            the fallback).
        btf: the kernel has BTF (`KERNEL_BTF`): the attachments marked ``btf`` are
            BTF-typed (not with the syscall byte source, whose programs stay classic; the
            other parts' still are).

    Raises:
        PlanError: no way to count bytes, the forced source is missing, or no cleanup hook.
    """
    if not (tracefs / "events").is_dir():
        raise PlanError(
            f"tracefs is not mounted at {tracefs}; mount it: mount -t tracefs nodev {tracefs}"
        )
    if byte_source == "auto":
        chosen = select_byte_source(tracefs)
        if chosen is None:
            raise PlanError(
                "neither sock:sock_send_length nor the socket syscall tracepoints exist; "
                "boot a kernel with CONFIG_FTRACE_SYSCALLS=y (or Linux >= 6.3)"
            )
    elif byte_source in (BYTES_SOCK, BYTES_SYSCALLS):
        chosen = byte_source
        part = SOCK_BYTES if chosen == BYTES_SOCK else SYSCALL_BYTES
        reason = _check_part(tracefs, part)[0]
        if reason:
            raise PlanError(
                f'byte source {chosen!r} is not usable: {reason}; set [net] byte_source = "auto"'
            )
    else:
        raise PlanError(
            f"unknown byte source {byte_source!r}; set [net] byte_source to auto, sock or syscalls"
        )

    bytes_part = SOCK_BYTES if chosen == BYTES_SOCK else SYSCALL_BYTES
    cflags: list[str] = [] if chosen == BYTES_SOCK else ["-DNET_USE_SYSCALLS"]
    if btf:
        cflags.append(BTF_FLAG)
    cleanup_reason, _ = _check_part(tracefs, CLEANUP)
    if cleanup_reason:
        raise PlanError(f"{cleanup_reason}; this kernel is too old for the net collector")
    parts = [bytes_part, CLEANUP]
    unavailable: dict[str, str] = {}
    for part in OPTIONAL_PARTS:
        reason, flags = _check_part(tracefs, part)
        if reason:
            unavailable[part.name] = f"{reason}; a newer kernel would provide it"
            cflags.append(f"-D{part.disable_flag}")
        else:
            parts.append(part)
            cflags += [f"-D{f}" for f in flags]
    return Plan(chosen, tuple(cflags), tuple(parts), unavailable, btf)


# A table's entries are "{ n, "NAME" }" pairs, so its body holds no parentheses.
_SYMBOLIC_RE = re.compile(r"__print_symbolic\(REC->(?P<field>\w+),(?P<body>[^()]*)\)")
_PAIR_RE = re.compile(r"\{\s*(-?\d+|0x[0-9a-fA-F]+)\s*,\s*\"([^\"]*)\"\s*\}")


def symbolic_names(fmt: str, field_name: str) -> dict[int, str]:
    """Number -> name from ``__print_symbolic(REC-><field_name>, {n, "NAME"}, ...)``.

    Entries whose number is a symbol rather than a literal are skipped; an absent table gives
    {}.
    """
    for m in _SYMBOLIC_RE.finditer(fmt):
        if m.group("field") == field_name:
            return {int(num, 0): name for num, name in _PAIR_RE.findall(m.group("body"))}
    return {}


def enum_names(tracefs: Path, tracepoint: str, field_name: str) -> dict[int, str]:
    """`symbolic_names` of one tracepoint's format ({} if the event is missing)."""
    fmt = read_format(tracefs, tracepoint)
    return symbolic_names(fmt, field_name) if fmt else {}
