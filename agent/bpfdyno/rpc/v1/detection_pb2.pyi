from bpfdyno.rpc.v1 import diagnosis_pb2 as _diagnosis_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DetectionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DETECTION_KIND_UNSPECIFIED: _ClassVar[DetectionKind]
    DETECTION_KIND_SUSPECTED: _ClassVar[DetectionKind]
    DETECTION_KIND_CONFIRMED: _ClassVar[DetectionKind]
    DETECTION_KIND_CLEARED: _ClassVar[DetectionKind]
    DETECTION_KIND_HANG: _ClassVar[DetectionKind]
    DETECTION_KIND_TRACED: _ClassVar[DetectionKind]
DETECTION_KIND_UNSPECIFIED: DetectionKind
DETECTION_KIND_SUSPECTED: DetectionKind
DETECTION_KIND_CONFIRMED: DetectionKind
DETECTION_KIND_CLEARED: DetectionKind
DETECTION_KIND_HANG: DetectionKind
DETECTION_KIND_TRACED: DetectionKind

class SignalEvidence(_message.Message):
    __slots__ = ("name", "value", "job_median")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    JOB_MEDIAN_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    job_median: float
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., job_median: _Optional[float] = ...) -> None: ...

class ThreadReport(_message.Message):
    __slots__ = ("tid", "comm", "state", "syscall", "wchan", "waiting_on", "offcpu_seconds", "oncpu_share")
    TID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SYSCALL_FIELD_NUMBER: _ClassVar[int]
    WCHAN_FIELD_NUMBER: _ClassVar[int]
    WAITING_ON_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ONCPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    tid: int
    comm: str
    state: str
    syscall: str
    wchan: str
    waiting_on: str
    offcpu_seconds: float
    oncpu_share: float
    def __init__(self, tid: _Optional[int] = ..., comm: _Optional[str] = ..., state: _Optional[str] = ..., syscall: _Optional[str] = ..., wchan: _Optional[str] = ..., waiting_on: _Optional[str] = ..., offcpu_seconds: _Optional[float] = ..., oncpu_share: _Optional[float] = ...) -> None: ...

class DetectionEvent(_message.Message):
    __slots__ = ("kind", "job_id", "rank", "pid", "host", "unix_seconds", "summary", "evidence", "hang_state", "threads", "trace_id", "trace_files", "verdict_text", "verdict")
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    HANG_STATE_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_FILES_FIELD_NUMBER: _ClassVar[int]
    VERDICT_TEXT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    kind: DetectionKind
    job_id: str
    rank: int
    pid: int
    host: str
    unix_seconds: float
    summary: str
    evidence: _containers.RepeatedCompositeFieldContainer[SignalEvidence]
    hang_state: str
    threads: _containers.RepeatedCompositeFieldContainer[ThreadReport]
    trace_id: str
    trace_files: _containers.RepeatedScalarFieldContainer[str]
    verdict_text: str
    verdict: _diagnosis_pb2.Verdict
    def __init__(self, kind: _Optional[_Union[DetectionKind, str]] = ..., job_id: _Optional[str] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ..., host: _Optional[str] = ..., unix_seconds: _Optional[float] = ..., summary: _Optional[str] = ..., evidence: _Optional[_Iterable[_Union[SignalEvidence, _Mapping]]] = ..., hang_state: _Optional[str] = ..., threads: _Optional[_Iterable[_Union[ThreadReport, _Mapping]]] = ..., trace_id: _Optional[str] = ..., trace_files: _Optional[_Iterable[str]] = ..., verdict_text: _Optional[str] = ..., verdict: _Optional[_Union[_diagnosis_pb2.Verdict, _Mapping]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[DetectionEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[DetectionEvent, _Mapping]]] = ...) -> None: ...

class RankSignal(_message.Message):
    __slots__ = ("job_id", "rank", "pid", "host", "end_unix_seconds", "interval_seconds", "oncpu_seconds", "runq_wait_seconds", "main_waiting_seconds", "throttled_seconds", "io_bytes", "in_collective_seconds", "late_seconds", "peer_wait_seconds", "net_links", "net_links_known", "arrivals", "arrivals_known", "interrupt_seconds", "interrupt_cpu")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ONCPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUNQ_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAIN_WAITING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IO_BYTES_FIELD_NUMBER: _ClassVar[int]
    IN_COLLECTIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEER_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NET_LINKS_FIELD_NUMBER: _ClassVar[int]
    NET_LINKS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    ARRIVALS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_CPU_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    pid: int
    host: str
    end_unix_seconds: float
    interval_seconds: float
    oncpu_seconds: float
    runq_wait_seconds: float
    main_waiting_seconds: float
    throttled_seconds: float
    io_bytes: int
    in_collective_seconds: float
    late_seconds: float
    peer_wait_seconds: float
    net_links: _containers.RepeatedCompositeFieldContainer[NetLink]
    net_links_known: bool
    arrivals: _containers.RepeatedCompositeFieldContainer[CommArrivals]
    arrivals_known: bool
    interrupt_seconds: float
    interrupt_cpu: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ..., host: _Optional[str] = ..., end_unix_seconds: _Optional[float] = ..., interval_seconds: _Optional[float] = ..., oncpu_seconds: _Optional[float] = ..., runq_wait_seconds: _Optional[float] = ..., main_waiting_seconds: _Optional[float] = ..., throttled_seconds: _Optional[float] = ..., io_bytes: _Optional[int] = ..., in_collective_seconds: _Optional[float] = ..., late_seconds: _Optional[float] = ..., peer_wait_seconds: _Optional[float] = ..., net_links: _Optional[_Iterable[_Union[NetLink, _Mapping]]] = ..., net_links_known: _Optional[bool] = ..., arrivals: _Optional[_Iterable[_Union[CommArrivals, _Mapping]]] = ..., arrivals_known: _Optional[bool] = ..., interrupt_seconds: _Optional[float] = ..., interrupt_cpu: _Optional[int] = ...) -> None: ...

class CommArrivals(_message.Message):
    __slots__ = ("comm_hash", "comm_ranks", "seq_deltas", "arrival_deltas")
    COMM_HASH_FIELD_NUMBER: _ClassVar[int]
    COMM_RANKS_FIELD_NUMBER: _ClassVar[int]
    SEQ_DELTAS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_DELTAS_FIELD_NUMBER: _ClassVar[int]
    comm_hash: int
    comm_ranks: int
    seq_deltas: _containers.RepeatedScalarFieldContainer[int]
    arrival_deltas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, comm_hash: _Optional[int] = ..., comm_ranks: _Optional[int] = ..., seq_deltas: _Optional[_Iterable[int]] = ..., arrival_deltas: _Optional[_Iterable[int]] = ...) -> None: ...

class GetRankSignalsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetRankSignalsResponse(_message.Message):
    __slots__ = ("signals",)
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    signals: _containers.RepeatedCompositeFieldContainer[RankSignal]
    def __init__(self, signals: _Optional[_Iterable[_Union[RankSignal, _Mapping]]] = ...) -> None: ...

class NetLink(_message.Message):
    __slots__ = ("local_address", "remote_address", "srtt_seconds", "retransmits", "moved_bytes", "seconds", "retransmits_unknown", "sent_bytes")
    LOCAL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SRTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETRANSMITS_FIELD_NUMBER: _ClassVar[int]
    MOVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETRANSMITS_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    local_address: str
    remote_address: str
    srtt_seconds: float
    retransmits: int
    moved_bytes: int
    seconds: float
    retransmits_unknown: bool
    sent_bytes: int
    def __init__(self, local_address: _Optional[str] = ..., remote_address: _Optional[str] = ..., srtt_seconds: _Optional[float] = ..., retransmits: _Optional[int] = ..., moved_bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., retransmits_unknown: _Optional[bool] = ..., sent_bytes: _Optional[int] = ...) -> None: ...
