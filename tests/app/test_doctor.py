"""`bpfdyno doctor` against this machine's real kernel, sockets and privileges.

The machine these tests run on is the CI kind: root, BPF and BTF available, tracefs mountable,
no hardware PMU and no GPU. Reduced privileges and an unmounted tracefs are produced for real
(setpriv drops capabilities, unshare gives a private mount namespace) in a child process.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.app.doctor import (
    PRIVILEGE_FIXES,
    Check,
    check_bcc,
    check_bpf_syscall,
    check_btf,
    check_grpc_socket,
    check_kernel_headers,
    check_pmu,
    check_privileges,
    check_tcp_port,
    check_tracefs,
    check_tracepoint,
    exit_code,
    find_tracefs,
    format_check,
    format_checks,
    run_checks,
    where_it_runs,
)
from bpfdyno.core.config import Config
from bpfdyno.ebpf import kheaders

pytestmark = pytest.mark.root

#: The fix for missing capabilities where these tests run (a container's differs from a
#: host's: test_the_privilege_fix_fits_where_bpfdyno_runs checks each).
GRANT_CAPS = PRIVILEGE_FIXES[where_it_runs()]


def test_the_privilege_fix_fits_where_bpfdyno_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("container", "INVOCATION_ID"):
        monkeypatch.delenv(var, raising=False)
    assert where_it_runs(tmp_path) == ("unit" if os.geteuid() != 0 and
                                       pwd.getpwuid(os.geteuid()).pw_name == "bpfdyno"
                                       else "host")  # fmt: skip
    assert PRIVILEGE_FIXES["host"] == (
        "run as root (sudo bpfdyno ...), or grant CAP_BPF and CAP_PERFMON "
        "(systemd: AmbientCapabilities=CAP_BPF CAP_PERFMON)"
    )
    monkeypatch.setenv("INVOCATION_ID", "4f0c")  # started by systemd: the unit's directives
    assert where_it_runs(tmp_path) == "unit"
    assert PRIVILEGE_FIXES["unit"].startswith("the unit's AmbientCapabilities must keep CAP_BPF")
    monkeypatch.delenv("INVOCATION_ID")
    (tmp_path / ".dockerenv").touch()  # Docker's marker; podman's is /run/.containerenv
    assert where_it_runs(tmp_path) == "container"
    (tmp_path / ".dockerenv").unlink()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").touch()
    assert where_it_runs(tmp_path) == "container"
    # Root in a container is told to add capabilities at the start, not to become root.
    assert "--cap-add BPF --cap-add PERFMON" in PRIVILEGE_FIXES["container"]
    assert "run as root" not in PRIVILEGE_FIXES["container"]


@pytest.fixture(scope="module", autouse=True)
def tracefs_mounted() -> None:
    """The project's setup mounts tracefs; do the same if this machine has not run it yet."""
    if find_tracefs() is None:
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)


def _python_in_child(prefix: list[str], code: str, cwd: Path) -> str:
    """Run ``code`` in this venv's Python under a wrapper (setpriv, unshare); its stdout."""
    r = subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


NO_CAPS = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
ONLY_BPF_PERFMON = ["setpriv", "--bounding-set=-all,+bpf,+perfmon", "--inh-caps=-all"]


def test_privileges_ok_as_root() -> None:
    assert check_privileges() == Check(
        "privileges", True, "running as root with CAP_BPF and CAP_PERFMON"
    )


def test_privileges_missing_without_capabilities(tmp_path: Path) -> None:
    out = _python_in_child(
        NO_CAPS,
        """
        from bpfdyno.app.doctor import check_bpf_syscall, check_privileges, format_check
        print(format_check(check_privileges()))
        print(format_check(check_bpf_syscall()))
        """,
        tmp_path,
    )
    assert out.splitlines() == [
        "missing privileges: running as root without CAP_BPF and CAP_PERFMON "
        f"(effective capabilities 0x0) — fix: {GRANT_CAPS}",
        "missing bpf-syscall: bpf(BPF_MAP_CREATE) failed with EPERM (Operation not permitted) "
        f"— fix: {GRANT_CAPS}",
    ]


def test_cap_bpf_and_cap_perfmon_alone_suffice(tmp_path: Path) -> None:
    out = _python_in_child(
        ONLY_BPF_PERFMON,
        """
        from bpfdyno.app.doctor import check_bpf_syscall, check_privileges, format_check
        print(format_check(check_privileges()))
        print(format_check(check_bpf_syscall()))
        """,
        tmp_path,
    )
    assert out.splitlines() == [
        "ok      privileges: running as root with CAP_BPF and CAP_PERFMON",
        "ok      bpf-syscall: BPF_MAP_CREATE of a 1-entry array map works",
    ]


def test_bpf_syscall_works_and_closes_its_map() -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    check = check_bpf_syscall()
    assert check == Check("bpf-syscall", True, "BPF_MAP_CREATE of a 1-entry array map works")
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_btf_present() -> None:
    size = Path("/sys/kernel/btf/vmlinux").stat().st_size
    assert size > 0
    assert check_btf() == Check("btf", True, f"/sys/kernel/btf/vmlinux ({size} bytes)")


def test_no_hardware_pmu_is_missing_with_fix_but_optional() -> None:
    check = check_pmu()
    assert format_check(check) == (
        "missing pmu: no hardware PMU (VM?) — PMU metrics disabled — fix: run on bare metal "
        "or in a VM that exposes a virtual PMU (e.g. QEMU/KVM -cpu host)"
    )
    assert check.required is False


def test_nvml_missing_without_driver(tmp_path: Path) -> None:
    # In a fresh process: a test double of NVML loaded into this one would be found by soname.
    out = _python_in_child(
        [],
        """
        from bpfdyno.app.doctor import check_nvml, format_check
        check = check_nvml()
        print(check.required)
        print(format_check(check))
        """,
        tmp_path,
    )
    assert out.splitlines() == [
        "False",
        "missing nvml: libnvidia-ml.so.1 not loadable (no NVIDIA driver) — GPU metrics "
        "disabled — fix: install the NVIDIA driver (it provides libnvidia-ml.so.1)",
    ]


def test_nvml_ok_when_the_library_loads(tmp_path: Path) -> None:
    src = tmp_path / "nvml.c"
    src.write_text("int nvmlInit_v2(void) { return 0; }\n")
    lib = tmp_path / "libnvidia-ml.so.1"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", lib, src], check=True
    )
    # Loaded in a child so that this process never holds a library named libnvidia-ml.so.1.
    out = _python_in_child(
        [],
        f"""
        from bpfdyno.app.doctor import check_nvml, format_check
        print(format_check(check_nvml({str(lib)!r})))
        """,
        tmp_path,
    )
    assert out == f"ok      nvml: {lib} loadable"


def test_bcc_importable_with_version() -> None:
    import bcc

    where = Path(bcc.__file__).resolve().parent
    assert check_bcc() == Check("bcc", True, f"bcc {bcc.__version__} ({where})")
    assert bcc.__version__ == "0.26.0"  # Debian 12's python3-bpfcc


def test_tracefs_and_tracepoints_available() -> None:
    assert check_tracefs() == Check("tracefs", True, "mounted at /sys/kernel/tracing")
    assert check_tracepoint("sched", "sched_switch") == Check(
        "tracepoint sched:sched_switch", True, "available"
    )
    assert check_tracepoint("sock", "sock_send_length", required=False) == Check(
        "tracepoint sock:sock_send_length", True, "available", required=False
    )


def test_absent_tracepoint() -> None:
    assert format_check(check_tracepoint("sock", "no_such_event", required=False)) == (
        "warn    tracepoint sock:no_such_event: sock:no_such_event is not in "
        "/sys/kernel/tracing/events (kernel older than 6.3?) — socket byte counts fall back "
        "to syscall tracepoints — fix: use kernel 6.3 or newer for exact per-process socket "
        "byte counts"
    )
    assert format_check(check_tracepoint("sched", "no_such_event")) == (
        "missing tracepoint sched:no_such_event: sched:no_such_event is not in "
        "/sys/kernel/tracing/events — fix: boot a kernel built with CONFIG_TRACEPOINTS=y and "
        "CONFIG_FTRACE=y"
    )


def test_tracefs_not_mounted(tmp_path: Path) -> None:
    # A private mount namespace where every tracefs/debugfs mount is gone.
    unmount_all = (
        'awk \'$3=="tracefs"||$3=="debugfs"{print $2}\' /proc/mounts | sort -r | '
        'while read -r m; do umount -l "$m"; done; exec "$@"'
    )
    out = _python_in_child(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", unmount_all, "sh"],
        """
        from bpfdyno.app.doctor import check_tracefs, check_tracepoint, format_check
        print(format_check(check_tracefs()))
        print(format_check(check_tracepoint("sched", "sched_switch")))
        """,
        tmp_path,
    )
    fix = "fix: mount -t tracefs nodev /sys/kernel/tracing"
    assert out.splitlines() == [
        f"missing tracefs: tracefs is not mounted — {fix}",
        f"missing tracepoint sched:sched_switch: tracefs is not mounted — {fix}",
    ]


def test_kernel_headers_uses_the_kheaders_description() -> None:
    expected = kheaders.describe_header_source().removeprefix("kernel headers: ")
    assert check_kernel_headers() == Check("kernel-headers", True, expected)


def test_kernel_headers_module_absent() -> None:
    assert check_kernel_headers("bpfdyno._not_a_module") == Check(
        "kernel-headers",
        None,
        "cannot tell: bpfdyno._not_a_module is not part of this installation",
        "reinstall bpfdyno (pip install --force-reinstall bpfdyno)",
        required=False,
    )


@pytest.fixture
def headers_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("doctor_kh_raises", "doctor_kh_none"):
        sys.modules.pop(name, None)


def test_kernel_headers_without_any_source(headers_module: Path) -> None:
    (headers_module / "doctor_kh_raises.py").write_text(
        "def describe_header_source():\n    raise RuntimeError('no /proc/config.gz')\n"
    )
    (headers_module / "doctor_kh_none.py").write_text(
        "def describe_header_source():\n    return 'kernel headers: none for 6.1.0: no x'\n"
    )
    raised = check_kernel_headers("doctor_kh_raises")
    assert (raised.ok, raised.detail) == (False, "no usable kernel headers: no /proc/config.gz")
    none = check_kernel_headers("doctor_kh_none")
    assert (none.ok, none.detail, none.required) == (False, "none for 6.1.0: no x", True)


def test_socket_path_free(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    assert check_grpc_socket(str(path)) == Check("grpc-socket", True, f"{path} is free")
    nested = tmp_path / "run" / "agent.sock"
    assert check_grpc_socket(str(nested)) == Check(
        "grpc-socket", True, f"{nested} is free; {nested.parent} will be created"
    )


def test_socket_path_held_by_a_listener_is_in_use(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    cfg = Config()
    cfg.grpc.socket = str(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen()
        lines = format_checks(run_checks(cfg)).splitlines()
    assert f"ok      grpc-socket: {path} in use by a running agent" in lines


def test_socket_path_stale_or_blocked(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))  # closed without unlink: the file stays, nobody listens
    assert format_check(check_grpc_socket(str(stale))) == (
        f"warn    grpc-socket: {stale} is a stale socket file (nothing listening); the agent "
        f"replaces it — fix: none needed, or rm {stale}"
    )
    regular = tmp_path / "file.sock"
    regular.write_text("")
    check = check_grpc_socket(str(regular))
    assert format_check(check) == (
        f"missing grpc-socket: {regular} exists and is not a socket — fix: remove or rename "
        f"{regular}, or set [grpc] socket to another path"
    )
    assert exit_code([check]) == 1


def test_tcp_port_free_and_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        busy = check_tcp_port("127.0.0.1", port)
    assert format_check(busy) == (
        f"warn    legacy-rpc-port: 127.0.0.1:{port} in use by another process (a running "
        f"agent, or dynolog?) — fix: stop the process listening there (find it: ss -ltnp "
        f"'sport = :{port}')"
    )
    # The listener is closed now, so the same port is free again.
    assert check_tcp_port("127.0.0.1", port) == Check(
        "legacy-rpc-port", True, f"127.0.0.1:{port} free", required=False
    )


_HOLDER = """
import socket, sys, time
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
if sys.argv[1]:  # the agent serves its gRPC socket too
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(sys.argv[1])
    unix.listen()
print(tcp.getsockname()[1], flush=True)
time.sleep(60)
"""


def test_tcp_port_held_by_the_running_agent_is_said_to_be_its(tmp_path: Path) -> None:
    """The legacy port in use by the process that serves the gRPC socket is the agent's own
    (the doctor said "another process" of a running agent)."""
    sock = str(tmp_path / "agent.sock")
    agent = subprocess.Popen([sys.executable, "-c", _HOLDER, sock], stdout=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", _HOLDER, ""], stdout=subprocess.PIPE)
    try:
        assert agent.stdout is not None and other.stdout is not None
        agent_port, other_port = int(agent.stdout.readline()), int(other.stdout.readline())
        mine = check_tcp_port("127.0.0.1", agent_port, agent_socket=sock)
        assert format_check(mine) == (
            f"ok      legacy-rpc-port: 127.0.0.1:{agent_port} in use by the running agent "
            f"(pid {agent.pid}, which serves {sock})"
        )
        theirs = check_tcp_port("127.0.0.1", other_port, agent_socket=sock)
        assert format_check(theirs).startswith(
            f"warn    legacy-rpc-port: 127.0.0.1:{other_port} in use by another process (a "
            "running agent, or dynolog?)"
        )
    finally:
        for p in (agent, other):
            p.kill()
            p.wait()


def test_run_checks_on_this_machine(tmp_path: Path) -> None:
    # A fresh process, so that nothing other tests loaded (a fake NVML) changes the answers.
    out = _python_in_child(
        [],
        """
        from bpfdyno.core.config import Config
        from bpfdyno.app.doctor import exit_code, format_checks, run_checks
        checks = run_checks(Config())
        print(exit_code(checks))
        print(format_checks(checks))
        """,
        tmp_path,
    )
    code, *lines = out.splitlines()
    names = [
        "privileges",
        "bpf-syscall",
        "tracefs",
        "btf",
        "kernel-headers",
        "bcc",
        "pmu",
        "nvml",
        "grpc-socket",
        "legacy-rpc-port",  # [legacy_rpc] listen: 127.0.0.1:1778 and [::1]:1778
        "legacy-rpc-port",
        "peer-identity",
        "link-protections",
        "kineto-name",
        "tracepoint sched:sched_switch",
        "tracepoint sock:sock_send_length",
        "tracepoint irq:softirq_entry",
        "rdma",
        "kineto-protection",
        "nccl-profiler",
    ]
    status = {}
    for line, name in zip(lines, names, strict=True):
        word, rest = line.split(maxsplit=1)
        assert rest.startswith(f"{name}: ")
        status[name] = word
    # Only the optional hardware is missing here; everything required is present.
    assert [n for n, word in status.items() if word == "missing"] == ["pmu", "nvml"]
    assert code == "0"
    assert any("grpc-socket: /run/bpfdyno/bpfdyno.sock " in line for line in lines)
    assert any("legacy-rpc-port: 127.0.0.1:1778 " in line for line in lines)
    assert any(("legacy-rpc-port: ::1:1778 " in line or "legacy-rpc-port: [::1]:1778" in line)
               for line in lines)  # fmt: skip
    assert status["peer-identity"] == "ok"
    # No RDMA hardware here: that is how this machine is, not a problem.
    assert status["rdma"] == "ok"
    assert any(
        line.endswith(
            "rdma: no RDMA devices (/sys/class/infiniband is empty or absent): the "
            "fabric collector reports the NICs only"
        )
        for line in lines
    )
    protected = Path("/proc/sys/fs/protected_symlinks").read_text().strip() != "0"
    assert status["link-protections"] == ("ok" if protected else "warn")


def test_format_and_exit_code() -> None:
    ok = Check("a", True, "fine", "unused fix")
    warn = Check("b", None, "hmm", "do x")
    optional = Check("c", False, "gone", "install c", required=False)
    required = Check("d", False, "gone", "install d")
    assert format_checks([ok, warn, optional, required]) == (
        "ok      a: fine\n"
        "warn    b: hmm — fix: do x\n"
        "missing c: gone — fix: install c\n"
        "missing d: gone — fix: install d"
    )
    assert exit_code([ok, warn, optional]) == 0
    assert exit_code([ok, required]) == 1


def test_rdma_devices_named_with_their_ports(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "fabric"))
    from mlx5_sysfs import dgx_like

    from bpfdyno.app.doctor import check_rdma

    tree = dgx_like(tmp_path)
    tree.set_link("mlx5_1", 1, "1: DOWN", "3: Disabled", "100 Gb/sec (4X EDR)")
    assert check_rdma(tree.root) == Check(
        "rdma",
        True,
        "2 device(s): mlx5_0:1 (ib0) InfiniBand, GPUs 0,1 PIX ACTIVE; "
        "mlx5_1:1 (eth2) Ethernet, GPUs 2 PIX DOWN",
        required=False,
    )
