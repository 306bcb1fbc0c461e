from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListProcessesRequest(_message.Message):
    __slots__ = ("sort_by", "limit", "filter")
    SORT_BY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    sort_by: str
    limit: int
    filter: str
    def __init__(self, sort_by: _Optional[str] = ..., limit: _Optional[int] = ..., filter: _Optional[str] = ...) -> None: ...

class ProcessRow(_message.Message):
    __slots__ = ("pid", "ppid", "comm", "cmdline", "uid", "user", "state", "num_threads", "start_unix_seconds", "cpu_ratio", "rss_bytes", "oncpu_ns", "offcpu_runnable_ns", "offcpu_blocked_ns", "runq_wait_ns", "oncpu_ratio", "runq_wait_ratio", "offcpu_blocked_ratio", "tcp_tx_bytes", "tcp_rx_bytes", "udp_tx_bytes", "udp_rx_bytes", "tcp_retransmits", "tcp_tx_bytes_per_second", "tcp_rx_bytes_per_second", "udp_tx_bytes_per_second", "udp_rx_bytes_per_second", "tcp_retransmits_per_second", "cgroup", "container_id", "k8s_pod_uid", "slurm_job_id", "gpu_memory_bytes", "pinned", "k8s_namespace", "k8s_pod", "k8s_container", "ns_pid")
    PID_FIELD_NUMBER: _ClassVar[int]
    PPID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    CMDLINE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_THREADS_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_RATIO_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    ONCPU_NS_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_RUNNABLE_NS_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_BLOCKED_NS_FIELD_NUMBER: _ClassVar[int]
    RUNQ_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    ONCPU_RATIO_FIELD_NUMBER: _ClassVar[int]
    RUNQ_WAIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_BLOCKED_RATIO_FIELD_NUMBER: _ClassVar[int]
    TCP_TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TCP_RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    UDP_TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    UDP_RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TCP_RETRANSMITS_FIELD_NUMBER: _ClassVar[int]
    TCP_TX_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TCP_RX_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    UDP_TX_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    UDP_RX_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TCP_RETRANSMITS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    K8S_POD_UID_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    K8S_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    K8S_POD_FIELD_NUMBER: _ClassVar[int]
    K8S_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    NS_PID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    ppid: int
    comm: str
    cmdline: str
    uid: int
    user: str
    state: str
    num_threads: int
    start_unix_seconds: float
    cpu_ratio: float
    rss_bytes: int
    oncpu_ns: int
    offcpu_runnable_ns: int
    offcpu_blocked_ns: int
    runq_wait_ns: int
    oncpu_ratio: float
    runq_wait_ratio: float
    offcpu_blocked_ratio: float
    tcp_tx_bytes: int
    tcp_rx_bytes: int
    udp_tx_bytes: int
    udp_rx_bytes: int
    tcp_retransmits: int
    tcp_tx_bytes_per_second: float
    tcp_rx_bytes_per_second: float
    udp_tx_bytes_per_second: float
    udp_rx_bytes_per_second: float
    tcp_retransmits_per_second: float
    cgroup: str
    container_id: str
    k8s_pod_uid: str
    slurm_job_id: str
    gpu_memory_bytes: int
    pinned: bool
    k8s_namespace: str
    k8s_pod: str
    k8s_container: str
    ns_pid: int
    def __init__(self, pid: _Optional[int] = ..., ppid: _Optional[int] = ..., comm: _Optional[str] = ..., cmdline: _Optional[str] = ..., uid: _Optional[int] = ..., user: _Optional[str] = ..., state: _Optional[str] = ..., num_threads: _Optional[int] = ..., start_unix_seconds: _Optional[float] = ..., cpu_ratio: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., oncpu_ns: _Optional[int] = ..., offcpu_runnable_ns: _Optional[int] = ..., offcpu_blocked_ns: _Optional[int] = ..., runq_wait_ns: _Optional[int] = ..., oncpu_ratio: _Optional[float] = ..., runq_wait_ratio: _Optional[float] = ..., offcpu_blocked_ratio: _Optional[float] = ..., tcp_tx_bytes: _Optional[int] = ..., tcp_rx_bytes: _Optional[int] = ..., udp_tx_bytes: _Optional[int] = ..., udp_rx_bytes: _Optional[int] = ..., tcp_retransmits: _Optional[int] = ..., tcp_tx_bytes_per_second: _Optional[float] = ..., tcp_rx_bytes_per_second: _Optional[float] = ..., udp_tx_bytes_per_second: _Optional[float] = ..., udp_rx_bytes_per_second: _Optional[float] = ..., tcp_retransmits_per_second: _Optional[float] = ..., cgroup: _Optional[str] = ..., container_id: _Optional[str] = ..., k8s_pod_uid: _Optional[str] = ..., slurm_job_id: _Optional[str] = ..., gpu_memory_bytes: _Optional[int] = ..., pinned: _Optional[bool] = ..., k8s_namespace: _Optional[str] = ..., k8s_pod: _Optional[str] = ..., k8s_container: _Optional[str] = ..., ns_pid: _Optional[int] = ...) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ("processes", "unix_seconds", "total_processes", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessRow]
    unix_seconds: float
    total_processes: int
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessRow, _Mapping]]] = ..., unix_seconds: _Optional[float] = ..., total_processes: _Optional[int] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListConnectionsRequest(_message.Message):
    __slots__ = ("pid", "state")
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    state: str
    def __init__(self, pid: _Optional[int] = ..., state: _Optional[str] = ...) -> None: ...

class TcpConnection(_message.Message):
    __slots__ = ("pid", "comm", "family", "saddr", "sport", "daddr", "dport", "state", "tx_bytes", "rx_bytes", "retransmits", "srtt_seconds", "snd_cwnd", "established_unix_ns", "passive")
    PID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    SADDR_FIELD_NUMBER: _ClassVar[int]
    SPORT_FIELD_NUMBER: _ClassVar[int]
    DADDR_FIELD_NUMBER: _ClassVar[int]
    DPORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETRANSMITS_FIELD_NUMBER: _ClassVar[int]
    SRTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SND_CWND_FIELD_NUMBER: _ClassVar[int]
    ESTABLISHED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PASSIVE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    comm: str
    family: str
    saddr: str
    sport: int
    daddr: str
    dport: int
    state: str
    tx_bytes: int
    rx_bytes: int
    retransmits: int
    srtt_seconds: float
    snd_cwnd: int
    established_unix_ns: int
    passive: bool
    def __init__(self, pid: _Optional[int] = ..., comm: _Optional[str] = ..., family: _Optional[str] = ..., saddr: _Optional[str] = ..., sport: _Optional[int] = ..., daddr: _Optional[str] = ..., dport: _Optional[int] = ..., state: _Optional[str] = ..., tx_bytes: _Optional[int] = ..., rx_bytes: _Optional[int] = ..., retransmits: _Optional[int] = ..., srtt_seconds: _Optional[float] = ..., snd_cwnd: _Optional[int] = ..., established_unix_ns: _Optional[int] = ..., passive: _Optional[bool] = ...) -> None: ...

class ListConnectionsResponse(_message.Message):
    __slots__ = ("connections",)
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    connections: _containers.RepeatedCompositeFieldContainer[TcpConnection]
    def __init__(self, connections: _Optional[_Iterable[_Union[TcpConnection, _Mapping]]] = ...) -> None: ...

class GetEventsRequest(_message.Message):
    __slots__ = ("since_unix_ns", "kinds", "limit")
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    since_unix_ns: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(self, since_unix_ns: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ...) -> None: ...

class EventAttrValue(_message.Message):
    __slots__ = ("int_value", "double_value", "string_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    double_value: float
    string_value: str
    def __init__(self, int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ...) -> None: ...

class KernelEvent(_message.Message):
    __slots__ = ("unix_ns", "kind", "pid", "tid", "comm", "attrs")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: EventAttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[EventAttrValue, _Mapping]] = ...) -> None: ...
    UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    unix_ns: int
    kind: str
    pid: int
    tid: int
    comm: str
    attrs: _containers.MessageMap[str, EventAttrValue]
    def __init__(self, unix_ns: _Optional[int] = ..., kind: _Optional[str] = ..., pid: _Optional[int] = ..., tid: _Optional[int] = ..., comm: _Optional[str] = ..., attrs: _Optional[_Mapping[str, EventAttrValue]] = ...) -> None: ...

class GetEventsResponse(_message.Message):
    __slots__ = ("events", "evicted_age", "evicted_memory", "oldest_unix_ns")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_AGE_FIELD_NUMBER: _ClassVar[int]
    EVICTED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[KernelEvent]
    evicted_age: int
    evicted_memory: int
    oldest_unix_ns: int
    def __init__(self, events: _Optional[_Iterable[_Union[KernelEvent, _Mapping]]] = ..., evicted_age: _Optional[int] = ..., evicted_memory: _Optional[int] = ..., oldest_unix_ns: _Optional[int] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("kinds",)
    KINDS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kinds: _Optional[_Iterable[str]] = ...) -> None: ...
