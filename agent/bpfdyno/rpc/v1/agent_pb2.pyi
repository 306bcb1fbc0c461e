from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CollectorState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTOR_STATE_UNSPECIFIED: _ClassVar[CollectorState]
    COLLECTOR_STATE_STARTING: _ClassVar[CollectorState]
    COLLECTOR_STATE_OK: _ClassVar[CollectorState]
    COLLECTOR_STATE_DEGRADED: _ClassVar[CollectorState]
    COLLECTOR_STATE_UNAVAILABLE: _ClassVar[CollectorState]
    COLLECTOR_STATE_STOPPED: _ClassVar[CollectorState]
    COLLECTOR_STATE_DISABLED: _ClassVar[CollectorState]

class MetricKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    METRIC_KIND_UNSPECIFIED: _ClassVar[MetricKind]
    METRIC_KIND_GAUGE: _ClassVar[MetricKind]
    METRIC_KIND_RATE: _ClassVar[MetricKind]
    METRIC_KIND_RATIO: _ClassVar[MetricKind]
    METRIC_KIND_COUNTER: _ClassVar[MetricKind]
    METRIC_KIND_HISTOGRAM: _ClassVar[MetricKind]
COLLECTOR_STATE_UNSPECIFIED: CollectorState
COLLECTOR_STATE_STARTING: CollectorState
COLLECTOR_STATE_OK: CollectorState
COLLECTOR_STATE_DEGRADED: CollectorState
COLLECTOR_STATE_UNAVAILABLE: CollectorState
COLLECTOR_STATE_STOPPED: CollectorState
COLLECTOR_STATE_DISABLED: CollectorState
METRIC_KIND_UNSPECIFIED: MetricKind
METRIC_KIND_GAUGE: MetricKind
METRIC_KIND_RATE: MetricKind
METRIC_KIND_RATIO: MetricKind
METRIC_KIND_COUNTER: MetricKind
METRIC_KIND_HISTOGRAM: MetricKind

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectorStatus(_message.Message):
    __slots__ = ("name", "state", "reason", "interval_seconds", "collections", "errors", "last_duration_seconds", "last_success_unix_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    LAST_DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_SUCCESS_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: CollectorState
    reason: str
    interval_seconds: float
    collections: int
    errors: int
    last_duration_seconds: float
    last_success_unix_seconds: float
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[CollectorState, str]] = ..., reason: _Optional[str] = ..., interval_seconds: _Optional[float] = ..., collections: _Optional[int] = ..., errors: _Optional[int] = ..., last_duration_seconds: _Optional[float] = ..., last_success_unix_seconds: _Optional[float] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("version", "hostname", "kernel_release", "agent_uptime_seconds", "host_uptime_seconds", "pid", "config_source", "collectors", "started_unix_seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    KERNEL_RELEASE_FIELD_NUMBER: _ClassVar[int]
    AGENT_UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HOST_UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SOURCE_FIELD_NUMBER: _ClassVar[int]
    COLLECTORS_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: str
    hostname: str
    kernel_release: str
    agent_uptime_seconds: float
    host_uptime_seconds: float
    pid: int
    config_source: str
    collectors: _containers.RepeatedCompositeFieldContainer[CollectorStatus]
    started_unix_seconds: float
    def __init__(self, version: _Optional[str] = ..., hostname: _Optional[str] = ..., kernel_release: _Optional[str] = ..., agent_uptime_seconds: _Optional[float] = ..., host_uptime_seconds: _Optional[float] = ..., pid: _Optional[int] = ..., config_source: _Optional[str] = ..., collectors: _Optional[_Iterable[_Union[CollectorStatus, _Mapping]]] = ..., started_unix_seconds: _Optional[float] = ...) -> None: ...

class MetricSpec(_message.Message):
    __slots__ = ("name", "kind", "unit", "help", "labels", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: MetricKind
    unit: str
    help: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    source: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[MetricKind, str]] = ..., unit: _Optional[str] = ..., help: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ...) -> None: ...

class ListMetricSpecsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMetricSpecsResponse(_message.Message):
    __slots__ = ("specs",)
    SPECS_FIELD_NUMBER: _ClassVar[int]
    specs: _containers.RepeatedCompositeFieldContainer[MetricSpec]
    def __init__(self, specs: _Optional[_Iterable[_Union[MetricSpec, _Mapping]]] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ("unix_seconds", "value")
    UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    unix_seconds: float
    value: float
    def __init__(self, unix_seconds: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class Series(_message.Message):
    __slots__ = ("name", "labels", "points")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    points: _containers.RepeatedCompositeFieldContainer[Point]
    def __init__(self, name: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., points: _Optional[_Iterable[_Union[Point, _Mapping]]] = ...) -> None: ...

class GetMetricsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class MetricsSnapshot(_message.Message):
    __slots__ = ("unix_seconds", "collector", "series")
    UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTOR_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    unix_seconds: float
    collector: str
    series: _containers.RepeatedCompositeFieldContainer[Series]
    def __init__(self, unix_seconds: _Optional[float] = ..., collector: _Optional[str] = ..., series: _Optional[_Iterable[_Union[Series, _Mapping]]] = ...) -> None: ...

class GetMetricsWindowRequest(_message.Message):
    __slots__ = ("names", "start_unix_seconds", "end_unix_seconds")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    start_unix_seconds: float
    end_unix_seconds: float
    def __init__(self, names: _Optional[_Iterable[str]] = ..., start_unix_seconds: _Optional[float] = ..., end_unix_seconds: _Optional[float] = ...) -> None: ...

class MetricsWindow(_message.Message):
    __slots__ = ("series",)
    SERIES_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[Series]
    def __init__(self, series: _Optional[_Iterable[_Union[Series, _Mapping]]] = ...) -> None: ...

class StreamMetricsRequest(_message.Message):
    __slots__ = ("names", "collectors")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    COLLECTORS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    collectors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ..., collectors: _Optional[_Iterable[str]] = ...) -> None: ...

class GetClockRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Clock(_message.Message):
    __slots__ = ("receive_unix_seconds", "transmit_unix_seconds")
    RECEIVE_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRANSMIT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    receive_unix_seconds: float
    transmit_unix_seconds: float
    def __init__(self, receive_unix_seconds: _Optional[float] = ..., transmit_unix_seconds: _Optional[float] = ...) -> None: ...
