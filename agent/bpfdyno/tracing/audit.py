"""The audit trail: one record per trace request (and per dcgm pause/resume), accepted or not.

Who asked (uid, user, the requesting pid where known), from where (entry point and peer),
what (job, pids, limit, the config), which processes it acted on (pid, owner, file) and the
decision (``accepted``, or ``refused`` with the rule). Every record goes

* to the daemon's log as one line, ``audit {json}``, on the logger ``bpfdyno.audit`` (the
  journal under systemd);
* when ``[tracing] audit_file`` is set, to that file as one JSON line (created 0600, opened
  for each record so log rotation needs no signal);
* to a bounded in-memory list (``[tracing] audit_records``) served by the gRPC ``Audit``
  service and ``bpfdyno audit``: root sees every record, other users their own.

Values come from requests, so records are JSON: no field can forge a line or a field.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from bpfdyno.core.errors import RequestError
from bpfdyno.core.identity import Requester
from bpfdyno.rpc.audit import AuditedProcess

log = logging.getLogger("bpfdyno.audit")

#: Longest config text kept in a record (a config is at most 32 KiB).
MAX_CONFIG_CHARS = 2048

ACCEPTED = "accepted"
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audited request.

    Attributes:
        seq: position in this daemon's audit trail (from 1).
        ts: wall-clock epoch seconds.
        action: ``start_trace``, ``deliver_trace`` (the check just before a config is
            handed out), ``dcgm_pause`` or ``dcgm_resume``.
        decision: ``accepted`` or ``refused``.
        rule: the rule a refusal names ("" when accepted).
        message: the refusal's message, or a summary.
        uid, user, transport, peer, requester_pid: who asked and from where.
        trace_id: the trace's id ("" when refused before one was issued).
        request: what was asked (job id, pids, limit, config...).
        processes: the processes it was handed to (accepted) or would have been.
        matched: every matched pid.
    """

    seq: int
    ts: float
    action: str
    decision: str
    rule: str
    message: str
    uid: int | None
    user: str
    transport: str
    peer: str
    requester_pid: int
    trace_id: str = ""
    request: dict[str, Any] = field(default_factory=dict)
    processes: tuple[AuditedProcess, ...] = ()
    matched: tuple[int, ...] = ()

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @property
    def ts_unix_seconds(self) -> float:
        """``ts`` by its name in the API (the record is sent as the API's by field name)."""
        return self.ts

    @property
    def request_json(self) -> str:
        """``request`` as the API carries it: a JSON object, keys sorted."""
        return orjson.dumps(self.request, option=orjson.OPT_SORT_KEYS).decode()


class AuditLog:
    """Where audit records go (see the module docstring).

    Args:
        max_records: records kept in memory.
        path: file to append JSON lines to ("" = none).
        wall: wall-clock time source.
    """

    def __init__(
        self, max_records: int = 1000, path: str = "", wall: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self._records: deque[AuditRecord] = deque(maxlen=max_records)
        self._wall = wall
        self._seq = 0
        #: Records that could not be appended to ``path``; the last error, for status.
        self.file_errors = 0
        self.last_file_error = ""

    def record(
        self,
        action: str,
        requester: Requester,
        *,
        error: RequestError | None = None,
        message: str = "",
        trace_id: str = "",
        request: dict[str, Any] | None = None,
        processes: Iterable[AuditedProcess] = (),
        matched: Iterable[int] = (),
    ) -> AuditRecord:
        """Record one decision: refused when ``error`` is given, else accepted."""
        self._seq += 1
        rec = AuditRecord(
            seq=self._seq,
            ts=self._wall(),
            action=action,
            decision=REFUSED if error is not None else ACCEPTED,
            rule=error.rule if error is not None else "",
            message=str(error) if error is not None else message,
            uid=requester.uid,
            user=requester.user,
            transport=requester.transport,
            peer=requester.peer,
            requester_pid=requester.pid,
            trace_id=trace_id,
            request=request or {},
            processes=tuple(processes),
            matched=tuple(matched),
        )
        self._records.append(rec)
        line = rec.to_json()
        log.info("audit %s", line.decode())
        if self.path:
            self._append(line)
        return rec

    def _append(self, line: bytes) -> None:
        try:
            fd = os.open(
                self.path,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            try:
                os.write(fd, line + b"\n")
            finally:
                os.close(fd)
        except OSError as e:
            self.file_errors += 1
            if self.last_file_error != e.strerror:
                log.error(
                    "cannot append to the audit file %s (%s); records stay in the log",
                    self.path,
                    e.strerror,
                )
            self.last_file_error = e.strerror or str(e)

    @contextlib.contextmanager
    def refusals(
        self, action: str, requester: Requester, request: dict[str, Any] | None = None
    ) -> Iterator[None]:
        """Record a `RequestError` raised in the block as ``action`` refused, and re-raise it."""
        try:
            yield
        except RequestError as e:
            self.record(action, requester, error=e, request=request)
            raise

    def records(self, uid: int | None, since_seq: int = 0, limit: int = 100) -> list[AuditRecord]:
        """The newest records after ``since_seq`` (oldest first), at most ``limit``.

        Args:
            uid: whose records: None for every record (root), else only that uid's.
        """
        out = [r for r in self._records if r.seq > since_seq and (uid is None or r.uid == uid)]
        return out[-limit:] if limit > 0 else out


def config_for_record(text: str) -> str:
    """A request's config text as kept in a record (bounded)."""
    if len(text) <= MAX_CONFIG_CHARS:
        return text
    return text[:MAX_CONFIG_CHARS] + f"... ({len(text)} characters)"
