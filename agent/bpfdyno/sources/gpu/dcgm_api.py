"""A minimal ctypes binding of the DCGM C API (``dcgm_agent.h``).

Only what the ``dcgm`` collector needs: start an embedded host engine or connect to a running
``nv-hostengine`` (standalone mode), watch a field group on a group of GPUs, read the latest
values per GPU, pause/resume profiling. The structure
layouts and constants mirror ``dcgm_structs.h`` / ``dcgm_fields.h`` (DCGM 3 and 4 share them).
Every call returning an error raises `DcgmError` with DCGM's own error text.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

#: dcgmReturn_t values the collector reacts to (dcgm_structs.h).
ST_OK = 0
ST_NOT_SUPPORTED = -6
ST_CONNECTION_NOT_VALID = -21
ST_MODULE_NOT_LOADED = -33
ST_PROFILING_NOT_SUPPORTED = -36

OPERATION_MODE_AUTO = 1  # DCGM_OPERATION_MODE_AUTO: the engine samples on its own timer
GROUP_EMPTY = 1  # DCGM_GROUP_EMPTY
MAX_NUM_DEVICES = 32  # DCGM_MAX_NUM_DEVICES (DCGM 2.0 and newer)
MAX_STR_LENGTH = 256
MAX_BLOB_LENGTH = 4096

FT_DOUBLE = ord("d")  # DCGM_FT_DOUBLE
FT_INT64 = ord("i")  # DCGM_FT_INT64
#: Values at or above these are "blank" (no data, not found, not supported, no permission).
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0  # 2**47

#: Profiling fields start here (DCGM_FI_PROF_GR_ENGINE_ACTIVE); they need the profiling module.
FIRST_PROF_FIELD = 1001

Handle = ctypes.c_size_t  # dcgmHandle_t, dcgmGpuGrp_t, dcgmFieldGrp_t are uintptr_t


class _Value(ctypes.Union):
    _fields_ = (
        ("i64", ctypes.c_int64),
        ("dbl", ctypes.c_double),
        ("str", ctypes.c_char * MAX_STR_LENGTH),
        ("blob", ctypes.c_char * MAX_BLOB_LENGTH),
    )


class ConnectParamsV2(ctypes.Structure):
    """``dcgmConnectV2Params_v2``: how `DcgmLib.connect` reaches an nv-hostengine."""

    _fields_ = (
        ("version", ctypes.c_uint),
        # 0: the engine drops this connection's watches and groups when it goes away.
        ("persistAfterDisconnect", ctypes.c_uint),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
    )


#: MAKE_DCGM_VERSION(dcgmConnectV2Params_v2, 2).
CONNECT_PARAMS_VERSION2 = ctypes.sizeof(ConnectParamsV2) | (2 << 24)


class FieldValueV1(ctypes.Structure):
    """``dcgmFieldValue_v1``: 4120 bytes, the value union at offset 24."""

    _fields_ = (
        ("version", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_ushort),
        ("status", ctypes.c_int),
        ("ts", ctypes.c_int64),  # microseconds since the epoch
        ("value", _Value),
    )


#: MAKE_DCGM_VERSION(dcgmFieldValue_v1, 1): the size in the low 24 bits, the version above.
FIELD_VALUE_VERSION1 = ctypes.sizeof(FieldValueV1) | (1 << 24)

#: The entry points used, all returning dcgmReturn_t.
FUNCTIONS = (
    "dcgmInit",
    "dcgmShutdown",
    "dcgmStartEmbedded",
    "dcgmStopEmbedded",
    "dcgmConnect_v2",
    "dcgmDisconnect",
    "dcgmGetAllSupportedDevices",
    "dcgmGroupCreate",
    "dcgmGroupAddDevice",
    "dcgmFieldGroupCreate",
    "dcgmWatchFields",
    "dcgmUpdateAllFields",
    "dcgmGetLatestValuesForFields",
    "dcgmProfPause",
    "dcgmProfResume",
)


class DcgmError(Exception):
    """A DCGM call failed; ``status`` is its dcgmReturn_t."""

    def __init__(self, function: str, status: int, text: str) -> None:
        super().__init__(f"{function} failed: {text} ({status})")
        self.function = function
        self.status = status


class DcgmLibraryError(Exception):
    """libdcgm could not be loaded or lacks an entry point; the message says which."""


def field_value(fv: FieldValueV1) -> float:
    """The number in a field value; NaN for an error status, a blank or another type."""
    if fv.status != ST_OK:
        return math.nan
    if fv.fieldType == FT_DOUBLE:
        dbl = float(fv.value.dbl)
        return math.nan if math.isnan(dbl) or dbl >= FP64_BLANK else dbl
    if fv.fieldType == FT_INT64:
        i64 = int(fv.value.i64)
        return math.nan if i64 >= INT64_BLANK else float(i64)
    return math.nan


@dataclass(frozen=True, slots=True)
class Watch:
    """A group of GPUs with a watched field group on one embedded engine."""

    handle: int
    group: int
    field_group: int
    gpu_ids: tuple[int, ...]
    fields: tuple[int, ...]


class DcgmLib:
    """libdcgm loaded through ctypes.

    Args:
        path: soname or path of the library.

    Raises:
        DcgmLibraryError: the library does not load or lacks one of `FUNCTIONS`.
    """

    def __init__(self, path: str) -> None:
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as e:
            raise DcgmLibraryError(f"{path} does not load: {e}") from e
        missing = [f for f in FUNCTIONS if not hasattr(self._lib, f)]
        if missing:
            raise DcgmLibraryError(
                f"{path} lacks {', '.join(missing)} — install DCGM 3 or newer "
                "(datacenter-gpu-manager-4)"
            )
        for name in FUNCTIONS:
            getattr(self._lib, name).restype = ctypes.c_int
        self._error_string = getattr(self._lib, "errorString", None)
        if self._error_string is not None:
            self._error_string.restype = ctypes.c_char_p
            self._error_string.argtypes = (ctypes.c_int,)
        self.path = path

    def _call(self, name: str, *args: object) -> None:
        status = int(getattr(self._lib, name)(*args))
        if status != ST_OK:
            raise DcgmError(name, status, self.error_text(status))

    def error_text(self, status: int) -> str:
        """DCGM's text for a dcgmReturn_t (errorString), or a generic one."""
        if self._error_string is not None:
            text = self._error_string(status)
            if text:
                return bytes(text).decode(errors="replace")
        return "DCGM error"

    def init(self) -> None:
        """dcgmInit."""
        self._call("dcgmInit")

    def shutdown(self) -> None:
        """dcgmShutdown."""
        self._call("dcgmShutdown")

    def start_embedded(self) -> int:
        """dcgmStartEmbedded(DCGM_OPERATION_MODE_AUTO); returns the engine handle."""
        handle = Handle()
        self._call("dcgmStartEmbedded", ctypes.c_int(OPERATION_MODE_AUTO), ctypes.byref(handle))
        return int(handle.value)

    def stop_embedded(self, handle: int) -> None:
        """dcgmStopEmbedded."""
        self._call("dcgmStopEmbedded", Handle(handle))

    def connect(self, address: str, *, unix_socket: bool, timeout_ms: int) -> int:
        """dcgmConnect_v2 to a running nv-hostengine; returns the connection's handle.

        Args:
            address: "host", "host:port" (nv-hostengine's default port is 5555) or, with
                ``unix_socket``, the path of its domain socket.
            unix_socket: ``address`` is a Unix domain socket path.
            timeout_ms: how long to wait for the engine to answer.
        """
        params = ConnectParamsV2(CONNECT_PARAMS_VERSION2, 0, timeout_ms, int(unix_socket))
        handle = Handle()
        self._call("dcgmConnect_v2", address.encode(), ctypes.byref(params), ctypes.byref(handle))
        return int(handle.value)

    def disconnect(self, handle: int) -> None:
        """dcgmDisconnect: the engine drops this connection's watches, the engine goes on."""
        self._call("dcgmDisconnect", Handle(handle))

    def supported_gpus(self, handle: int) -> tuple[int, ...]:
        """dcgmGetAllSupportedDevices: the ids of the GPUs DCGM supports."""
        ids = (ctypes.c_uint * MAX_NUM_DEVICES)()
        count = ctypes.c_int()
        self._call("dcgmGetAllSupportedDevices", Handle(handle), ids, ctypes.byref(count))
        return tuple(int(ids[i]) for i in range(max(0, min(count.value, MAX_NUM_DEVICES))))

    def watch(
        self,
        handle: int,
        gpu_ids: tuple[int, ...],
        fields: tuple[int, ...],
        update_freq_us: int,
        max_keep_age_s: float,
    ) -> Watch:
        """Create a group of ``gpu_ids`` and a field group, and watch the fields on it."""
        group = Handle()
        self._call(
            "dcgmGroupCreate",
            Handle(handle),
            ctypes.c_int(GROUP_EMPTY),
            b"bpfdyno",
            ctypes.byref(group),
        )
        for gpu in gpu_ids:
            self._call("dcgmGroupAddDevice", Handle(handle), group, ctypes.c_uint(gpu))
        ids = (ctypes.c_ushort * len(fields))(*fields)
        field_group = Handle()
        self._call(
            "dcgmFieldGroupCreate",
            Handle(handle),
            ctypes.c_int(len(fields)),
            ids,
            b"bpfdyno",
            ctypes.byref(field_group),
        )
        # Keep two samples: only the latest value is ever read.
        self._call(
            "dcgmWatchFields",
            Handle(handle),
            group,
            field_group,
            ctypes.c_longlong(update_freq_us),
            ctypes.c_double(max_keep_age_s),
            ctypes.c_int(2),
        )
        return Watch(handle, int(group.value), int(field_group.value), gpu_ids, fields)

    def update_all_fields(self, handle: int) -> None:
        """dcgmUpdateAllFields(waitForUpdate=1): fresh values for this round."""
        self._call("dcgmUpdateAllFields", Handle(handle), ctypes.c_int(1))

    def latest_values(self, watch: Watch, gpu_id: int) -> dict[int, float]:
        """dcgmGetLatestValuesForFields for one GPU: field id -> value (NaN if unavailable)."""
        n = len(watch.fields)
        ids = (ctypes.c_ushort * n)(*watch.fields)
        values = (FieldValueV1 * n)()
        for v in values:
            v.version = FIELD_VALUE_VERSION1
        self._call(
            "dcgmGetLatestValuesForFields",
            Handle(watch.handle),
            ctypes.c_int(gpu_id),
            ids,
            ctypes.c_uint(n),
            values,
        )
        # Keyed by the ids asked for: DCGM may leave fieldId unset on a per-field error.
        return {fid: field_value(v) for fid, v in zip(watch.fields, values, strict=True)}

    def prof_pause(self, handle: int) -> None:
        """dcgmProfPause: stop profiling-field sampling so CUPTI-based tools can run."""
        self._call("dcgmProfPause", Handle(handle))

    def prof_resume(self, handle: int) -> None:
        """dcgmProfResume."""
        self._call("dcgmProfResume", Handle(handle))
