"""With ``hidepid`` on /proc, `bpfdyno ps` shows a user what /proc shows her (found in
round three: it showed every user's command lines to everyone)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass

import pytest

from bpfdyno.core.events import FlightRecorder
from bpfdyno.core.identity import Requester
from bpfdyno.core.procview import ProcView
from bpfdyno.rpc.processes import ProcessRow
from bpfdyno.services.kernel import KernelService
from bpfdyno.sources.procs.table import ProcessSnapshot

ROWS = (
    ProcessRow(1, comm="init", cmdline="/sbin/init", uid=0),
    ProcessRow(100, comm="train", cmdline="python train.py --secret-token=abc", uid=1001),
    ProcessRow(200, comm="mine", cmdline="python mine.py", uid=1002),
)


@dataclass
class Table:
    """A process table just updated (the service reads it as it is)."""

    snapshot: ProcessSnapshot

    def age_s(self) -> float:
        return 0.0

    def read(self, who: str) -> ProcessSnapshot:
        return self.snapshot


def pids(view: ProcView, who: Requester | None) -> list[int]:
    table = Table(ProcessSnapshot(1.0, ROWS, 3))
    svc = KernelService(FlightRecorder(60, 1 << 20), table, view=lambda: view)  # type: ignore[arg-type]
    listed = asyncio.run(svc.list_processes(sort_by="pid", requester=who))
    return sorted(r.pid for r in listed.rows)


def test_a_user_sees_only_her_processes_under_hidepid() -> None:
    alice, root = Requester(1002, "grpc-unix"), Requester(0, "grpc-unix")
    unknown = Requester(None, "legacy-rpc")
    for hidepid in (1, 2, 4):
        assert pids(ProcView(hidepid), alice) == [200]
        assert pids(ProcView(hidepid), unknown) == []
        assert pids(ProcView(hidepid), root) == [1, 100, 200]
    assert pids(ProcView(0), alice) == [1, 100, 200]  # /proc shows her everything
    assert pids(ProcView(2), None) == [1, 100, 200]  # inside the daemon


@pytest.mark.root
def test_hidepid_is_read_from_the_real_mount() -> None:
    """A /proc of its own (a new pid and mount namespace) remounted the way sites do."""
    code = "from bpfdyno.core.procview import proc_view; v = proc_view(); print(v.hidepid, v.gid)"
    for option, expected in (("hidepid=invisible,gid=27", "2 27"), ("hidepid=1", "1 None"),
                             ("hidepid=0", "0 None")):  # fmt: skip
        r = subprocess.run(
            ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c",
             f"mount -o remount,{option} /proc && exec {sys.executable} -c '{code}'"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == expected, option
