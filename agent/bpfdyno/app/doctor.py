"""`bpfdyno doctor`: can I use the agent here, and can this machine run one?

It first looks for the running agent (`agent_checks`): when one answers, the report says who
it is, what the caller may do with it and each of its parts' states with the agent's own
reasons — a user of a healthy agent is told so, not asked to become root. The machine checks
below (`run_checks`) answer "can an agent run here?": run when no agent answers, and for root
or with ``--machine`` beside a running one. Their fixes fit where bpfdyno runs (`Place`): a
container is fixed with capabilities at its start, the packaged unit with its own directives,
a checkout or host install with sudo.

One line per capability the agent needs, each with a fix when it is missing.

Every check returns a `Check` whose ``ok`` is True (fine), None (a warning: it works, but
degraded or worth knowing) or False (missing). A missing *required* check means the agent
cannot do its core job here, so ``bpfdyno doctor`` exits non-zero (see `exit_code`); a
missing optional one (hardware PMU, NVML...) only disables the metrics that need it.

The checks touch the real kernel (a tiny BPF map, a perf event) rather than guessing from
version numbers: capabilities differ between VMs, containers and kernels of the same release.
Nothing here loads NVML or starts a BPF program, so it is safe to run next to a live agent.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib
import os
import platform
import pwd
import socket
import stat
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bpfdyno.core.config import Config
from bpfdyno.core.identity import ROOT_UID
from bpfdyno.core.pidfs import listening_socket_inodes, socket_holders, unix_socket_inodes
from bpfdyno.ebpf.tracefs import MOUNT_COMMAND, find_tracefs
from bpfdyno.server.sockdiag import SockDiagUnavailable, tcp_owner_uid
from bpfdyno.sources.nccl_profiler.build import LIBRARY_NAME, PluginBuildError, compiler
from bpfdyno.sources.nccl_profiler.receiver import DEFAULT_SHM_DIR, NcclProfilerReceiver
from bpfdyno.sources.perf.perf_event import (
    PERF_FLAG_FD_CLOEXEC,
    PERF_TYPE_HARDWARE,
    PerfEventAttr,
    perf_event_open,
)
from bpfdyno.tracing.name_holder import impostors, name_holders, taken_reason
from bpfdyno.tracing.safety import PROTECTIONS, read_protections

#: dynolog's port, where the legacy dyno JSON RPC listens by default ([legacy_rpc] listen).
LEGACY_RPC_HOST = "127.0.0.1"
LEGACY_RPC_PORT = 1778

BTF_VMLINUX = Path("/sys/kernel/btf/vmlinux")
NVML_LIBRARY = "libnvidia-ml.so.1"
KHEADERS_MODULE = "bpfdyno.ebpf.kheaders"

_GRANT_CAPS = (
    "run as root (sudo bpfdyno ...), or grant CAP_BPF and CAP_PERFMON "
    "(systemd: AmbientCapabilities=CAP_BPF CAP_PERFMON)"
)
#: The fix for missing capabilities where they cannot be had from inside: in a container.
_CONTAINER_CAPS = (
    "start the container with the capabilities the agent needs: podman/docker run --cap-add "
    "BPF --cap-add PERFMON --cap-add SYS_ADMIN --cap-add SYS_PTRACE --cap-add "
    "DAC_READ_SEARCH --pid host (Kubernetes: securityContext.capabilities.add and hostPID, "
    "as deploy/kubernetes/bpfdyno.yaml does); root inside a container has only what it was "
    "given"
)
#: The fix under the packaged unit (user bpfdyno): its capabilities come from the unit.
_UNIT_CAPS = (
    "the unit's AmbientCapabilities must keep CAP_BPF CAP_PERFMON (systemctl cat bpfdyno; an "
    "override in /etc/systemd/system/bpfdyno.service.d/ may have removed them)"
)


def where_it_runs(root: Path = Path("/")) -> str:
    """``container``, ``unit`` (the packaged service's user or a systemd service), or
    ``host`` (a checkout, the package's command run by hand): which fixes fit."""
    if (root / ".dockerenv").exists() or (root / "run/.containerenv").exists():
        return "container"
    # systemd, podman, nspawn and LXC set $container (lower case, by convention) in one.
    if os.environ.get("container"):  # noqa: SIM112
        return "container"
    if os.environ.get("INVOCATION_ID") or _user_name(os.geteuid()) == "bpfdyno":
        return "unit"
    return "host"


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


#: The fix for missing BPF capabilities, by `where_it_runs`.
PRIVILEGE_FIXES = {"container": _CONTAINER_CAPS, "unit": _UNIT_CAPS, "host": _GRANT_CAPS}


def _grant_caps_fix() -> str:
    return PRIVILEGE_FIXES[where_it_runs()]


# Syscall numbers by architecture; Python's os module exposes neither bpf() nor
# perf_event_open(), so they are called through libc's syscall().
_SYSCALL_NR = {
    "x86_64": {"bpf": 321},
    "aarch64": {"bpf": 280},
}

_CAP_SYS_ADMIN = 21
_CAP_PERFMON = 38
_CAP_BPF = 39

_BPF_MAP_CREATE = 0
_BPF_MAP_TYPE_ARRAY = 2

_PERF_COUNT_HW_CPU_CYCLES = 0
# perf_event_attr flag bits: disabled, exclude_kernel, exclude_hv. Excluding the kernel
# keeps the probe within the default perf_event_paranoid for unprivileged users.
_PERF_ATTR_FLAGS = (1 << 0) | (1 << 5) | (1 << 6)


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: short stable identifier, e.g. ``bpf-syscall``.
        ok: True when fine, None for a warning, False when missing.
        detail: what was found, in words.
        fix: the exact action that resolves a warning or a missing capability.
        required: False when a missing capability only disables optional features.
    """

    name: str
    ok: bool | None
    detail: str
    fix: str = ""
    required: bool = True


def _syscall(name: str, *args: object) -> tuple[int, int]:
    """Call a raw syscall by name; returns (result, errno). Raises OSError on unknown arch."""
    numbers = _SYSCALL_NR.get(platform.machine())
    if numbers is None:
        raise OSError(errno.ENOSYS, f"no {name}() syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    result = int(libc.syscall(ctypes.c_long(numbers[name]), *args))
    return result, ctypes.get_errno() if result < 0 else 0


def _errno_name(err: int) -> str:
    return errno.errorcode.get(err, str(err))


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privileges() -> Check:
    """Root, or the capabilities loading and attaching BPF programs needs."""
    caps = _effective_caps()

    def has(cap: int) -> bool:
        # Kernels before 5.8 have no CAP_BPF/CAP_PERFMON; CAP_SYS_ADMIN covers both.
        return bool(caps & (1 << cap)) or bool(caps & (1 << _CAP_SYS_ADMIN))

    uid = os.geteuid()
    who = "running as root" if uid == 0 else f"running as uid {uid}"
    lacking = [n for n, c in (("CAP_BPF", _CAP_BPF), ("CAP_PERFMON", _CAP_PERFMON)) if not has(c)]
    if not lacking:
        return Check("privileges", True, f"{who} with CAP_BPF and CAP_PERFMON")
    return Check(
        "privileges",
        False,
        f"{who} without {' and '.join(lacking)} (effective capabilities {caps:#x})",
        _grant_caps_fix(),
    )


def check_bpf_syscall() -> Check:
    """Create (and close) a one-entry BPF array map: proves the bpf() syscall is usable."""
    attr = (ctypes.c_uint32 * 16)(_BPF_MAP_TYPE_ARRAY, 4, 4, 1)  # type, key, value, entries
    try:
        fd, err = _syscall(
            "bpf", ctypes.c_int(_BPF_MAP_CREATE), ctypes.byref(attr), ctypes.c_uint(64)
        )
    except OSError as e:
        return Check("bpf-syscall", None, str(e.strerror), "run bpfdyno on x86_64 or aarch64")
    if fd >= 0:
        os.close(fd)
        return Check("bpf-syscall", True, "BPF_MAP_CREATE of a 1-entry array map works")
    detail = f"bpf(BPF_MAP_CREATE) failed with {_errno_name(err)} ({os.strerror(err)})"
    if err in (errno.EPERM, errno.EACCES):
        return Check("bpf-syscall", False, detail, _grant_caps_fix())
    if err == errno.ENOSYS:
        return Check("bpf-syscall", False, detail, "boot a kernel built with CONFIG_BPF_SYSCALL=y")
    return Check("bpf-syscall", False, detail, "check dmesg for the kernel's reason")


def check_tracefs() -> Check:
    """tracefs must be mounted: bcc attaches tracepoints through it."""
    root = find_tracefs()
    if root is None:
        return Check("tracefs", False, "tracefs is not mounted", MOUNT_COMMAND)
    return Check("tracefs", True, f"mounted at {root}")


def check_btf() -> Check:
    """Kernel BTF lets bpfdyno generate exact kernel headers when none are installed."""
    try:
        size = BTF_VMLINUX.stat().st_size
    except OSError:
        return Check(
            "btf",
            False,
            f"no {BTF_VMLINUX}: programs that read kernel structs need installed headers",
            "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y, "
            "or install linux-headers-$(uname -r)",
            required=False,
        )
    return Check("btf", True, f"{BTF_VMLINUX} ({size} bytes)")


def check_kernel_headers(module: str = KHEADERS_MODULE) -> Check:
    """Where bcc gets kernel headers from, as described by the kheaders module."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        return Check(
            "kernel-headers",
            None,
            f"cannot tell: {module} is not part of this installation",
            "reinstall bpfdyno (pip install --force-reinstall bpfdyno)",
            required=False,
        )
    try:
        description = str(mod.describe_header_source())
    except Exception as e:  # any failure here is a missing header source, with its reason
        return Check(
            "kernel-headers",
            False,
            f"no usable kernel headers: {e}",
            "install linux-headers-$(uname -r), or boot a kernel with /proc/config.gz "
            "and CONFIG_DEBUG_INFO_BTF=y",
        )
    detail = description.removeprefix("kernel headers: ")
    # describe_header_source() reports the "nothing usable" case as text starting with "none".
    if detail.startswith("none"):
        return Check(
            "kernel-headers",
            False,
            detail,
            "install linux-headers-$(uname -r), or load the configs module (modprobe configs)",
        )
    return Check("kernel-headers", True, detail)


def check_bcc() -> Check:
    """bcc (Debian's python3-bpfcc) importable from this interpreter, with its version."""
    fix = "apt-get install python3-bpfcc"
    if sys.prefix != sys.base_prefix:
        # A virtualenv never sees Debian's dist-packages: expose bcc through a .pth file
        # naming a directory that holds only a symlink to it (what bootstrap.sh does).
        site = sysconfig.get_paths()["purelib"]
        link_dir = f"{sys.prefix}/bcc-site"
        fix += (
            f", then: mkdir -p {link_dir} && ln -sfn /usr/lib/python3/dist-packages/bcc "
            f"{link_dir}/bcc && echo {link_dir} > {site}/bcc-dist.pth"
        )
    try:
        bcc = importlib.import_module("bcc")
    except ImportError as e:
        return Check("bcc", False, f"cannot import bcc: {e}", fix)
    except OSError as e:  # libbcc.so.0 missing or broken
        return Check("bcc", False, f"bcc found but its library does not load: {e}", fix)
    version = getattr(bcc, "__version__", "unknown version")
    where = Path(bcc.__file__ or "?").resolve().parent
    return Check("bcc", True, f"bcc {version} ({where})")


def check_pmu() -> Check:
    """Open (and close) a cpu-cycles hardware counter for this process."""
    attr = PerfEventAttr(
        type=PERF_TYPE_HARDWARE,
        size=ctypes.sizeof(PerfEventAttr),
        config=_PERF_COUNT_HW_CPU_CYCLES,
        flags=_PERF_ATTR_FLAGS,
    )
    try:
        # this process, any CPU, no group
        fd = perf_event_open(attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOSYS:
            return Check("pmu", None, str(e.strerror), "", required=False)
        err = e.errno or 0
    else:
        os.close(fd)
        return Check("pmu", True, "hardware cpu-cycles counter opens", required=False)
    if err in (errno.ENOENT, errno.ENODEV, errno.EOPNOTSUPP):
        return Check(
            "pmu",
            False,
            "no hardware PMU (VM?) — PMU metrics disabled",
            "run on bare metal or in a VM that exposes a virtual PMU (e.g. QEMU/KVM -cpu host)",
            required=False,
        )
    detail = f"perf_event_open(cpu-cycles) failed with {_errno_name(err)} — PMU metrics disabled"
    if err in (errno.EPERM, errno.EACCES):
        fix = f"{_grant_caps_fix()}, or lower kernel.perf_event_paranoid"
        return Check("pmu", False, detail, fix, required=False)
    return Check("pmu", False, detail, "check dmesg for the kernel's reason", required=False)


def check_nvml(library: str = NVML_LIBRARY) -> Check:
    """The NVIDIA management library loads (GPU metrics need it); NVML is not initialised."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return Check(
            "nvml",
            False,
            f"{library} not loadable (no NVIDIA driver) — GPU metrics disabled",
            "install the NVIDIA driver (it provides libnvidia-ml.so.1)",
            required=False,
        )
    return Check("nvml", True, f"{library} loadable", required=False)


def check_grpc_socket(path: str) -> Check:
    """The gRPC Unix socket path is free, or held by an agent that accepts connections."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = Path(path).parent
        note = "" if parent.is_dir() else f"; {parent} will be created"
        return Check("grpc-socket", True, f"{path} is free{note}")
    if not stat.S_ISSOCK(st.st_mode):
        return Check(
            "grpc-socket",
            False,
            f"{path} exists and is not a socket",
            f"remove or rename {path}, or set [grpc] socket to another path",
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except ConnectionRefusedError:
            return Check(
                "grpc-socket",
                None,
                f"{path} is a stale socket file (nothing listening); the agent replaces it",
                f"none needed, or rm {path}",
            )
        except OSError as e:
            return Check(
                "grpc-socket",
                None,
                f"{path} exists but cannot be connected to ({e.strerror})",
                "run as root, or join the socket's group (grpc.socket_group), or ask the "
                "administrator for grpc.socket_mode = 0o666 (every user acts only as itself)",
            )
    return Check("grpc-socket", True, f"{path} in use by a running agent")


def check_tcp_port(
    host: str = LEGACY_RPC_HOST,
    port: int = LEGACY_RPC_PORT,
    name: str = "legacy-rpc-port",
    agent_socket: str = "",
    proc_root: Path = Path("/proc"),
    agent_ports: frozenset[int] = frozenset(),
) -> Check:
    """The TCP port can be bound on ``host`` the way a server binds it (SO_REUSEADDR).

    A port in use by the process that also serves ``agent_socket`` (the agent's gRPC socket),
    or one the running agent said it listens on (``agent_ports``: seen by users who cannot
    look into the agent's file descriptors), is the running agent's, and fine.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Like a server: lingering TIME_WAIT connections must not count as "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                if port in agent_ports:
                    return Check(
                        name,
                        True,
                        f"{where} in use by the running agent (its legacy RPC)",
                        required=False,
                    )
                agent = _agent_holding(host, port, agent_socket, proc_root)
                if agent:
                    return Check(
                        name,
                        True,
                        f"{where} in use by the running agent (pid {agent}, which serves "
                        f"{agent_socket})",
                        required=False,
                    )
                return Check(
                    name,
                    None,
                    f"{where} in use by another process (a running agent, or dynolog?)",
                    f"stop the process listening there (find it: ss -ltnp 'sport = :{port}')",
                    required=False,
                )
            if e.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6:
                return Check(
                    name,
                    None,
                    f"{where}: no such address here (IPv6 off?); the agent listens on "
                    "its other addresses",
                    "none needed, or leave it out of [legacy_rpc] listen",
                    required=False,
                )
            return Check(
                name,
                False,
                f"cannot bind {where}: {e.strerror}",
                "check the address and that no firewall or sandbox forbids binding it",
                required=False,
            )
    return Check(name, True, f"{where} free", required=False)


def _agent_holding(host: str, port: int, agent_socket: str, proc_root: Path) -> int:
    """The pid of the process listening on ``host:port`` that also holds ``agent_socket``
    (the running agent); 0 when there is none, or its sockets cannot be seen (not root)."""
    if not agent_socket:
        return 0
    on_port = socket_holders(proc_root, listening_socket_inodes(proc_root, host, port))
    on_socket = set(socket_holders(proc_root, unix_socket_inodes(proc_root, agent_socket)))
    return next((pid for pid in on_port if pid in on_socket), 0)


def check_peer_identity() -> Check:
    """The kernel names the owner of a loopback TCP peer (NETLINK_SOCK_DIAG inet_diag).

    Without it, legacy RPC and insecure TCP gRPC callers cannot be attributed to a user, and
    their trace requests are refused (rule ``unattributed_requester``).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname(), timeout=2) as client:
            conn, peer = srv.accept()
            with conn:
                try:
                    uid = tcp_owner_uid(peer, conn.getsockname())
                except SockDiagUnavailable as e:
                    return Check(
                        "peer-identity",
                        False,
                        f"TCP callers cannot be attributed to a user: {e}; trace requests on "
                        "the legacy port (and insecure TCP gRPC) are refused",
                        "load the kernel's socket diagnostics: modprobe inet_diag tcp_diag",
                        required=False,
                    )
            client.close()
    if uid != os.geteuid():
        return Check(
            "peer-identity",
            None,
            f"the kernel named uid {uid} as the owner of our own test socket",
            "report this as a bpfdyno bug, with this line",
            required=False,
        )
    return Check(
        "peer-identity",
        True,
        "callers on this host are attributed to their uid (SO_PEERCRED, sock_diag)",
        required=False,
    )


def check_link_protections() -> Check:
    """The kernel refuses to follow links planted in shared sticky directories such as /tmp."""
    values = read_protections()
    off = [f"{k} = {v}" for k, v in values.items() if v < PROTECTIONS[k]]
    if off:
        settings = " ".join(f"{k}={v}" for k, v in PROTECTIONS.items())
        return Check(
            "link-protections",
            None,
            f"{', '.join(off)}: traces may not go straight into shared sticky directories "
            "such as /tmp (rule shared_directory_unprotected); private subdirectories work",
            f"sysctl -w {settings} (and in /etc/sysctl.d to keep it)",
            required=False,
        )
    return Check(
        "link-protections",
        True,
        "links and files other users plant in /tmp are not followed",
        required=False,
    )


def check_kineto_name(cfg: Config, proc_root: Path = Path("/proc")) -> Check:
    """Nobody but an agent holds the abstract Kineto name ``@dynolog@`` (a user holding it
    answers every trainer of the node in the agent's place)."""
    if cfg.kineto.socket_dir:
        return Check("kineto-name", True, f"not used (sockets in {cfg.kineto.socket_dir})")
    agents = {ROOT_UID, os.geteuid()}
    with contextlib.suppress(OSError):
        agents.add(os.stat(cfg.grpc.socket).st_uid)  # a running agent's own user
    with contextlib.suppress(KeyError):
        agents.add(pwd.getpwnam("bpfdyno").pw_uid)  # the packaged unit's user
    holders = name_holders(proc_root)
    if impostors(holders, frozenset(agents)):
        return Check(
            "kineto-name",
            False,
            taken_reason(holders, frozenset(agents)),
            "kill the process named, restart bpfdyno, and see docs/security.md",
        )
    if holders:
        return Check(
            "kineto-name", True, "@dynolog@ held by " + ", ".join(h.describe() for h in holders)
        )
    return Check("kineto-name", True, "@dynolog@ is free (the agent binds it when it starts)")


def check_tracepoint(system: str, event: str, required: bool = True) -> Check:
    """A tracefs event exists (its ``format`` file is readable)."""
    name = f"tracepoint {system}:{event}"
    root = find_tracefs()
    if root is None:
        return Check(name, False, "tracefs is not mounted", MOUNT_COMMAND, required)
    fmt = root / "events" / system / event / "format"
    try:
        fmt.read_bytes()
    except PermissionError:
        return Check(name, False, f"{fmt} is not readable", "run as root", required)
    except OSError:
        if required:
            return Check(
                name,
                False,
                f"{system}:{event} is not in {root}/events",
                "boot a kernel built with CONFIG_TRACEPOINTS=y and CONFIG_FTRACE=y",
            )
        return Check(
            name,
            None,
            f"{system}:{event} is not in {root}/events (kernel older than 6.3?) — "
            "socket byte counts fall back to syscall tracepoints",
            "use kernel 6.3 or newer for exact per-process socket byte counts",
            required=False,
        )
    return Check(name, True, "available", required=required)


def check_rdma(root: Path = Path("/")) -> Check:
    """The RDMA devices the fabric collector will report; none is normal (no RDMA fabric)."""
    from bpfdyno.sources.fabric.collector import port_places
    from bpfdyno.sources.fabric.rdma import DeviceGone, list_devices, read_device, read_port_status

    devices = []
    for name in list_devices(root):
        with contextlib.suppress(DeviceGone):
            devices.append(read_device(root, name))
    if not devices:
        return Check(
            "rdma",
            True,
            "no RDMA devices (/sys/class/infiniband is empty or absent): the fabric collector "
            "reports the NICs only",
            required=False,
        )
    ports = []
    for place in port_places(root, devices):
        try:
            state = read_port_status(root, place.device, place.port).state_name
        except DeviceGone:
            continue
        ports.append(f"{place.describe()} {state or '?'}")
    return Check("rdma", True, f"{len(devices)} device(s): {'; '.join(ports)}", required=False)


def check_kineto_protection(cfg: Config) -> Check:
    """Who can configure trainers directly, bypassing the agent, with this configuration
    and kernel (libkineto takes a config from any datagram that reaches its socket)."""
    from bpfdyno.ebpf.errors import BpfLoadError
    from bpfdyno.tracing.ipc.guard import KernelGuard

    k = cfg.kineto
    found: list[str] = []
    guard_problem = ""
    if k.kernel_guard:
        guard = KernelGuard()
        try:
            guard.load()  # loaded and closed at once: the kernel takes it or says why
            found.append("kernel guard of abstract names")
        except BpfLoadError as e:
            guard_problem = str(e)
        finally:
            guard.close()
    if k.user_socket_root:
        found.append(f"per-user directories under {k.user_socket_root}")
    if k.pod_socket_root:
        found.append(f"per-pod directories under {k.pod_socket_root}")
    layout = f"shared directory {k.socket_dir}" if k.socket_dir else "abstract names"
    open_now = bool(k.socket_dir) or "kernel guard of abstract names" not in found
    if found and not open_now:
        return Check("kineto-protection", True, ", ".join(found), required=False)
    detail = (
        f"trainers on the {layout} can be configured by any local user, bypassing the agent"
        + (f" ({', '.join(found)} for the others)" if found else "")
        + (f"; no kernel guard: {guard_problem}" if guard_problem else "")
        + " (`bpfdyno status` counts them)"
    )
    fix = (
        "mount each trainer pod's own directory under the per-pod root "
        "(deploy/kubernetes/trainer-example.yaml)"
        if k.pod_socket_root
        else "start jobs with `bpfdyno run` (their user's own directory)"
        if k.user_socket_root
        else 'set [kineto] user_socket_root = "/run/bpfdyno/kineto" and start jobs with '
        "`bpfdyno run`"
    )
    return Check("kineto-protection", None, detail, fix, required=False)


def _legacy_addresses(cfg: Config) -> list[tuple[str, int]]:
    """The configured ``[legacy_rpc] listen`` addresses (none when it is disabled)."""
    if not cfg.legacy_rpc.enabled:
        return []
    out = []
    for addr in cfg.legacy_rpc.listen:
        host, _, port = addr.rpartition(":")
        if port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def check_nccl_profiler(shm_dir: Path = DEFAULT_SHM_DIR) -> Check:
    """Whether trainers here use the NCCL profiler plugin, and whether it can be built."""
    receiver = NcclProfilerReceiver(shm_dir=shm_dir)
    receiver.poll()
    status = receiver.status()
    if receiver.rejected:
        return Check("nccl-profiler", None, status.reason, "remove the files named", False)
    if receiver.in_use():
        return Check("nccl-profiler", True, status.reason, required=False)
    build = "python -m bpfdyno.sources.nccl_profiler.build DIR"
    try:
        cc = compiler()
    except PluginBuildError as e:
        return Check("nccl-profiler", None, f"not in use; {e}", "apt-get install gcc", False)
    return Check(
        "nccl-profiler",
        True,
        f"not in use; {cc} can build {LIBRARY_NAME} ({build}), then start trainers with "
        f"NCCL_PROFILER_PLUGIN=DIR/{LIBRARY_NAME}",
        required=False,
    )


def run_checks(cfg: Config, agent_ports: frozenset[int] = frozenset()) -> list[Check]:
    """Run every check against this machine and the agent's configured endpoints.

    Args:
        cfg: the agent's configuration (the gRPC socket path comes from ``cfg.grpc.socket``).
        agent_ports: TCP ports a running agent said it holds (`AgentReport.held_ports`).

    Returns:
        One `Check` per capability, in a fixed order. A check that fails unexpectedly is
        reported as a warning naming the error, never raised.
    """
    checks: list[tuple[str, Callable[[], Check]]] = [
        ("privileges", check_privileges),
        ("bpf-syscall", check_bpf_syscall),
        ("tracefs", check_tracefs),
        ("btf", check_btf),
        ("kernel-headers", check_kernel_headers),
        ("bcc", check_bcc),
        ("pmu", check_pmu),
        ("nvml", check_nvml),
        ("grpc-socket", lambda: check_grpc_socket(cfg.grpc.socket)),
        *(
            (
                "legacy-rpc-port",
                partial(
                    check_tcp_port,
                    host,
                    port,
                    agent_socket=cfg.grpc.socket,
                    agent_ports=agent_ports,
                ),
            )
            for host, port in _legacy_addresses(cfg)
        ),
        ("peer-identity", check_peer_identity),
        ("link-protections", check_link_protections),
        ("kineto-name", lambda: check_kineto_name(cfg)),
        ("tracepoint sched:sched_switch", lambda: check_tracepoint("sched", "sched_switch")),
        (
            "tracepoint sock:sock_send_length",
            lambda: check_tracepoint("sock", "sock_send_length", required=False),
        ),
        (
            "tracepoint irq:softirq_entry",
            lambda: check_tracepoint("irq", "softirq_entry", required=False),
        ),
        ("rdma", check_rdma),
        ("kineto-protection", lambda: check_kineto_protection(cfg)),
        ("nccl-profiler", check_nccl_profiler),
    ]
    results = []
    for name, check in checks:
        try:
            results.append(check())
        except Exception as e:  # doctor must report, never crash
            results.append(
                Check(
                    name,
                    None,
                    f"the check itself failed: {type(e).__name__}: {e}",
                    "report this as a bpfdyno bug, with this line",
                )
            )
    return results


def format_check(check: Check) -> str:
    """One line: ``ok      name: detail`` or ``missing name: detail — fix: ...``."""
    status = {True: "ok", None: "warn", False: "missing"}[check.ok]
    line = f"{status:<8}{check.name}: {check.detail}"
    if check.ok is not True and check.fix:
        line += f" — fix: {check.fix}"
    return line


def format_checks(checks: list[Check]) -> str:
    """The report: one line per check, in order, without a trailing newline."""
    return "\n".join(format_check(c) for c in checks)


def exit_code(checks: list[Check]) -> int:
    """0 when nothing required is missing, else 1 (warnings and optional misses pass)."""
    return 1 if any(c.ok is False and c.required for c in checks) else 0


# -- the running agent ------------------------------------------------------------------------

#: How long doctor waits for a running agent's answer.
AGENT_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class AgentReport:
    """What doctor learned from the running agent: its checks, and the TCP ports it holds
    (which the machine checks must not call "in use by another process")."""

    checks: list[Check]
    held_ports: frozenset[int]


def agent_checks(target: str) -> AgentReport | None:
    """Ask the agent at ``target`` for its status; None when no agent answers there.

    The checks say which agent answers (version, pid, its user, uptime), what the caller may
    do with it, and one line per part of the agent that is not ok, with the agent's reason.
    """
    import asyncio
    import re

    from bpfdyno.client.agent import AgentClient
    from bpfdyno.client.errors import AgentError
    from bpfdyno.rpc.agent import AgentStatus, CollectorState

    async def ask() -> AgentStatus:
        async with AgentClient(target, timeout_s=AGENT_TIMEOUT_S) as agent:
            return await agent.status()

    try:
        st = asyncio.run(ask())
    except AgentError:
        return None
    owner = "?"
    with contextlib.suppress(OSError):
        owner = _user_name(os.stat(f"/proc/{st.pid}").st_uid) if st.pid else "?"
    me = os.geteuid()
    checks = [
        Check(
            "agent",
            True,
            f"bpfdyno {st.version} answers at {target} (pid {st.pid}, user {owner}, up "
            f"{st.agent_uptime_seconds:.0f} s, config {st.config_source or 'defaults'})",
        ),
        Check(
            "you",
            True,
            f"uid {me} ({_user_name(me)}): metrics, ps, trainers and status; traces of "
            + (
                "any process (root)"
                if me == 0
                else "your own processes, into directories you "
                "control (other users' processes: root only)"
            )
            + "; your own traces and audit records",
        ),
    ]
    ports: set[int] = set()
    bad = []
    for c in st.collectors:
        if c.name == "legacy_rpc" and c.state is not CollectorState.UNAVAILABLE:
            ports |= {int(p) for p in re.findall(r":(\d+)(?=[;,]|$)", c.reason.split(";")[0])}
        if c.state in (CollectorState.OK, CollectorState.DISABLED):
            continue
        bad.append(c)
        checks.append(
            Check(
                f"agent part {c.name}",
                None,
                f"{c.state.value}: {c.reason}" if c.reason else c.state.value,
                "see its reason; bpfdyno status shows every part",
                required=False,
            )
        )
    ok = len(st.collectors) - len(bad)
    checks.insert(
        2,
        Check(
            "agent parts",
            True if not bad else None,
            f"{ok} of {len(st.collectors)} ok or disabled by configuration"
            + (f"; not ok: {', '.join(c.name for c in bad)}" if bad else ""),
            "bpfdyno status" if bad else "",
            required=False,
        ),
    )
    return AgentReport(checks, frozenset(ports))
