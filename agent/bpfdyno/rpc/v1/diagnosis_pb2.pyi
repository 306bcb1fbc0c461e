from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CauseTime(_message.Message):
    __slots__ = ("cause", "seconds", "detail")
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    cause: str
    seconds: float
    detail: str
    def __init__(self, cause: _Optional[str] = ..., seconds: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("cause", "ts_us", "start_unix_ns", "duration_ns", "detail", "tid", "path")
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    TS_US_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    cause: str
    ts_us: float
    start_unix_ns: int
    duration_ns: int
    detail: str
    tid: int
    path: str
    def __init__(self, cause: _Optional[str] = ..., ts_us: _Optional[float] = ..., start_unix_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., detail: _Optional[str] = ..., tid: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class CollectiveEvidence(_message.Message):
    __slots__ = ("op", "source", "group", "index", "step", "size_bytes", "arrival_unix_ns", "end_unix_ns", "before", "during", "holders", "worst", "loss_events", "fabric_congestion", "fabric_errors", "workers", "worker_pids", "nccl_seq")
    OP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    DURING_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WORST_FIELD_NUMBER: _ClassVar[int]
    LOSS_EVENTS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_CONGESTION_FIELD_NUMBER: _ClassVar[int]
    FABRIC_ERRORS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKER_PIDS_FIELD_NUMBER: _ClassVar[int]
    NCCL_SEQ_FIELD_NUMBER: _ClassVar[int]
    op: str
    source: str
    group: str
    index: int
    step: int
    size_bytes: int
    arrival_unix_ns: int
    end_unix_ns: int
    before: _containers.RepeatedCompositeFieldContainer[CauseTime]
    during: _containers.RepeatedCompositeFieldContainer[CauseTime]
    holders: _containers.RepeatedCompositeFieldContainer[CauseTime]
    worst: _containers.RepeatedCompositeFieldContainer[Instance]
    loss_events: int
    fabric_congestion: int
    fabric_errors: int
    workers: _containers.RepeatedCompositeFieldContainer[CauseTime]
    worker_pids: _containers.RepeatedScalarFieldContainer[int]
    nccl_seq: int
    def __init__(self, op: _Optional[str] = ..., source: _Optional[str] = ..., group: _Optional[str] = ..., index: _Optional[int] = ..., step: _Optional[int] = ..., size_bytes: _Optional[int] = ..., arrival_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ..., before: _Optional[_Iterable[_Union[CauseTime, _Mapping]]] = ..., during: _Optional[_Iterable[_Union[CauseTime, _Mapping]]] = ..., holders: _Optional[_Iterable[_Union[CauseTime, _Mapping]]] = ..., worst: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ..., loss_events: _Optional[int] = ..., fabric_congestion: _Optional[int] = ..., fabric_errors: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[CauseTime, _Mapping]]] = ..., worker_pids: _Optional[_Iterable[int]] = ..., nccl_seq: _Optional[int] = ...) -> None: ...

class LossEvent(_message.Message):
    __slots__ = ("kind", "ts_us", "unix_ns", "local", "peer")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TS_US_FIELD_NUMBER: _ClassVar[int]
    UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    kind: str
    ts_us: float
    unix_ns: int
    local: str
    peer: str
    def __init__(self, kind: _Optional[str] = ..., ts_us: _Optional[float] = ..., unix_ns: _Optional[int] = ..., local: _Optional[str] = ..., peer: _Optional[str] = ...) -> None: ...

class ConnectionRtt(_message.Message):
    __slots__ = ("local", "peer", "srtt_median_ms", "srtt_max_ms", "samples")
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    SRTT_MEDIAN_MS_FIELD_NUMBER: _ClassVar[int]
    SRTT_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    local: str
    peer: str
    srtt_median_ms: float
    srtt_max_ms: float
    samples: int
    def __init__(self, local: _Optional[str] = ..., peer: _Optional[str] = ..., srtt_median_ms: _Optional[float] = ..., srtt_max_ms: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class CpuQuota(_message.Message):
    __slots__ = ("cgroup", "quota_us", "period_us", "periods", "throttled_periods", "throttled_seconds")
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    QUOTA_US_FIELD_NUMBER: _ClassVar[int]
    PERIOD_US_FIELD_NUMBER: _ClassVar[int]
    PERIODS_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_PERIODS_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    cgroup: str
    quota_us: int
    period_us: int
    periods: int
    throttled_periods: int
    throttled_seconds: float
    def __init__(self, cgroup: _Optional[str] = ..., quota_us: _Optional[int] = ..., period_us: _Optional[int] = ..., periods: _Optional[int] = ..., throttled_periods: _Optional[int] = ..., throttled_seconds: _Optional[float] = ...) -> None: ...

class MemoryCgroup(_message.Message):
    __slots__ = ("cgroup", "limit_bytes", "limit_hits", "refaults", "major_faults", "stall_seconds")
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_HITS_FIELD_NUMBER: _ClassVar[int]
    REFAULTS_FIELD_NUMBER: _ClassVar[int]
    MAJOR_FAULTS_FIELD_NUMBER: _ClassVar[int]
    STALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    cgroup: str
    limit_bytes: int
    limit_hits: int
    refaults: int
    major_faults: int
    stall_seconds: float
    def __init__(self, cgroup: _Optional[str] = ..., limit_bytes: _Optional[int] = ..., limit_hits: _Optional[int] = ..., refaults: _Optional[int] = ..., major_faults: _Optional[int] = ..., stall_seconds: _Optional[float] = ...) -> None: ...

class StepSplit(_message.Message):
    __slots__ = ("steps", "step_seconds", "parts")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    step_seconds: float
    parts: _containers.RepeatedCompositeFieldContainer[CauseTime]
    def __init__(self, steps: _Optional[int] = ..., step_seconds: _Optional[float] = ..., parts: _Optional[_Iterable[_Union[CauseTime, _Mapping]]] = ...) -> None: ...

class RankEvidence(_message.Message):
    __slots__ = ("path", "host", "pid", "rank", "world_size", "base_ns", "window_start_unix_ns", "window_end_unix_ns", "kernel_tracks", "collectives", "local_addresses", "loss_events", "collective_net_bytes", "gpu_sm_clock_mhz", "steps", "notes", "fabric_devices", "connections", "cpu_quotas", "memory_cgroups", "sched_incomplete")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BASE_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TRACKS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    LOSS_EVENTS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_NET_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    FABRIC_DEVICES_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    CPU_QUOTAS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CGROUPS_FIELD_NUMBER: _ClassVar[int]
    SCHED_INCOMPLETE_FIELD_NUMBER: _ClassVar[int]
    path: str
    host: str
    pid: int
    rank: int
    world_size: int
    base_ns: int
    window_start_unix_ns: int
    window_end_unix_ns: int
    kernel_tracks: _containers.RepeatedScalarFieldContainer[str]
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveEvidence]
    local_addresses: _containers.RepeatedScalarFieldContainer[str]
    loss_events: _containers.RepeatedCompositeFieldContainer[LossEvent]
    collective_net_bytes: int
    gpu_sm_clock_mhz: float
    steps: StepSplit
    notes: _containers.RepeatedScalarFieldContainer[str]
    fabric_devices: _containers.RepeatedScalarFieldContainer[str]
    connections: _containers.RepeatedCompositeFieldContainer[ConnectionRtt]
    cpu_quotas: _containers.RepeatedCompositeFieldContainer[CpuQuota]
    memory_cgroups: _containers.RepeatedCompositeFieldContainer[MemoryCgroup]
    sched_incomplete: str
    def __init__(self, path: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., base_ns: _Optional[int] = ..., window_start_unix_ns: _Optional[int] = ..., window_end_unix_ns: _Optional[int] = ..., kernel_tracks: _Optional[_Iterable[str]] = ..., collectives: _Optional[_Iterable[_Union[CollectiveEvidence, _Mapping]]] = ..., local_addresses: _Optional[_Iterable[str]] = ..., loss_events: _Optional[_Iterable[_Union[LossEvent, _Mapping]]] = ..., collective_net_bytes: _Optional[int] = ..., gpu_sm_clock_mhz: _Optional[float] = ..., steps: _Optional[_Union[StepSplit, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ..., fabric_devices: _Optional[_Iterable[str]] = ..., connections: _Optional[_Iterable[_Union[ConnectionRtt, _Mapping]]] = ..., cpu_quotas: _Optional[_Iterable[_Union[CpuQuota, _Mapping]]] = ..., memory_cgroups: _Optional[_Iterable[_Union[MemoryCgroup, _Mapping]]] = ..., sched_incomplete: _Optional[str] = ...) -> None: ...

class RankTiming(_message.Message):
    __slots__ = ("rank", "host", "pid", "path", "collectives", "last", "held_seconds", "lateness_seconds", "collective_seconds", "step_seconds")
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    HELD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LATENESS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    host: str
    pid: int
    path: str
    collectives: int
    last: int
    held_seconds: float
    lateness_seconds: float
    collective_seconds: float
    step_seconds: float
    def __init__(self, rank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., path: _Optional[str] = ..., collectives: _Optional[int] = ..., last: _Optional[int] = ..., held_seconds: _Optional[float] = ..., lateness_seconds: _Optional[float] = ..., collective_seconds: _Optional[float] = ..., step_seconds: _Optional[float] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("rank", "host", "pid", "kind", "seconds", "share", "causes", "worst", "summary")
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    CAUSES_FIELD_NUMBER: _ClassVar[int]
    WORST_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    rank: int
    host: str
    pid: int
    kind: str
    seconds: float
    share: float
    causes: _containers.RepeatedCompositeFieldContainer[CauseTime]
    worst: _containers.RepeatedCompositeFieldContainer[Instance]
    summary: str
    def __init__(self, rank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., kind: _Optional[str] = ..., seconds: _Optional[float] = ..., share: _Optional[float] = ..., causes: _Optional[_Iterable[_Union[CauseTime, _Mapping]]] = ..., worst: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ..., summary: _Optional[str] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("headline", "stragglers", "within_noise", "job_time", "ranks", "compared_seconds", "matched", "notes")
    HEADLINE_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_FIELD_NUMBER: _ClassVar[int]
    WITHIN_NOISE_FIELD_NUMBER: _ClassVar[int]
    JOB_TIME_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    COMPARED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    headline: str
    stragglers: _containers.RepeatedCompositeFieldContainer[Finding]
    within_noise: bool
    job_time: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankTiming]
    compared_seconds: float
    matched: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, headline: _Optional[str] = ..., stragglers: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., within_noise: _Optional[bool] = ..., job_time: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[RankTiming, _Mapping]]] = ..., compared_seconds: _Optional[float] = ..., matched: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...
