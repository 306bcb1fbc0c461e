from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListAuditRecordsRequest(_message.Message):
    __slots__ = ("since_seq", "limit")
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    since_seq: int
    limit: int
    def __init__(self, since_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class AuditedProcess(_message.Message):
    __slots__ = ("pid", "host_pid", "uid", "output_path")
    PID_FIELD_NUMBER: _ClassVar[int]
    HOST_PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PATH_FIELD_NUMBER: _ClassVar[int]
    pid: int
    host_pid: int
    uid: int
    output_path: str
    def __init__(self, pid: _Optional[int] = ..., host_pid: _Optional[int] = ..., uid: _Optional[int] = ..., output_path: _Optional[str] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("seq", "ts_unix_seconds", "action", "decision", "rule", "message", "uid", "user", "transport", "peer", "requester_pid", "trace_id", "request_json", "processes", "matched")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_PID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ts_unix_seconds: float
    action: str
    decision: str
    rule: str
    message: str
    uid: int
    user: str
    transport: str
    peer: str
    requester_pid: int
    trace_id: str
    request_json: str
    processes: _containers.RepeatedCompositeFieldContainer[AuditedProcess]
    matched: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seq: _Optional[int] = ..., ts_unix_seconds: _Optional[float] = ..., action: _Optional[str] = ..., decision: _Optional[str] = ..., rule: _Optional[str] = ..., message: _Optional[str] = ..., uid: _Optional[int] = ..., user: _Optional[str] = ..., transport: _Optional[str] = ..., peer: _Optional[str] = ..., requester_pid: _Optional[int] = ..., trace_id: _Optional[str] = ..., request_json: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[AuditedProcess, _Mapping]]] = ..., matched: _Optional[_Iterable[int]] = ...) -> None: ...

class ListAuditRecordsResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ...) -> None: ...
