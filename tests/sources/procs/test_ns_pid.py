"""Processes in a pid namespace of their own (every container): the process table shows the
pid they know themselves by beside the agent's, and ``pid=`` filters take either, as
``gputrace --pids`` does.

Real namespaces: ``unshare --pid --fork --mount-proc sh -c 'sleep & wait'`` makes the shell
pid 1 and the sleep pid 2 there, both with other pids here.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bpfdyno.cli.ps import format_table
from bpfdyno.core.events import FlightRecorder
from bpfdyno.rpc.processes import ProcessList, ProcessRow, row_from_pb, row_to_pb
from bpfdyno.rpc.wire import record_dict
from bpfdyno.services.kernel import KernelService
from bpfdyno.sources.procs.table import ProcessTable

pytestmark = [pytest.mark.root]

#: A sleep nobody else runs, so the filter's command word finds only ours.
SLEEP_S = "3141.5"


@pytest.fixture
def namespaced() -> Iterator[tuple[int, int]]:
    """(the shell's pid here, the sleep's pid here): pids 1 and 2 in their own namespace."""
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", f"sleep {SLEEP_S} & wait"]
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            kids = psutil.Process(unshare.pid).children(recursive=True)
            shells = [k for k in kids if k.name() == "sh"]
            sleeps = [k for k in kids if k.name() == "sleep"]
            if shells and sleeps:
                break
            assert time.monotonic() < deadline, "the namespace's processes did not start"
            time.sleep(0.02)
        yield shells[0].pid, sleeps[0].pid
    finally:
        for kid in psutil.Process(unshare.pid).children(recursive=True):
            kid.kill()
        unshare.kill()
        unshare.wait()


async def test_rows_show_the_namespace_pid_and_pid_filters_take_either(
    namespaced: tuple[int, int],
) -> None:
    shell, sleep = namespaced
    assert 2 not in (shell, sleep)
    me = os.getpid()
    table = ProcessTable(Path("/proc"), top_n=1, pinned=lambda: (shell, sleep, me))
    svc = KernelService(FlightRecorder(60, 1 << 20), table=table)
    table.refresh()
    rows = {r.pid: r for r in (await svc.list_processes(limit=0)).rows}
    assert (rows[shell].ns_pid, rows[sleep].ns_pid) == (1, 2)
    assert rows[me].ns_pid == 0  # in the agent's own namespace: none

    async def pids(flt: str) -> list[int]:
        return sorted(r.pid for r in (await svc.list_processes(filter=flt, limit=0)).rows)

    # Its pid here, or its pid there; the command word picks ours among every pid 2.
    assert await pids(f"pid={sleep}") == [sleep]
    assert await pids(f"pid=2 {SLEEP_S}") == [sleep]
    assert await pids(f"pid=1 {SLEEP_S}") == [shell]

    # On the wire and in --json: the field, its value.
    assert row_from_pb(row_to_pb(rows[sleep])).ns_pid == 2
    assert record_dict(rows[sleep], with_defaults=True)["ns_pid"] == 2


def test_ps_shows_an_ns_pid_column_only_when_a_row_has_one() -> None:
    host = ProcessRow(700, user="root", cmdline="sshd")
    boxed = ProcessRow(4242, user="ann", cmdline="python train.py", ns_pid=7)
    header, first, second, _ = format_table(ProcessList((host, boxed), 1.0, 2), 120).splitlines()
    assert header.split()[:4] == ["PID", "NS", "PID", "USER"]
    assert first.split()[:3] == ["700", "-", "root"]
    assert second.split()[:3] == ["4242", "7", "ann"]
    header, _, _ = format_table(ProcessList((host,), 1.0, 1), 120).splitlines()
    assert header.split()[:2] == ["PID", "USER"]


def test_a_narrow_terminal_drops_the_ns_pid_column_last_and_says_so() -> None:
    boxed = ProcessRow(
        4242,
        user="ann",
        cmdline="python train.py",
        ns_pid=7,
        slurm_job_id="1234",
        container_id="ab" * 32,
        tcp_retransmits_per_second=1.0,
    )
    table = ProcessList((boxed,), 1.0, 1)
    wide = format_table(table, 100).splitlines()
    assert wide[0].split()[:4] == ["PID", "NS", "PID", "USER"]
    assert "JOB" in wide[0] and "CONTAINER" not in wide[0]
    assert " ".join(wide[2:]).endswith("not shown on 100 columns: CONTAINER (--json has them)")
    narrow = format_table(table, 80).splitlines()
    assert all(len(line) <= 80 for line in narrow), narrow
    assert narrow[0].split()[:2] == ["PID", "USER"]
    assert " ".join(narrow[2:]).endswith(
        "not shown on 80 columns: NS PID, RETX/s, JOB, CONTAINER (--json has them)"
    )
