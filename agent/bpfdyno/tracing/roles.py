"""What part a registered process plays in its job: worker, launcher or DataLoader worker.

Every process that imports torch registers — the ranks, but also the torchrun agent and
spawn-context DataLoader workers. Under a process limit the slots should go to the ranks:

* a **DataLoader worker** names its main thread ``pt_data_worker`` (PyTorch does this), seen
  as ``/proc/<pid>/comm`` when the daemon shares the trainers' pid namespace; to be sure the
  pid is the same process, its parent in ``/proc`` must be the parent it reported;
* a **launcher** is an ancestor of another registered process that is not a DataLoader
  worker (a torchrun agent, a launcher script);
* every other process is a **worker** (a rank, a single-process trainer).

Workers are traced first, then launchers, then DataLoader workers.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from pathlib import Path

from bpfdyno.tracing.trainers import Trainer

DATA_WORKER_COMM = "pt_data_worker"


class Role(enum.Enum):
    WORKER = "worker"
    LAUNCHER = "launcher"
    DATA_WORKER = "data_worker"

    @property
    def priority(self) -> int:
        """Lower is traced first."""
        return {Role.WORKER: 0, Role.LAUNCHER: 1, Role.DATA_WORKER: 2}[self]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def is_data_worker(t: Trainer, proc_root: Path) -> bool:
    """True when ``/proc`` shows this trainer's pid as a DataLoader worker of its parent."""
    if _read(proc_root / str(t.pid) / "comm").strip() != DATA_WORKER_COMM:
        return False
    stat = _read(proc_root / str(t.pid) / "stat")
    # Fields after the parenthesised comm: state, ppid, ...
    fields = stat.rpartition(")")[2].split()
    parent = t.ancestors[0] if t.ancestors else 1
    return len(fields) > 1 and fields[1].isdigit() and int(fields[1]) == parent


def classify(trainers: Iterable[Trainer], proc_root: Path = Path("/proc")) -> dict[bytes, Role]:
    """The role of every trainer, keyed by its address."""
    trainers = list(trainers)
    leaves = {t.pid for t in trainers}
    # Only a child of another registered process can be one of its DataLoader workers.
    data_workers = {
        t.address
        for t in trainers
        if t.ancestors and t.ancestors[0] in leaves and is_data_worker(t, proc_root)
    }
    spawned_by: set[int] = set()
    for t in trainers:
        if t.address not in data_workers:
            spawned_by.update(t.ancestors)
    roles = {}
    for t in trainers:
        if t.address in data_workers:
            roles[t.address] = Role.DATA_WORKER
        elif t.pid in spawned_by:
            roles[t.address] = Role.LAUNCHER
        else:
            roles[t.address] = Role.WORKER
    return roles
