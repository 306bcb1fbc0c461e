"""Error-tolerant access to NVML through the pynvml bindings.

Every NVML call of the GPU collector goes through `Nvml.get` (or `Nvml.do`), which turns an
NVML error into "not available" for the one field it feeds, so a GPU that lacks a feature, a
permission problem or an old driver costs a field, never a round:

* ``NVMLError_FunctionNotFound`` (an older driver without that entry point) is remembered and
  the function is not called again; the caller may fall back to an older variant.
* ``GPU_IS_LOST`` and friends raise `DeviceLost`; a driver that went away (unloaded,
  reloaded with another version) raises `DriverGone`. The collector marks the device or the
  whole library lost and re-initialises NVML with back-off.
* Everything else is logged once per (function, error) and the field is reported as NaN.

Loading the library. pynvml always ``dlopen``s ``libnvidia-ml.so.1`` by name. To use a
library at another path (a driver in a non-standard prefix, or the test double) it is loaded
first with ``ctypes.CDLL(path, RTLD_GLOBAL)``: the dynamic loader then answers pynvml's
``dlopen("libnvidia-ml.so.1")`` with the object already loaded under that soname, so pynvml's
own code path runs unchanged. ``LD_LIBRARY_PATH`` would need to be set before the process
starts, and assigning ``pynvml.nvmlLib`` would bypass pynvml's own loading and locking. After
init the handle pynvml holds is compared with ours, so a soname mismatch or another NVML loaded
earlier in the process is reported instead of silently reading the wrong library.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from bpfdyno.sources.kubelet.podresources import gpu_aliases

log = logging.getLogger("bpfdyno.sources.gpu.collector")

T = TypeVar("T")

LIBRARY_SONAME = "libnvidia-ml.so.1"

#: Errors that mean this one device is gone until the driver recovers it.
DEVICE_LOST_CODES = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
    }
)
#: Errors that mean the library lost the driver: unloaded, or reloaded with another version.
DRIVER_GONE_CODES = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
#: Errors that are a normal property of a GPU, logged at info rather than warning.
_ROUTINE_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})


def describe_error(code: int) -> str:
    """NVML's name for an error code, with the number (e.g. "GPU is lost (15)")."""
    text = pynvml.NVMLError._errcode_to_string.get(code, "NVML error")
    return f"{text} ({code})"


class DeviceLost(Exception):
    """A device answered with an error meaning it is gone (fell off the bus, needs reset)."""

    def __init__(self, gpu: int, function: str, code: int) -> None:
        super().__init__(f"gpu {gpu}: {function}: {describe_error(code)}")
        self.gpu = gpu
        self.function = function
        self.code = code


class DriverGone(Exception):
    """NVML lost the driver (unloaded, or a version mismatch after a driver upgrade)."""

    def __init__(self, function: str, code: int) -> None:
        super().__init__(f"{function}: {describe_error(code)}")
        self.function = function
        self.code = code


class NvmlInitError(Exception):
    """NVML could not be initialised: what went wrong and what to do about it."""

    def __init__(self, reason: str, fix: str, code: int | None = None) -> None:
        super().__init__(f"{reason} — {fix}")
        self.reason = reason
        self.fix = fix
        self.code = code


@dataclass
class DeviceRef:
    """One GPU as enumerated by NVML in the current init generation."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    handle: Any  # pynvml's c_nvmlDevice_t; valid until the next nvmlShutdown
    minor: int | None = None  # /dev/nvidia<minor>; None when NVML does not say

    def aliases(self) -> tuple[str, ...]:
        """Every id a Kubernetes device plugin may give this GPU."""
        return gpu_aliases(self.uuid, self.index, self.minor)


def device_address(handle: Any) -> int:
    """The pointer value of an NVML device handle, to match event data to a device."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


_INIT_ERRORS: dict[int, tuple[str, str]] = {
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded",
        "load it (modprobe nvidia) or install the NVIDIA driver; on a machine without GPUs "
        "disable this collector ([collectors.gpu] enabled = false)",
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the NVIDIA kernel driver have different versions (usually "
        "after a driver upgrade)",
        "reboot, or reload the nvidia kernel modules, so both come from the same driver",
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "no permission to open the NVIDIA device files (/dev/nvidia*)",
        "run bpfdyno as root or as a member of the group owning /dev/nvidia*",
    ),
}


class Nvml:
    """One user of NVML: init/shutdown and error-tolerant calls, with its own error log.

    Thread-safe: the collector thread and the event thread call it concurrently (NVML itself
    is thread-safe).

    Args:
        library_path: path of the NVML library to use instead of the system's
            ``libnvidia-ml.so.1`` (None: the dynamic loader's search path).
    """

    def __init__(self, library_path: str | None = None) -> None:
        self.library_path = library_path
        self._lock = threading.Lock()
        self._missing: set[str] = set()
        self._logged: set[tuple[str, int]] = set()  # (function[detail], code)
        self._initialised = False
        self._lib: ctypes.CDLL | None = None
        #: Calls skipped because the function is known to be missing (for tests and stats).
        self.skipped_calls = 0

    @property
    def missing(self) -> frozenset[str]:
        """NVML functions this driver does not have (``FunctionNotFound`` seen once)."""
        with self._lock:
            return frozenset(self._missing)

    def init(self) -> None:
        """Load the library (once) and call ``nvmlInit``.

        Raises:
            NvmlInitError: no library, no driver, a version mismatch, no permission...
        """
        if self.library_path and self._lib is None:
            self._lib = _preload(self.library_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise _init_error(e.value, self.library_path) from e
        bound = getattr(pynvml, "nvmlLib", None)
        if self._lib is not None and bound is not None and bound._handle != self._lib._handle:
            self._shutdown_quietly()
            raise NvmlInitError(
                f"pynvml is bound to another NVML library than {self.library_path} (one "
                f"was loaded earlier in this process, or the file's soname is not "
                f"{LIBRARY_SONAME})",
                "restart bpfdyno; point [gpu] library_path at a libnvidia-ml.so.1",
            )
        self._initialised = True

    def shutdown(self) -> None:
        """``nvmlShutdown`` if initialised; errors are ignored (the driver may be gone)."""
        if self._initialised:
            self._initialised = False
            self._shutdown_quietly()

    @staticmethod
    def _shutdown_quietly() -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.debug("nvmlShutdown: %s", describe_error(e.value))

    def get(
        self,
        function: str,
        gpu: int,
        call: Callable[[], T],
        detail: str = "",
        expected: frozenset[int] = frozenset(),
    ) -> T | None:
        """Run one pynvml call; None when its value is not available.

        Args:
            function: the NVML function name: the key for "missing" and log-once.
            gpu: the device index for messages (-1 for library-wide calls).
            call: the pynvml call.
            detail: which variant (an argument such as "sm" or "tx"), for log lines.
            expected: error codes that are a normal answer (e.g. NOT_FOUND for "no new
                samples"): None without a log line.

        Raises:
            DeviceLost: the device is gone.
            DriverGone: NVML lost the driver.
        """
        with self._lock:
            if function in self._missing:
                self.skipped_calls += 1
                return None
        try:
            return call()
        except pynvml.NVMLError as e:
            if e.value not in expected:
                self.failed(function, gpu, e.value, detail)
            return None

    def do(self, function: str, gpu: int, call: Callable[[], object], detail: str = "") -> bool:
        """Like `get` for calls without a result; True if the call succeeded."""
        with self._lock:
            if function in self._missing:
                self.skipped_calls += 1
                return False
        try:
            call()
        except pynvml.NVMLError as e:
            self.failed(function, gpu, e.value, detail)
            return False
        return True

    def release(self, function: str, call: Callable[[], object]) -> None:
        """Free something NVML allocated; any error is ignored (the driver may be gone)."""
        try:
            call()
        except pynvml.NVMLError as e:
            log.debug("%s: %s (ignored while releasing)", function, describe_error(e.value))

    def failed(self, function: str, gpu: int, code: int, detail: str = "") -> None:
        """Handle an error code of ``function`` (also one entry of a result array).

        Raises:
            DeviceLost: the device is gone.
            DriverGone: NVML lost the driver.
        """
        if code in DEVICE_LOST_CODES:
            raise DeviceLost(gpu, function, code)
        if code in DRIVER_GONE_CODES:
            raise DriverGone(function, code)
        # A missing function is one fact whatever the argument; other errors may differ per
        # argument (the SM clock readable, the memory clock not).
        missing = code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        key = (f"{function}[{detail}]" if detail and not missing else function, code)
        with self._lock:
            if missing:
                self._missing.add(function)
            first = key not in self._logged
            self._logged.add(key)
        if not first:
            return
        where = f" on gpu {gpu}" if gpu >= 0 else ""
        if missing:
            what = "this NVIDIA driver does not have it (too old); it will not be called again"
        else:
            what = "the fields it feeds are reported as not available"
        level = logging.INFO if code in _ROUTINE_CODES else logging.WARNING
        log.log(level, "NVML %s%s: %s; %s (logged once)", key[0], where, describe_error(code), what)


def _preload(path: str) -> ctypes.CDLL:
    if not os.path.isfile(path):
        raise NvmlInitError(
            f"the NVML library {path} does not exist",
            "fix [gpu] library_path, or leave it empty to use the driver's libnvidia-ml.so.1",
        )
    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as e:
        raise NvmlInitError(
            f"cannot load the NVML library {path}: {e}",
            "point [gpu] library_path at the NVIDIA driver's libnvidia-ml.so.1",
        ) from e


def _init_error(code: int, library_path: str | None) -> NvmlInitError:
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        if library_path:
            return NvmlInitError(
                f"{library_path} was loaded but pynvml could not find {LIBRARY_SONAME} (the "
                "file's soname differs)",
                f"point [gpu] library_path at a library whose soname is {LIBRARY_SONAME}",
                code,
            )
        return NvmlInitError(
            f"the NVML library {LIBRARY_SONAME} was not found",
            "install the NVIDIA driver (it ships libnvidia-ml.so.1), or set [gpu] "
            "library_path; on a machine without GPUs disable this collector",
            code,
        )
    if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
        return NvmlInitError(
            "the NVML library has no nvmlInitWithFlags (driver older than R430)",
            "upgrade the NVIDIA driver",
            code,
        )
    reason, fix = _INIT_ERRORS.get(
        code,
        (f"nvmlInit failed: {describe_error(code)}", "check that `nvidia-smi` works here"),
    )
    return NvmlInitError(reason, fix, code)


def probe_host(library_path: str | None = None) -> tuple[bool | None, str, str]:
    """Initialise NVML briefly and describe the GPUs (``bpfdyno doctor``).

    Returns:
        (ok, detail, fix): ok is True when NVML lists GPUs, False when a driver is installed
        but unusable, None when the machine has no NVIDIA driver at all (not applicable).
    """
    nv = Nvml(library_path)
    try:
        nv.init()
    except NvmlInitError as e:
        if e.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND and not library_path:
            return None, "no NVIDIA driver on this machine (libnvidia-ml.so.1 not found)", e.fix
        return False, e.reason, e.fix
    try:
        count = nv.get("nvmlDeviceGetCount_v2", -1, pynvml.nvmlDeviceGetCount)
        if not count:
            return (
                False,
                "NVML works but lists no GPU",
                "check `nvidia-smi -L`; in a container, expose the GPUs to it (e.g. --gpus all)",
            )
        version = nv.get("nvmlSystemGetDriverVersion", -1, pynvml.nvmlSystemGetDriverVersion)
        names: list[str] = []
        gpm = 0
        for i in range(count):
            handle: Any = nv.get(
                "nvmlDeviceGetHandleByIndex_v2",
                i,
                functools.partial(pynvml.nvmlDeviceGetHandleByIndex, i),
            )
            if handle is None:
                return False, f"gpu {i} cannot be opened (see the log)", "check `nvidia-smi`"
            names.append(
                nv.get("nvmlDeviceGetName", i, functools.partial(pynvml.nvmlDeviceGetName, handle))
                or "?"
            )
            support = nv.get(
                "nvmlGpmQueryDeviceSupport",
                i,
                functools.partial(pynvml.nvmlGpmQueryDeviceSupport, handle),
            )
            gpm += 1 if support is not None and support.isSupportedDevice else 0
    except (DeviceLost, DriverGone) as e:
        return False, f"NVML error: {e}", "check `nvidia-smi`; a lost GPU needs a reset or a reboot"
    finally:
        nv.shutdown()
    models = ", ".join(sorted(set(names)))
    return True, f"{count} GPU(s) ({models}), driver {version or '?'}; GPM on {gpm} of {count}", ""
