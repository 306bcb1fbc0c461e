"""Run under ``unshare --net`` as root: a user holds @dynolog@ before the agent starts.

Prints one JSON object: the Kineto part's state and reason and doctor's kineto-name check
while the user's process holds the name, and again after it is killed (the agent takes the
name back by itself).

Usage: netns_impostor_run.py UID GID
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import bpfdyno.app.tracing as app_tracing
from bpfdyno.app.doctor import check_kineto_name
from bpfdyno.app.tracing import TracingComponent
from bpfdyno.core.config import load

IMPOSTOR = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "s.bind(b'\\0dynolog\\0')\n"
    "print('bound', flush=True)\n"
    "sys.stdin.read()\n"
)


def seen(comp: TracingComponent, cfg: object) -> dict[str, object]:
    [ipc] = [p for p in comp.statuses() if p.name == "kineto_ipc"]
    check = check_kineto_name(cfg)  # type: ignore[arg-type]
    return {"state": ipc.state.value, "reason": ipc.reason, "doctor": [check.ok, check.detail]}


async def main(uid: int, gid: int) -> dict[str, object]:
    app_tracing.SWEEP_INTERVAL_S = 0.5
    impostor = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--",
         "/usr/bin/python3", "-c", IMPOSTOR],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert impostor.stdout is not None
    assert impostor.stdout.readline() == "bound\n"
    cfg = load(None, [("kineto.socket_dir", '""'), ("legacy_rpc.enabled", "false")])
    comp = TracingComponent(cfg)
    await comp.start()
    out: dict[str, object] = {"impostor_pid": impostor.pid}
    try:
        out["held"] = seen(comp, cfg)
        impostor.kill()
        impostor.wait()
        t0 = time.monotonic()
        while not comp.endpoint.is_open and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.1)
        out["taken_back_after_s"] = round(time.monotonic() - t0, 1)
        out["freed"] = seen(comp, cfg)
    finally:
        impostor.kill()
        await comp.stop()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))))
