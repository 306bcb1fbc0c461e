"""What the kernel says about BPF objects: fdinfo of this process's fds, bpftool's listings.

Every program and map bpfdyno creates is named ``bpfdyno_...`` (`NAME_PREFIX`); the kernel
keeps the first `KERNEL_NAME_LEN` characters of a name, so ``bpftool prog show`` and
``bpftool map show`` (and `loaded_programs`, `loaded_maps`) tell ours apart from everyone
else's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Name prefix of every bpfdyno BPF program and map.
NAME_PREFIX = "bpfdyno_"
#: Characters of a program or map name the kernel keeps (BPF_OBJ_NAME_LEN - 1).
KERNEL_NAME_LEN = 15


class BpftoolError(Exception):
    """bpftool is missing or failed; says what to do."""


@dataclass(frozen=True, slots=True)
class LoadedProgram:
    """One BPF program loaded in the kernel, as ``bpftool prog show`` lists it."""

    id: int
    name: str
    pids: tuple[int, ...]
    map_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LoadedMap:
    """One BPF map in the kernel, as ``bpftool map show`` lists it."""

    id: int
    name: str
    type: str
    max_entries: int
    pids: tuple[int, ...]


def fdinfo(fd: int) -> dict[str, str]:
    """The kernel's ``/proc/self/fdinfo`` fields of one fd ({} if it is gone)."""
    out: dict[str, str] = {}
    try:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def loaded_programs(prefix: str = NAME_PREFIX) -> list[LoadedProgram]:
    """BPF programs in the kernel whose name starts with ``prefix`` (all processes).

    Raises:
        BpftoolError: bpftool is missing or failed.
    """
    return [
        LoadedProgram(
            int(p["id"]),
            str(p.get("name", "")),
            _pids(p),
            tuple(int(m) for m in p.get("map_ids", ())),
        )
        for p in _bpftool("prog")
        if str(p.get("name", "")).startswith(prefix[:KERNEL_NAME_LEN])
    ]


def loaded_maps(prefix: str = NAME_PREFIX) -> list[LoadedMap]:
    """BPF maps in the kernel whose name starts with ``prefix`` (all processes).

    Raises:
        BpftoolError: bpftool is missing or failed.
    """
    return [
        LoadedMap(
            int(m["id"]),
            str(m.get("name", "")),
            str(m.get("type", "")),
            int(m.get("max_entries", 0)),
            _pids(m),
        )
        for m in _bpftool("map")
        if str(m.get("name", "")).startswith(prefix[:KERNEL_NAME_LEN])
    ]


def programs_still_loaded(ids: Iterable[int], timeout_s: float = 3.0) -> set[int]:
    """Which of the program ``ids`` are still in the kernel after waiting up to ``timeout_s``.

    The kernel frees a program shortly (RCU-deferred) after its last fd closes, so a check
    right after ``close()`` needs a moment.
    """
    want = set(ids)
    deadline = time.monotonic() + timeout_s
    while True:
        left = want & {p.id for p in loaded_programs(prefix="")}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _pids(obj: dict[str, Any]) -> tuple[int, ...]:
    return tuple(int(x["pid"]) for x in obj.get("pids", ()))


def _bpftool(kind: str) -> list[dict[str, Any]]:
    """``bpftool <kind> show --json``, parsed."""
    bpftool = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    if bpftool is None:
        raise BpftoolError("bpftool is not installed; install it (apt-get install bpftool)")
    res = subprocess.run(
        [bpftool, kind, "show", "--json"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise BpftoolError(f"bpftool {kind} show failed: {res.stderr.strip()}; run as root")
    listed: list[dict[str, Any]] = json.loads(res.stdout or "[]")
    return listed
