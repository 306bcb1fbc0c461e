from bpfdyno.rpc.v1 import diagnosis_pb2 as _diagnosis_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINER_STATE_UNSPECIFIED: _ClassVar[TrainerState]
    TRAINER_STATE_IDLE: _ClassVar[TrainerState]
    TRAINER_STATE_CONFIG_PENDING: _ClassVar[TrainerState]
    TRAINER_STATE_TRACING: _ClassVar[TrainerState]

class TrainerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINER_ROLE_UNSPECIFIED: _ClassVar[TrainerRole]
    TRAINER_ROLE_WORKER: _ClassVar[TrainerRole]
    TRAINER_ROLE_LAUNCHER: _ClassVar[TrainerRole]
    TRAINER_ROLE_DATA_WORKER: _ClassVar[TrainerRole]

class ProcessTraceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROCESS_TRACE_STATE_UNSPECIFIED: _ClassVar[ProcessTraceState]
    PROCESS_TRACE_STATE_PENDING: _ClassVar[ProcessTraceState]
    PROCESS_TRACE_STATE_DELIVERED: _ClassVar[ProcessTraceState]
    PROCESS_TRACE_STATE_TRACING: _ClassVar[ProcessTraceState]
    PROCESS_TRACE_STATE_WRITTEN: _ClassVar[ProcessTraceState]
    PROCESS_TRACE_STATE_FAILED: _ClassVar[ProcessTraceState]
    PROCESS_TRACE_STATE_TIMED_OUT: _ClassVar[ProcessTraceState]
    PROCESS_TRACE_STATE_MERGING: _ClassVar[ProcessTraceState]
TRAINER_STATE_UNSPECIFIED: TrainerState
TRAINER_STATE_IDLE: TrainerState
TRAINER_STATE_CONFIG_PENDING: TrainerState
TRAINER_STATE_TRACING: TrainerState
TRAINER_ROLE_UNSPECIFIED: TrainerRole
TRAINER_ROLE_WORKER: TrainerRole
TRAINER_ROLE_LAUNCHER: TrainerRole
TRAINER_ROLE_DATA_WORKER: TrainerRole
PROCESS_TRACE_STATE_UNSPECIFIED: ProcessTraceState
PROCESS_TRACE_STATE_PENDING: ProcessTraceState
PROCESS_TRACE_STATE_DELIVERED: ProcessTraceState
PROCESS_TRACE_STATE_TRACING: ProcessTraceState
PROCESS_TRACE_STATE_WRITTEN: ProcessTraceState
PROCESS_TRACE_STATE_FAILED: ProcessTraceState
PROCESS_TRACE_STATE_TIMED_OUT: ProcessTraceState
PROCESS_TRACE_STATE_MERGING: ProcessTraceState

class ListTrainersRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class Trainer(_message.Message):
    __slots__ = ("pid", "ancestors", "job_id", "first_poll_unix_seconds", "last_poll_unix_seconds", "polls", "state", "role", "endpoint", "trace_id", "uid", "host_pid", "job_name")
    PID_FIELD_NUMBER: _ClassVar[int]
    ANCESTORS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_POLL_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_POLL_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    POLLS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    HOST_PID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    pid: int
    ancestors: _containers.RepeatedScalarFieldContainer[int]
    job_id: int
    first_poll_unix_seconds: float
    last_poll_unix_seconds: float
    polls: int
    state: TrainerState
    role: TrainerRole
    endpoint: str
    trace_id: str
    uid: int
    host_pid: int
    job_name: str
    def __init__(self, pid: _Optional[int] = ..., ancestors: _Optional[_Iterable[int]] = ..., job_id: _Optional[int] = ..., first_poll_unix_seconds: _Optional[float] = ..., last_poll_unix_seconds: _Optional[float] = ..., polls: _Optional[int] = ..., state: _Optional[_Union[TrainerState, str]] = ..., role: _Optional[_Union[TrainerRole, str]] = ..., endpoint: _Optional[str] = ..., trace_id: _Optional[str] = ..., uid: _Optional[int] = ..., host_pid: _Optional[int] = ..., job_name: _Optional[str] = ...) -> None: ...

class ListTrainersResponse(_message.Message):
    __slots__ = ("trainers",)
    TRAINERS_FIELD_NUMBER: _ClassVar[int]
    trainers: _containers.RepeatedCompositeFieldContainer[Trainer]
    def __init__(self, trainers: _Optional[_Iterable[_Union[Trainer, _Mapping]]] = ...) -> None: ...

class StartTraceRequest(_message.Message):
    __slots__ = ("job_id", "pids", "log_file", "duration_ms", "iterations", "profile_start_time_ms", "profile_start_iteration_roundup", "record_shapes", "profile_memory", "with_stacks", "with_flops", "with_modules", "process_limit", "timeout_seconds", "kernel_tracks", "pre_window_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    LOG_FILE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_START_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_START_ITERATION_ROUNDUP_FIELD_NUMBER: _ClassVar[int]
    RECORD_SHAPES_FIELD_NUMBER: _ClassVar[int]
    PROFILE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    WITH_STACKS_FIELD_NUMBER: _ClassVar[int]
    WITH_FLOPS_FIELD_NUMBER: _ClassVar[int]
    WITH_MODULES_FIELD_NUMBER: _ClassVar[int]
    PROCESS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TRACKS_FIELD_NUMBER: _ClassVar[int]
    PRE_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    pids: _containers.RepeatedScalarFieldContainer[int]
    log_file: str
    duration_ms: int
    iterations: int
    profile_start_time_ms: int
    profile_start_iteration_roundup: int
    record_shapes: bool
    profile_memory: bool
    with_stacks: bool
    with_flops: bool
    with_modules: bool
    process_limit: int
    timeout_seconds: float
    kernel_tracks: str
    pre_window_seconds: float
    def __init__(self, job_id: _Optional[int] = ..., pids: _Optional[_Iterable[int]] = ..., log_file: _Optional[str] = ..., duration_ms: _Optional[int] = ..., iterations: _Optional[int] = ..., profile_start_time_ms: _Optional[int] = ..., profile_start_iteration_roundup: _Optional[int] = ..., record_shapes: _Optional[bool] = ..., profile_memory: _Optional[bool] = ..., with_stacks: _Optional[bool] = ..., with_flops: _Optional[bool] = ..., with_modules: _Optional[bool] = ..., process_limit: _Optional[int] = ..., timeout_seconds: _Optional[float] = ..., kernel_tracks: _Optional[str] = ..., pre_window_seconds: _Optional[float] = ...) -> None: ...

class TriggeredProcess(_message.Message):
    __slots__ = ("pid", "job_id", "output_path")
    PID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PATH_FIELD_NUMBER: _ClassVar[int]
    pid: int
    job_id: int
    output_path: str
    def __init__(self, pid: _Optional[int] = ..., job_id: _Optional[int] = ..., output_path: _Optional[str] = ...) -> None: ...

class SkippedProcess(_message.Message):
    __slots__ = ("pid", "job_id", "reason")
    PID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    pid: int
    job_id: int
    reason: str
    def __init__(self, pid: _Optional[int] = ..., job_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class StartTraceResponse(_message.Message):
    __slots__ = ("trace_id", "processes_matched", "triggered", "busy", "over_limit", "not_matched", "config_text")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_MATCHED_FIELD_NUMBER: _ClassVar[int]
    TRIGGERED_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    OVER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    NOT_MATCHED_FIELD_NUMBER: _ClassVar[int]
    CONFIG_TEXT_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    processes_matched: _containers.RepeatedScalarFieldContainer[int]
    triggered: _containers.RepeatedCompositeFieldContainer[TriggeredProcess]
    busy: _containers.RepeatedCompositeFieldContainer[SkippedProcess]
    over_limit: _containers.RepeatedCompositeFieldContainer[SkippedProcess]
    not_matched: _containers.RepeatedCompositeFieldContainer[SkippedProcess]
    config_text: str
    def __init__(self, trace_id: _Optional[str] = ..., processes_matched: _Optional[_Iterable[int]] = ..., triggered: _Optional[_Iterable[_Union[TriggeredProcess, _Mapping]]] = ..., busy: _Optional[_Iterable[_Union[SkippedProcess, _Mapping]]] = ..., over_limit: _Optional[_Iterable[_Union[SkippedProcess, _Mapping]]] = ..., not_matched: _Optional[_Iterable[_Union[SkippedProcess, _Mapping]]] = ..., config_text: _Optional[str] = ...) -> None: ...

class GetTraceRequest(_message.Message):
    __slots__ = ("trace_id",)
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    def __init__(self, trace_id: _Optional[str] = ...) -> None: ...

class KernelTracks(_message.Message):
    __slots__ = ("requested", "state", "merged", "events", "lost", "reason")
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    requested: _containers.RepeatedScalarFieldContainer[str]
    state: str
    merged: _containers.RepeatedScalarFieldContainer[str]
    events: int
    lost: int
    reason: str
    def __init__(self, requested: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., merged: _Optional[_Iterable[str]] = ..., events: _Optional[int] = ..., lost: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ProcessTrace(_message.Message):
    __slots__ = ("pid", "job_id", "output_path", "state", "reason", "size_bytes", "updated_unix_seconds", "config_dropped", "kernel_tracks")
    PID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PATH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_DROPPED_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TRACKS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    job_id: int
    output_path: str
    state: ProcessTraceState
    reason: str
    size_bytes: int
    updated_unix_seconds: float
    config_dropped: bool
    kernel_tracks: KernelTracks
    def __init__(self, pid: _Optional[int] = ..., job_id: _Optional[int] = ..., output_path: _Optional[str] = ..., state: _Optional[_Union[ProcessTraceState, str]] = ..., reason: _Optional[str] = ..., size_bytes: _Optional[int] = ..., updated_unix_seconds: _Optional[float] = ..., config_dropped: _Optional[bool] = ..., kernel_tracks: _Optional[_Union[KernelTracks, _Mapping]] = ...) -> None: ...

class TraceStatus(_message.Message):
    __slots__ = ("trace_id", "created_unix_seconds", "deadline_unix_seconds", "iteration_mode", "processes", "done")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_MODE_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    created_unix_seconds: float
    deadline_unix_seconds: float
    iteration_mode: bool
    processes: _containers.RepeatedCompositeFieldContainer[ProcessTrace]
    done: bool
    def __init__(self, trace_id: _Optional[str] = ..., created_unix_seconds: _Optional[float] = ..., deadline_unix_seconds: _Optional[float] = ..., iteration_mode: _Optional[bool] = ..., processes: _Optional[_Iterable[_Union[ProcessTrace, _Mapping]]] = ..., done: _Optional[bool] = ...) -> None: ...

class DcgmPauseRequest(_message.Message):
    __slots__ = ("duration_s",)
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    duration_s: int
    def __init__(self, duration_s: _Optional[int] = ...) -> None: ...

class DcgmResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DcgmResponse(_message.Message):
    __slots__ = ("status", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: bool
    reason: str
    def __init__(self, status: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ProcessSummary(_message.Message):
    __slots__ = ("pid", "path", "rank", "trace_id", "window_start_unix_seconds", "window_seconds", "pytorch_op_seconds", "kernel_tracks", "net_sent_bytes", "net_received_bytes", "net_calls", "tcp_retransmits", "tcp_resets", "packet_drops", "offcpu_runnable_seconds", "offcpu_blocked_seconds", "blocked_seconds_by_cause", "main_thread_runnable_seconds", "main_thread_blocked_seconds", "nccl_calls", "nccl_seconds", "kernel_records_lost", "error", "evidence", "offcpu_threads", "gpu_busy_seconds")
    class BlockedSecondsByCauseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PYTORCH_OP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TRACKS_FIELD_NUMBER: _ClassVar[int]
    NET_SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    NET_RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NET_CALLS_FIELD_NUMBER: _ClassVar[int]
    TCP_RETRANSMITS_FIELD_NUMBER: _ClassVar[int]
    TCP_RESETS_FIELD_NUMBER: _ClassVar[int]
    PACKET_DROPS_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_RUNNABLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_BLOCKED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_SECONDS_BY_CAUSE_FIELD_NUMBER: _ClassVar[int]
    MAIN_THREAD_RUNNABLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAIN_THREAD_BLOCKED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NCCL_CALLS_FIELD_NUMBER: _ClassVar[int]
    NCCL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_RECORDS_LOST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_THREADS_FIELD_NUMBER: _ClassVar[int]
    GPU_BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    path: str
    rank: int
    trace_id: str
    window_start_unix_seconds: float
    window_seconds: float
    pytorch_op_seconds: float
    kernel_tracks: _containers.RepeatedScalarFieldContainer[str]
    net_sent_bytes: int
    net_received_bytes: int
    net_calls: int
    tcp_retransmits: int
    tcp_resets: int
    packet_drops: int
    offcpu_runnable_seconds: float
    offcpu_blocked_seconds: float
    blocked_seconds_by_cause: _containers.ScalarMap[str, float]
    main_thread_runnable_seconds: float
    main_thread_blocked_seconds: float
    nccl_calls: int
    nccl_seconds: float
    kernel_records_lost: int
    error: str
    evidence: _diagnosis_pb2.RankEvidence
    offcpu_threads: int
    gpu_busy_seconds: float
    def __init__(self, pid: _Optional[int] = ..., path: _Optional[str] = ..., rank: _Optional[int] = ..., trace_id: _Optional[str] = ..., window_start_unix_seconds: _Optional[float] = ..., window_seconds: _Optional[float] = ..., pytorch_op_seconds: _Optional[float] = ..., kernel_tracks: _Optional[_Iterable[str]] = ..., net_sent_bytes: _Optional[int] = ..., net_received_bytes: _Optional[int] = ..., net_calls: _Optional[int] = ..., tcp_retransmits: _Optional[int] = ..., tcp_resets: _Optional[int] = ..., packet_drops: _Optional[int] = ..., offcpu_runnable_seconds: _Optional[float] = ..., offcpu_blocked_seconds: _Optional[float] = ..., blocked_seconds_by_cause: _Optional[_Mapping[str, float]] = ..., main_thread_runnable_seconds: _Optional[float] = ..., main_thread_blocked_seconds: _Optional[float] = ..., nccl_calls: _Optional[int] = ..., nccl_seconds: _Optional[float] = ..., kernel_records_lost: _Optional[int] = ..., error: _Optional[str] = ..., evidence: _Optional[_Union[_diagnosis_pb2.RankEvidence, _Mapping]] = ..., offcpu_threads: _Optional[int] = ..., gpu_busy_seconds: _Optional[float] = ...) -> None: ...

class TraceSummary(_message.Message):
    __slots__ = ("trace_id", "processes", "verdict")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    processes: _containers.RepeatedCompositeFieldContainer[ProcessSummary]
    verdict: _diagnosis_pb2.Verdict
    def __init__(self, trace_id: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[ProcessSummary, _Mapping]]] = ..., verdict: _Optional[_Union[_diagnosis_pb2.Verdict, _Mapping]] = ...) -> None: ...
