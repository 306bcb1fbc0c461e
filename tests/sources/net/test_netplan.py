"""Choosing what net.bpf.c compiles and attaches, from a (fake or real) tracefs listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bpfdyno.sources.net.plan import (
    BYTES_SOCK,
    BYTES_SYSCALLS,
    Plan,
    PlanError,
    format_fields,
    make_plan,
    select_byte_source,
    symbolic_names,
)

SOCK_LENGTH = ["void * sk:8", "__u16 family:2", "__u16 protocol:2", "int ret:4", "int flags:4"]
TUPLE = [
    "__u16 sport:2",
    "__u16 dport:2",
    "__u16 family:2",
    "__u8 saddr[4]:4",
    "__u8 daddr[4]:4",
    "__u8 saddr_v6[16]:16",
    "__u8 daddr_v6[16]:16",
]
EVENTS: dict[str, list[str]] = {
    "sock/sock_send_length": SOCK_LENGTH,
    "sock/sock_recv_length": SOCK_LENGTH,
    "syscalls/sys_exit_sendto": ["long ret:8"],
    "syscalls/sys_exit_sendmsg": ["long ret:8"],
    "syscalls/sys_enter_recvfrom": ["int fd:8", "unsigned int flags:8"],
    "syscalls/sys_enter_recvmsg": ["int fd:8", "unsigned int flags:8"],
    "syscalls/sys_exit_recvfrom": ["long ret:8"],
    "syscalls/sys_exit_recvmsg": ["long ret:8"],
    "sock/inet_sock_set_state": [
        "const void * skaddr:8",
        "int oldstate:4",
        "int newstate:4",
        "__u16 protocol:2",
        *TUPLE,
    ],
    "tcp/tcp_retransmit_skb": ["const void * skaddr:8", "int state:4", *TUPLE, "int err:4"],
    "tcp/tcp_probe": [
        "__u8 saddr[28]:28",
        "__u8 daddr[28]:28",
        "__u32 snd_cwnd:4",
        "__u32 srtt:4",
        "const void * skaddr:8",
    ],
    "tcp/tcp_send_reset": [
        "const void * skaddr:8",
        "int state:4",
        "enum sk_rst_reason reason:4",
        "__u8 saddr[28]:28",
        "__u8 daddr[28]:28",
    ],
    "tcp/tcp_receive_reset": ["const void * skaddr:8", *TUPLE],
    "skb/kfree_skb": ["void * skbaddr:8", "enum skb_drop_reason reason:4"],
    "sched/sched_process_free": ["pid_t pid:4"],
}


def write_format(root: Path, event: str, fields: list[str], print_fmt: str = '""') -> None:
    d = root / "events" / event
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"name: {event.split('/')[1]}", "ID: 1", "format:"]
    lines.append("\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;")
    offset = 8
    for spec in fields:
        decl, size = spec.rsplit(":", 1)
        lines.append(f"\tfield:{decl};\toffset:{offset};\tsize:{size};\tsigned:0;")
        offset += int(size)
    lines += ["", f"print fmt: {print_fmt}"]
    (d / "format").write_text("\n".join(lines) + "\n")


def fake_tracefs(root: Path, leave_out: tuple[str, ...] = (), **replace: list[str]) -> Path:
    (root / "events").mkdir(parents=True, exist_ok=True)
    for event, fields in EVENTS.items():
        if event in leave_out:
            continue
        write_format(root, event, replace.get(event.replace("/", "__"), fields))
    return root


def test_sock_tracepoints_are_preferred(tmp_path: Path) -> None:
    root = fake_tracefs(tmp_path)
    assert select_byte_source(root) == BYTES_SOCK
    plan = make_plan(root)
    assert plan.byte_source == BYTES_SOCK
    assert plan.unavailable == {}
    assert set(plan.cflags) == {"-DNET_RETX_HAS_ERR", "-DNET_RST_HAS_REASON"}
    assert [p.name for p in plan.parts] == [
        "bytes",
        "cleanup",
        "connections",
        "retransmits",
        "rtt",
        "resets_sent",
        "resets_received",
        "drops",
    ]
    assert [a.fn for a in plan.parts[0].attachments] == ["bpfdyno_nsend", "bpfdyno_nrecv"]


def test_falls_back_to_syscalls_without_sock_length(tmp_path: Path) -> None:
    root = fake_tracefs(tmp_path, leave_out=("sock/sock_send_length", "sock/sock_recv_length"))
    assert select_byte_source(root) == BYTES_SYSCALLS
    plan = make_plan(root)
    assert plan.byte_source == BYTES_SYSCALLS
    assert "-DNET_USE_SYSCALLS" in plan.cflags
    assert [a.tracepoint for a in plan.parts[0].attachments] == [
        "syscalls:sys_exit_sendto",
        "syscalls:sys_exit_sendmsg",
        "syscalls:sys_enter_recvfrom",
        "syscalls:sys_enter_recvmsg",
        "syscalls:sys_exit_recvfrom",
        "syscalls:sys_exit_recvmsg",
    ]


def test_half_present_sock_events_also_fall_back(tmp_path: Path) -> None:
    root = fake_tracefs(tmp_path, leave_out=("sock/sock_recv_length",))
    assert select_byte_source(root) == BYTES_SYSCALLS


def test_sock_event_without_a_needed_field_falls_back(tmp_path: Path) -> None:
    root = fake_tracefs(tmp_path, sock__sock_send_length=SOCK_LENGTH[:-1])  # no "flags"
    assert select_byte_source(root) == BYTES_SYSCALLS


def test_no_source_at_all(tmp_path: Path) -> None:
    root = fake_tracefs(
        tmp_path,
        leave_out=("sock/sock_send_length", "syscalls/sys_exit_sendto"),
    )
    assert select_byte_source(root) is None
    with pytest.raises(PlanError, match="CONFIG_FTRACE_SYSCALLS"):
        make_plan(root)


def test_forcing_a_missing_source_is_an_error(tmp_path: Path) -> None:
    root = fake_tracefs(tmp_path, leave_out=("sock/sock_send_length",))
    with pytest.raises(PlanError, match="byte source 'sock' is not usable"):
        make_plan(root, BYTES_SOCK)
    with pytest.raises(PlanError, match="unknown byte source 'tcp'"):
        make_plan(root, "tcp")
    assert make_plan(root, BYTES_SYSCALLS).byte_source == BYTES_SYSCALLS


def test_old_layouts_disable_only_their_part(tmp_path: Path) -> None:
    old_reset = ["const void * skaddr:8", "int state:4", *TUPLE]  # pre-6.x: 4-byte saddr
    old_retx = ["const void * skaddr:8", "int state:4", *TUPLE]  # no "err" field
    root = fake_tracefs(
        tmp_path,
        leave_out=("skb/kfree_skb",),
        tcp__tcp_send_reset=old_reset,
        tcp__tcp_retransmit_skb=old_retx,
    )
    plan = make_plan(root)
    assert set(plan.unavailable) == {"resets_sent", "drops"}
    assert "saddr (size 4, expected 28)" in plan.unavailable["resets_sent"]
    assert "skb:kfree_skb does not exist" in plan.unavailable["drops"]
    assert set(plan.cflags) == {"-DNET_NO_RST_SENT", "-DNET_NO_DROPS"}
    assert "resets_sent" not in [p.name for p in plan.parts]


def test_missing_tracefs_says_how_to_mount(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="mount -t tracefs nodev"):
        make_plan(tmp_path / "nothing")


def test_symbolic_names_from_print_fmt() -> None:
    fmt = (
        'print fmt: "skbaddr=%p reason: %s", REC->skbaddr, '
        '__print_symbolic(REC->state, { TCP_ESTABLISHED, "TCP_ESTABLISHED" }) : "UNKNOWN", '
        '__print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 3, "NO_SOCKET" }, '
        '{ 0x10, "IP_INHDR" })'
    )
    assert symbolic_names(fmt, "reason") == {2: "NOT_SPECIFIED", 3: "NO_SOCKET", 16: "IP_INHDR"}
    assert symbolic_names(fmt, "state") == {}  # symbolic keys are not numbers
    assert symbolic_names(fmt, "absent") == {}


def test_format_fields_parses_arrays_and_pointers() -> None:
    fmt = (
        "\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;\n"
        "\tfield:__u8 saddr[28];\toffset:16;\tsize:28;\tsigned:0;\n"
        "\tfield:enum skb_drop_reason reason;\toffset:44;\tsize:4;\tsigned:0;\n"
    )
    assert format_fields(fmt) == {"skaddr": 8, "saddr": 28, "reason": 4}


def test_this_kernel_uses_the_sock_tracepoints() -> None:
    root = Path("/sys/kernel/tracing")
    if not (root / "events").is_dir():
        pytest.skip("tracefs is not mounted (needs root: mount -t tracefs nodev ...)")
    plan = make_plan(root)
    # Linux 6.18 has every tracepoint the program uses.
    assert plan.byte_source == BYTES_SOCK
    assert plan.unavailable == {}


def btf_typed(plan: Plan) -> list[str]:
    return [a.fn for p in plan.parts for a in p.attachments if a.btf]


def test_btf_makes_the_hot_path_programs_btf_typed(tmp_path: Path) -> None:
    root = fake_tracefs(tmp_path)
    plan = make_plan(root, btf=True)
    assert plan.btf
    assert plan.header_flavour == "btf"
    assert "-DNET_BTF" in plan.cflags
    assert btf_typed(plan) == ["bpfdyno_nsend", "bpfdyno_nrecv", "bpfdyno_nexit", "bpfdyno_nprobe"]
    assert [a.event for a in plan.parts[0].attachments] == ["sock_send_length", "sock_recv_length"]
    classic = make_plan(root)
    assert not classic.btf
    assert classic.header_flavour == "minimal"
    assert "-DNET_BTF" not in classic.cflags


def test_the_syscall_fallback_stays_classic_with_btf(tmp_path: Path) -> None:
    root = fake_tracefs(tmp_path, leave_out=("sock/sock_send_length", "sock/sock_recv_length"))
    plan = make_plan(root, btf=True)
    assert plan.byte_source == BYTES_SYSCALLS
    assert btf_typed(plan) == ["bpfdyno_nexit", "bpfdyno_nprobe"]
