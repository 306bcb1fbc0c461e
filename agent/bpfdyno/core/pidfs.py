"""Small, allocation-light readers of ``/proc/<pid>`` files, under an injectable root.

What the process table and the tracing checks need, each function returning None when the
process is gone (or the file unreadable) instead of raising: a pid can exit between listing
and reading.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.core.text import shown, shown_bytes

#: Container ids are 64 hex digits in every runtime's cgroup naming.
_CONTAINER_RE = re.compile(
    r"(?:docker-|cri-containerd-|crio-|containerd-|libpod-)?([0-9a-f]{64})(?:\.scope)?$"
)
_K8S_POD_RE = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_SLURM_CGROUP_RE = re.compile(r"/job_(\d+)(?:/|$)")


@dataclass(frozen=True, slots=True)
class PidStat:
    """The fields of ``/proc/<pid>/stat`` the table uses."""

    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime, in clock ticks
    num_threads: int
    start_ticks: int  # start time after boot, in clock ticks (identifies a pid's lifetime)
    rss_pages: int


def list_pids(proc_root: Path) -> list[int]:
    """The numeric entries of the proc root (thread groups)."""
    try:
        return [int(name) for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return []


def read_small(path: str) -> bytes | None:
    """The first 4 KiB of a /proc file (a stat line); None when it is gone.

    Called for every process or thread at every refresh: a bare os.open/os.read on a string
    path costs a third of open() on a Path.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_stat(proc_root: Path, pid: int) -> PidStat | None:
    """Parse ``/proc/<pid>/stat``; None if the process is gone or the line is malformed."""
    raw = read_small(f"{os.fspath(proc_root)}/{pid}/stat")
    if raw is None:
        return None
    # comm may itself contain ") " — the last ')' ends it.
    open_i = raw.find(b"(")
    close_i = raw.rfind(b")")
    if open_i < 0 or close_i < open_i:
        return None
    rest = raw[close_i + 2 :].split()
    try:
        return PidStat(
            comm=shown_bytes(raw[open_i + 1 : close_i]),
            state=rest[0].decode("ascii", "replace"),
            ppid=int(rest[1]),
            cpu_ticks=int(rest[11]) + int(rest[12]),
            num_threads=int(rest[17]),
            start_ticks=int(rest[19]),
            rss_pages=int(rest[21]),
        )
    except (IndexError, ValueError):
        return None


def read_cmdline(proc_root: Path, pid: int) -> str | None:
    """The command line with arguments joined by spaces ("" for kernel threads), `shown`."""
    try:
        with open(proc_root / str(pid) / "cmdline", "rb") as f:
            raw = f.read(8192)
    except OSError:
        return None
    return shown_bytes(raw.rstrip(b"\0").replace(b"\0", b" "))


def read_status(proc_root: Path, pid: int, names: Collection[str]) -> dict[str, list[str]] | None:
    """The ``names`` fields of ``/proc/<pid>/status`` (``Uid``, ``NSpid``...) -> their values;
    read only up to the last of them (``Uid`` is the 9th line of about 60)."""
    wanted = {name.encode() for name in names}
    fields: dict[str, list[str]] = {}
    try:
        with open(proc_root / str(pid) / "status", "rb") as f:
            for line in f:
                name, _, values = line.partition(b":")
                if name in wanted:
                    fields[name.decode()] = values.decode("ascii", "replace").split()
                    if len(fields) == len(wanted):
                        break
    except OSError:
        return None
    return fields


def status_ints(fields: dict[str, list[str]], name: str) -> list[int] | None:
    """The integers of one `read_status` field (None: missing or not integers)."""
    try:
        return [int(v) for v in fields[name]]
    except (KeyError, ValueError):
        return None


def read_uid(proc_root: Path, pid: int) -> int | None:
    """The real uid from ``/proc/<pid>/status``."""
    fields = read_status(proc_root, pid, ("Uid",))
    uids = status_ints(fields, "Uid") if fields is not None else None
    return uids[0] if uids else None


def read_cgroup(proc_root: Path, pid: int) -> str | None:
    """The process's cgroup path: the unified (v2) one, else the v1 ``cpu`` or systemd one.

    `shown`: users name the cgroups delegated to them.
    """
    try:
        with open(proc_root / str(pid) / "cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fallback = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            return shown(path)
        names = controllers.split(",")
        if "cpu" in names or "name=systemd" in names:
            fallback = fallback or path
    if fallback is None and lines:
        parts = lines[0].split(":", 2)
        fallback = parts[2] if len(parts) == 3 else None
    return shown(fallback) if fallback is not None else None


def container_id(cgroup_path: str) -> str:
    """The 64-hex container id in a docker/containerd/CRI-O/podman cgroup path, else ""."""
    for component in reversed(cgroup_path.split("/")):
        m = _CONTAINER_RE.search(component)
        if m:
            return m.group(1)
    return ""


def k8s_pod_uid(cgroup_path: str) -> str:
    """The Kubernetes pod uid (dashed form) in a kubepods cgroup path, else ""."""
    if "kubepods" not in cgroup_path:
        return ""
    m = _K8S_POD_RE.search(cgroup_path)
    return m.group(1).replace("_", "-") if m else ""


def read_environ_raw(proc_root: Path, pid: int, names: Collection[str]) -> dict[str, bytes]:
    """The variables ``names`` that are set in the process's initial environment (its first
    MiB), as they are (to compare, never to show); {} when it cannot be read."""
    wanted = {n.encode() for n in names}
    try:
        with open(proc_root / str(pid) / "environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return {}
    out: dict[str, bytes] = {}
    for entry in raw.split(b"\0"):
        key, eq, value = entry.partition(b"=")
        if eq and key in wanted:
            out[key.decode()] = value
    return out


def read_environ(proc_root: Path, pid: int, names: Collection[str]) -> dict[str, str]:
    """The variables ``names`` that are set in the process's initial environment (its first
    MiB), decoded; {} when it cannot be read."""
    raw = read_environ_raw(proc_root, pid, names)
    return {k: v.decode("utf-8", "replace") for k, v in raw.items()}


def read_environ_var(proc_root: Path, pid: int, name: str) -> str | None:
    """One variable of the process's initial environment (`shown`); None if unset or
    unreadable."""
    raw = read_environ_raw(proc_root, pid, (name,)).get(name)
    return shown_bytes(raw) if raw is not None else None


def slurm_job_from_cgroup(cgroup_path: str) -> str:
    """The job id in a SLURM cgroup path (``.../slurm/uid_1000/job_1234/step_0``), else ""."""
    if "slurm" not in cgroup_path:
        return ""
    m = _SLURM_CGROUP_RE.search(cgroup_path)
    return m.group(1) if m else ""


def read_boot_time_s(proc_root: Path) -> float | None:
    """System boot time (epoch seconds) from the ``btime`` line of ``/proc/stat``."""
    try:
        with open(proc_root / "stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def read_uptime_s(proc_root: Path) -> float | None:
    """Seconds since boot from ``/proc/uptime``."""
    try:
        with open(proc_root / "uptime", "rb") as f:
            return float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def socket_inodes(proc_root: Path, pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open (``socket:[N]`` fds); empty when
    it is gone or its fds cannot be read (another user's, without root)."""
    return socket_inodes_upto(proc_root, pid, None)[0]


def socket_inodes_upto(proc_root: Path, pid: int, max_fds: int | None) -> tuple[set[int], bool]:
    """`socket_inodes` reading at most ``max_fds`` descriptors (None: all), and whether there
    were more than that (those were not read)."""
    out: set[int] = set()
    read = 0
    try:
        with os.scandir(proc_root / str(pid) / "fd") as fds:
            for fd in fds:
                if max_fds is not None and read >= max_fds:
                    return out, True
                read += 1
                with contextlib.suppress(OSError):  # closed since the listing
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        out.add(int(target[8:-1]))
    except OSError:
        return set(), False
    return out, False


def _listening_lines(proc_root: Path, host: str, port: int) -> Iterator[list[str]]:
    """The fields of ``/proc/net/tcp`` (``tcp6``) lines of the sockets listening on
    ``host:port`` or on the wildcard address of its family (which holds the port too)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    wanted = {socket.inet_pton(family, host), bytes(4 if family == socket.AF_INET else 16)}
    table = "tcp6" if family == socket.AF_INET6 else "tcp"
    try:
        lines = (proc_root / "net" / table).read_text().splitlines()[1:]
    except OSError:
        return
    suffix = f":{port:04X} "  # "<address>:<port> " in hex, before the remote address
    for line in lines:
        if suffix not in line:  # most lines: not the port; skip them before parsing
            continue
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":  # 0A: TCP_LISTEN
            continue
        addr, _, hexport = fields[1].partition(":")
        if int(hexport, 16) != port:
            continue
        # The address is printed as 32-bit words in this host's byte order.
        words = [int(addr[i : i + 8], 16) for i in range(0, len(addr), 8)]
        if struct.pack(f"={len(words)}I", *words) in wanted:
            yield fields


def listening_socket_inodes(proc_root: Path, host: str, port: int) -> set[int]:
    """The inodes of the TCP sockets listening on ``host:port`` (or on the wildcard address
    of its family), from ``/proc/net/tcp`` and ``tcp6``."""
    return {int(fields[9]) for fields in _listening_lines(proc_root, host, port)}


def listening_socket_owners(proc_root: Path, host: str, port: int) -> set[int]:
    """The uids that created the TCP sockets listening on ``host:port`` (or on the wildcard
    address of its family), from ``/proc/net/tcp`` and ``tcp6`` (their ``uid`` column)."""
    return {int(fields[7]) for fields in _listening_lines(proc_root, host, port)}


def unix_socket_inodes(proc_root: Path, path: str) -> set[int]:
    """The inodes of the Unix sockets bound to ``path``, from ``/proc/net/unix``."""
    try:
        lines = (proc_root / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {int(f[6]) for f in (line.split() for line in lines) if len(f) >= 8 and f[7] == path}


def socket_holders(proc_root: Path, inodes: Collection[int]) -> list[int]:
    """The pids of the processes holding any of the sockets ``inodes`` (root sees all)."""
    if not inodes:
        return []
    return [pid for pid in list_pids(proc_root) if socket_inodes(proc_root, pid) & set(inodes)]
