"""A shared node for the local-safety tests: an agent, an unprivileged user created for the
test, the user's own directory, a root-owned victim file, and ways to act as the user (see
test_security.py and test_security_readers.py). The `site` fixture is in conftest.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from local_user import LocalUser
from tracing_harness import TRAINERS, Harness, TrainerProc, unframe

from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.tracing.traces import TrainerState

USER_CLIENT = str(Path(__file__).with_name("user_client.py"))
VICTIM_BYTES = b"root:precious:contents\n" * 3
#: The agent's duration limit in these tests ([tracing] max_duration_ms).
MAX_DURATION_MS = 3000


@dataclass
class Site:
    """An agent on a shared node: a sticky socket directory, root's trace directory, a
    directory of the user's own, a root-owned victim file, the gRPC socket open to all."""

    h: Harness
    user: LocalUser
    grpc_sock: str
    user_dir: Path
    victim: Path

    async def as_user(
        self, *argv: str, user: LocalUser | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the user without blocking the agent's loop."""
        return await asyncio.to_thread((user or self.user).run, list(argv))

    async def user_cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``bpfdyno ARGV --socket <the agent>`` as the user."""
        return await self.as_user(
            sys.executable, "-m", "bpfdyno", argv[0], "--socket", self.grpc_sock, *argv[1:]
        )

    async def user_frame(self, data: bytes, user: LocalUser | None = None) -> dict[str, object]:
        """Send a legacy RPC frame as the user; the decoded reply."""
        port = str(self.h.legacy_port)
        r = await self.as_user(sys.executable, USER_CLIENT, "frame", port, data.hex(), user=user)
        assert r.returncode == 0, r.stderr
        return unframe(bytes.fromhex(json.loads(r.stdout)["reply"]))

    def spawn_user_trainer(
        self, job_id: int | None = None, pid_namespace: bool = False
    ) -> TrainerProc:
        argv = self.user.wrap([sys.executable, str(TRAINERS / "linear.py")], pid_namespace)
        env = {k: v for k, v in self.user.env().items() if k in ("HOME", "TMPDIR", "USER")}
        return self.h.spawn(argv, job_id=job_id, extra_env=env)

    def stub(self) -> pb_grpc.TracingStub:
        return pb_grpc.TracingStub(grpc.aio.insecure_channel(f"unix:{self.grpc_sock}"))


async def registered(site: Site, proc: TrainerProc) -> int:
    [pid] = await proc.wait_ready()
    await site.h.wait_trainers(lambda ts: pid in {t.pid for t in ts})
    return pid


async def idle(site: Site, pid: int) -> None:
    """Wait until the trainer's profiler is free again after a trace (its next polls)."""
    await site.h.wait_trainers(
        lambda ts: any(t.pid == pid and t.state is TrainerState.IDLE for t in ts)
    )
