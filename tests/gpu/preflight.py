"""Does bpfdyno run on this node? Run before the GPU suite by ``run_offline.sh``.

Starts the agent as the suite does and prints every part's state. Exits 1 unless the parts
that load BPF programs (``sched``, ``net``, ``capture``) run: that proves bcc, its LLVM and
the kernel headers work with this kernel, with nothing about the GPU involved. Prints where
bcc was imported from, so a run shows which bcc it used.

    python tests/gpu/preflight.py WORK_DIR
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpu_suite import Agent

#: The parts of the agent that load BPF programs (the capture: the kernel tracks of traces).
BPF_PARTS = ("sched", "net", "capture")


def main() -> int:
    import bcc  # the one the agent will use: same interpreter, same environment

    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    sockets = Path(tempfile.mkdtemp(prefix="bdg-", dir="/tmp"))
    agent = Agent(work, sockets)
    try:
        agent.wait_ready()
        deadline = time.monotonic() + 60
        while True:  # until each BPF part has loaded its programs, or said why it cannot
            states = {c["name"]: c for c in agent.status()["collectors"]}
            starting = [n for n in BPF_PARTS if states[n]["state"] == "COLLECTOR_STATE_STARTING"]
            if not starting or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        status = agent.stop()
        shutil.rmtree(sockets, ignore_errors=True)
    print(f"bcc: {bcc.__file__}")
    for c in states.values():
        state = c["state"].removeprefix("COLLECTOR_STATE_").lower()
        print(f"  {c['name']:<15} {state:<12} {c.get('reason', '')}".rstrip())
    bad = [n for n in BPF_PARTS if states[n]["state"] != "COLLECTOR_STATE_OK"]
    if bad or status != 0:
        print(
            f"preflight FAILED: {', '.join(bad) or 'the agent'} not running (agent exit status "
            f"{status}); see {agent.log}",
            file=sys.stderr,
        )
        return 1
    print("preflight: the agent runs and loads its BPF programs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
