"""What ``/proc`` shows a user: its ``hidepid`` mount option.

A node may mount ``/proc`` with ``hidepid=1`` (``noaccess``: other users' process
directories cannot be read), ``hidepid=2`` (``invisible``: they are not even listed) or
``hidepid=4`` (``ptraceable``), optionally exempting one group (``gid=``). The agent reads
every process as root, so a process table it hands out would show everyone's command lines
to everyone; with any of these set, a user other than root (and outside the exempt group)
is shown only her own processes — what ``ps`` shows her on that node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.core.identity import ROOT_UID, primary_gid, user_groups

#: hidepid's words and their numbers (the kernel prints the words since 5.8).
_HIDEPID = {"0": 0, "off": 0, "1": 1, "noaccess": 1, "2": 2, "invisible": 2, "4": 4,
            "ptraceable": 4}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProcView:
    """The ``hidepid`` and ``gid`` options of the ``/proc`` mount (0 and None: none)."""

    hidepid: int = 0
    gid: int | None = None

    def sees_all(self, uid: int | None) -> bool:
        """Whether ``uid`` may see every process (root, the exempt group, or no hidepid)."""
        if self.hidepid == 0 or uid == ROOT_UID:
            return True
        if uid is None:
            return False
        return self.gid is not None and self.gid in user_groups(uid, primary_gid(uid))


def proc_view(mountinfo: Path = Path("/proc/self/mountinfo"), mount: str = "/proc") -> ProcView:
    """The options of the proc file system mounted at ``mount`` (the last one there wins,
    as in path lookup); no hidepid when it cannot be read."""
    view = ProcView()
    try:
        lines = mountinfo.read_text(errors="replace").splitlines()
    except OSError:
        return view
    for line in lines:
        # "36 25 0:22 / /proc rw,nosuid - proc proc rw,hidepid=invisible,gid=27"
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or rest[0] != "proc":
            continue
        if os.path.normpath(fields[4]) != mount:
            continue
        hidepid, gid = 0, None
        for option in rest[2].split(","):
            key, _, value = option.partition("=")
            if key == "hidepid":
                hidepid = _HIDEPID.get(value, 2)  # unknown word: the strictest reading
            elif key == "gid" and value.isdigit():
                gid = int(value)
        view = ProcView(hidepid, gid)
    return view
