"""The trainers' side of tracing: every Kineto poll the IPC endpoint receives.

`KinetoPolls` is the endpoint's `DatagramHandler`. A poll registers (or refreshes) its
trainer, tells the trace tracker whether the trainer's profiler is busy, and — when a config
waits for it and its profiler is free — hands the config out, once, after checking its file's
directory again. Its sender's claims are checked against the kernel's credentials first: a
poll claiming another process's pid is ignored and counted. Nothing here blocks: a poll is
answered from memory.

The clients' side (trace requests, queries) is `bpfdyno.services.tracing.TracingService`,
which is built on this class.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bpfdyno.core.errors import RequestError
from bpfdyno.core.identity import in_process, owner_or_root
from bpfdyno.core.k8s_jobs import ENV_NAMES, kubernetes_job
from bpfdyno.core.pidfs import read_environ
from bpfdyno.core.workers import StoppedError, UserLanes
from bpfdyno.rpc.audit import AuditedProcess
from bpfdyno.tracing.audit import AuditLog
from bpfdyno.tracing.ipc.guard import KernelGuard
from bpfdyno.tracing.ipc.sender import ClaimVerifier, SenderCreds
from bpfdyno.tracing.ipc.wire import KinetoContext, KinetoRequest
from bpfdyno.tracing.kineto_build import KinetoBuilds
from bpfdyno.tracing.safety import PlacementChecker, Writer
from bpfdyno.tracing.traces import TraceTracker
from bpfdyno.tracing.trainers import Trainer, TrainerRegistry

log = logging.getLogger(__name__)


class KinetoPolls:
    """Trainers' polls against the registry and the trace tracker.

    Args:
        registry: the trainer registry (its size and expiry come from the config).
        tracker: the trace tracker, which holds the configs waiting for trainers.
        audit: where a config refused at delivery is recorded.
        placement: the trace-file placement rules (`bpfdyno.tracing.safety`).
        proc_root: where /proc is (to check the senders' claims).
        wall, mono: time sources (epoch seconds, monotonic seconds).
        user_files: where work on users' files runs, one lane per uid (default: lanes of
            its own); a trainer's libkineto is looked at there, the clients' side summarises
            and merges there.
    """

    def __init__(
        self,
        registry: TrainerRegistry,
        tracker: TraceTracker,
        audit: AuditLog,
        placement: PlacementChecker,
        proc_root: Path,
        wall: Callable[[], float],
        mono: Callable[[], float],
        user_files: UserLanes | None = None,
    ) -> None:
        self.registry = registry
        self.tracker = tracker
        self.audit = audit
        self._placement = placement
        self._claims = ClaimVerifier(proc_root)
        self._proc_root = proc_root
        self._wall = wall
        self._mono = mono
        #: Polls ignored because the pid they claim is not their sender's, per sender uid.
        self.false_claims: Counter[int] = Counter()
        #: Polls ignored because /proc here shows no process for their sender's pid (the
        #: kernel's): gone already, or hidden from the agent; per sender uid.
        self.unresolved: Counter[int] = Counter()
        #: Work on users' files (summaries, merges, libkineto look-ups), each user's in its
        #: own lane.
        self.user_files = user_files or UserLanes("user-files")
        #: What each trainer's libkineto does with an on-demand log file.
        self.kineto_builds = KinetoBuilds(self.user_files, proc_root)
        #: The kernel guard of trainers' abstract sockets, when the kernel has it (set by
        #: the component that loaded it).
        self.guard: KernelGuard | None = None

    def on_request(
        self, address: bytes, req: KinetoRequest, sender: SenderCreds | None = None
    ) -> str:
        """Account one poll and return the reply's config text ("" = nothing for it).

        Args:
            address: the socket address the poll came from.
            req: the poll.
            sender: the kernel's credentials of the poll; the claimed pids are checked
                against them and the trainer's owner comes from them (None: in-process
                callers, whose trainers only root may trace).
        """
        uid, host_pid, pids = None, 0, None
        if sender is not None:
            pids, host_pid, seen = self._claims.resolve(sender, req.pids)
            if pids is None:
                self._false_claim(sender, req, seen)
                return ""
            uid = sender.uid
            known = self.registry.get(address)
            if known is not None and (known.uid, known.host_pid) != (uid, host_pid):
                self._forget(address, "another process now polls from its socket address")
        t = self.registry.observe(
            address,
            req,
            self._wall(),
            self._mono(),
            uid,
            host_pid,
            None if pids == req.pids else pids,
        )
        if t is None:
            return ""
        if self.guard is not None and t.uid is not None:
            self.guard.protect(address, t.uid)  # a dictionary lookup once it is guarded
        self.kineto_builds.learn(address, t.host_pid, t.uid)
        if not t.job_looked_up and t.job_id == 0 and t.host_pid > 0:
            self._learn_job(t)
        self.tracker.on_poll(address, busy=not req.activities_free)
        if not req.activities_free:
            return ""  # a busy client would drop a config: keep it for a free poll
        if not self._still_safe(t):
            return ""
        taken = self.tracker.take_config(address)
        if taken is None:
            return ""
        trace_id, text = taken
        # A trainer in a container reports its own pid (often 1): name the host's as well.
        here = f" (pid {t.host_pid} here)" if t.host_pid and t.host_pid != t.pid else ""
        log.info("trace %s: config delivered to pid %d%s", trace_id, t.pid, here)
        return text

    def _learn_job(self, t: Trainer) -> None:
        """Read the environment of a trainer that sends no job id for its Kubernetes job
        (once, in its owner's lane: reading another process's environment can wait on its
        memory map); from then on its polls carry the job id derived from the name."""
        t.job_looked_up = True

        def look() -> None:
            env = read_environ(self._proc_root, t.host_pid, ENV_NAMES)
            job = kubernetes_job(env)
            if job is None:
                return
            # On the lane's thread: plain assignments; the loop only reads them.
            t.job_name, t.derived_job_id = job.name, job.job_id
            if t.job_id == 0:
                t.job_id = job.job_id
            log.info(
                "trainer pid %d: job %s (from %s), job id %d",
                t.host_pid, job.name, job.source, job.job_id,
            )  # fmt: skip

        with contextlib.suppress(StoppedError):
            self.user_files.submit(owner_or_root(t.uid), look)

    def on_context(self, address: bytes, ctxt: KinetoContext) -> int:
        """Legacy ``ctxt`` registration; returns the count dynolog would return."""
        return self.registry.register_context(ctxt)

    def sweep(self) -> list[bytes]:
        """Expire silent trainers (their open parts of traces fail); return their addresses."""
        gone = self.registry.expire(self._mono())
        for t in gone:
            log.info("trainer pid %d (job %d) stopped polling; removed", t.pid, t.job_id)
            self.tracker.on_gone(t.address)
            self.kineto_builds.forget(t.address)
            if self.guard is not None:
                self.guard.release(t.address)
        return [t.address for t in gone]

    def _false_claim(self, sender: SenderCreds, req: KinetoRequest, seen: bool) -> None:
        if not seen:
            if sender.uid not in self.unresolved:
                log.warning(
                    "ignoring Kineto polls of uid %d claiming pid %d: the kernel names their "
                    "sender pid %d, which /proc here does not show, so the claim cannot be "
                    "checked (rule 'sender_unresolved'); further ones are only counted",
                    sender.uid,
                    req.pid,
                    sender.pid,
                )
            self.unresolved[sender.uid] += 1
            return
        if sender.uid not in self.false_claims:
            log.warning(
                "ignoring Kineto polls of pid %d (uid %d): they claim to be pid %d, which the "
                "kernel does not confirm (rule 'pid_mismatch'); further ones are only counted",
                sender.pid,
                sender.uid,
                req.pid,
            )
        self.false_claims[sender.uid] += 1

    def _forget(self, address: bytes, reason: str) -> None:
        """Drop the trainer at ``address``; its open part of a trace fails with ``reason``."""
        self.registry.forget(address)
        self.kineto_builds.forget(address)
        if self.guard is not None:
            self.guard.release(address)
        self.tracker.fail_open(address, reason)

    def _still_safe(self, t: Trainer) -> bool:
        """Re-check a pending config's file just before delivery (a directory may have
        changed since the request); a failing one is not delivered and the trace says why."""
        pending = self.tracker.pending_output(t.address)
        if pending is None:
            return True
        trace_id, path, own_tmp = pending
        try:
            self._placement.check(path, Writer(t.uid, t.host_pid), own_tmp)
        except RequestError as e:
            self.tracker.fail_open(t.address, f"not delivered: {e}")
            self.audit.record(
                "deliver_trace",
                in_process(),
                error=e,
                trace_id=trace_id,
                processes=[AuditedProcess(t.pid, t.host_pid, t.uid, path)],
            )
            return False
        return True
