"""The Audit service's records (``audit.proto``): who asked for which traces, and the answer."""

from __future__ import annotations

from bpfdyno.rpc.v1 import audit_pb2 as pb
from bpfdyno.rpc.wire import record


@record(pb.AuditedProcess)
class AuditedProcess:
    """A process a request acted on: its pid (as the request names it), its pid in the
    agent's namespace (0 if unknown), its owner (None if unknown) and the file it writes."""

    pid: int
    host_pid: int
    uid: int | None
    output_path: str


@record(pb.AuditRecord)
class AuditRecord:
    """One audited request (see ``audit.proto`` for each field)."""

    seq: int
    ts_unix_seconds: float = 0.0
    action: str = ""
    decision: str = ""
    rule: str = ""
    message: str = ""
    uid: int | None = None
    user: str = ""
    transport: str = ""
    peer: str = ""
    requester_pid: int = 0
    trace_id: str = ""
    request_json: str = ""
    processes: tuple[AuditedProcess, ...] = ()
    matched: tuple[int, ...] = ()
