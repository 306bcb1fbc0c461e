"""The dcgm collector against a fake libdcgm implementing the DCGM C ABI.

`dcgm_fake/fake_dcgm.c` is compiled once per session; the collector loads it through its
real ctypes binding. Values come from a control file the test writes (see the C file's
header); the fake counts calls, so tests check what reached the library. An nv-hostengine
(standalone mode) is something listening on a real socket that the fake's dcgmConnect_v2
connects to (`EngineStandIn`); stopping it loses the connection as a stopped engine does.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from gpu_fake_nvml import FakeNvml

from bpfdyno.app.assembly import profiling_controls
from bpfdyno.core.metrics import Sample
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.gpu.collector import GpuCollector
from bpfdyno.sources.gpu.dcgm import (
    DCGM_FIELDS,
    DcgmCollector,
    HostEngine,
    find_libdcgm,
    host_engines,
)
from bpfdyno.sources.gpu.dcgm_api import FIELD_VALUE_VERSION1, FieldValueV1

pytest_plugins = ("gpu_fake_nvml",)  # the NVML fake, for pause/resume acting on both sources

SOURCE = Path(__file__).resolve().parent / "dcgm_fake" / "fake_dcgm.c"

#: Two GPUs, every field of dynolog's set on GPU 0; GPU 1 lacks NVLink (blank).
VALUES: dict[str, str] = {
    "engine": "up",
    "gpus": "0,1",
    "gpu.0.1002": "0.91",
    "gpu.0.1003": "0.455",
    "gpu.0.1004": "0.3025",
    "gpu.0.1005": "0.57",
    "gpu.0.1006": "0.005",
    "gpu.0.1007": "0.2",
    "gpu.0.1008": "0.08",
    "gpu.0.1009": "104857600",
    "gpu.0.1010": "262144000",
    "gpu.0.1011": "1073741824",
    "gpu.0.1012": "536870912",
    "gpu.0.100": "1980",
    "gpu.0.155": "312.5",
    "gpu.1.1002": "0.125",
    "gpu.1.1003": "0.0625",
    "gpu.1.1004": "0",
    "gpu.1.1005": "0.25",
    "gpu.1.1006": "0.5",
    "gpu.1.1007": "0.75",
    "gpu.1.1008": "1",
    "gpu.1.1009": "0",
    "gpu.1.1010": "4096",
    "gpu.1.100": "1410",
    "gpu.1.155": "90.25",
}

EXPECTED: dict[tuple[str, str], float] = {
    ("gpu_dcgm_sm_active_ratio", "0"): 0.91,
    ("gpu_dcgm_sm_occupancy_ratio", "0"): 0.455,
    ("gpu_dcgm_tensor_active_ratio", "0"): 0.3025,
    ("gpu_dcgm_dram_active_ratio", "0"): 0.57,
    ("gpu_dcgm_fp64_active_ratio", "0"): 0.005,
    ("gpu_dcgm_fp32_active_ratio", "0"): 0.2,
    ("gpu_dcgm_fp16_active_ratio", "0"): 0.08,
    ("gpu_dcgm_pcie_tx_bytes_per_second", "0"): 104857600.0,
    ("gpu_dcgm_pcie_rx_bytes_per_second", "0"): 262144000.0,
    ("gpu_dcgm_nvlink_tx_bytes_per_second", "0"): 1073741824.0,
    ("gpu_dcgm_nvlink_rx_bytes_per_second", "0"): 536870912.0,
    ("gpu_dcgm_sm_clock_hertz", "0"): 1980e6,
    ("gpu_dcgm_power_watts", "0"): 312.5,
    ("gpu_dcgm_profiling_paused", "0"): 0.0,
    ("gpu_dcgm_sm_active_ratio", "1"): 0.125,
    ("gpu_dcgm_sm_occupancy_ratio", "1"): 0.0625,
    ("gpu_dcgm_tensor_active_ratio", "1"): 0.0,
    ("gpu_dcgm_dram_active_ratio", "1"): 0.25,
    ("gpu_dcgm_fp64_active_ratio", "1"): 0.5,
    ("gpu_dcgm_fp32_active_ratio", "1"): 0.75,
    ("gpu_dcgm_fp16_active_ratio", "1"): 1.0,
    ("gpu_dcgm_pcie_tx_bytes_per_second", "1"): 0.0,
    ("gpu_dcgm_pcie_rx_bytes_per_second", "1"): 4096.0,
    ("gpu_dcgm_sm_clock_hertz", "1"): 1410e6,
    ("gpu_dcgm_power_watts", "1"): 90.25,
    ("gpu_dcgm_profiling_paused", "1"): 0.0,
}


class FakeDcgm:
    """The dcgm's control file and its call counters."""

    def __init__(self, control: Path, library: Path) -> None:
        self.control = control
        self.library = library
        self.values = dict(VALUES)
        self._lib = ctypes.CDLL(str(library))  # the same instance the collector loads
        self._lib.fake_dcgm_call_count.restype = ctypes.c_ulong
        self._lib.fake_dcgm_watch_freq_us.restype = ctypes.c_longlong
        self._lib.fake_dcgm_reset()
        self.write()

    def set(self, values: Mapping[str, object]) -> None:
        for key, v in values.items():
            self.values[key] = str(v)
        self.write()

    def unset(self, *keys: str) -> None:
        for key in keys:
            self.values.pop(key, None)
        self.write()

    def write(self) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()))
        os.replace(tmp, self.control)

    def calls(self, function: str) -> int:
        return int(self._lib.fake_dcgm_call_count(function.encode()))

    def paused(self) -> bool:
        return bool(self._lib.fake_dcgm_paused())

    def engines(self) -> int:
        return int(self._lib.fake_dcgm_engines())

    def watch_freq_us(self) -> int:
        return int(self._lib.fake_dcgm_watch_freq_us())

    def connections(self) -> int:
        return int(self._lib.fake_dcgm_connections())

    def connect_timeout_ms(self) -> int:
        return int(self._lib.fake_dcgm_connect_timeout_ms())


class EngineStandIn:
    """Where an nv-hostengine listens (TCP on loopback, or a Unix socket): accepts and holds
    connections until `stop`, which closes them all, like an engine that exits."""

    def __init__(self, address: tuple[str, int] | str) -> None:
        self.address = address
        self.accepted = 0
        self._changed = threading.Condition()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._thread: threading.Thread | None = None

    def start(self) -> EngineStandIn:
        family = socket.AF_UNIX if isinstance(self.address, str) else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self.address)
        listener.listen()
        if family == socket.AF_INET:
            self.address = listener.getsockname()
        listener.settimeout(0.05)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            self._conns.append(conn)
            with self._changed:
                self.accepted += 1
                self._changed.notify_all()

    def wait_accepted(self, count: int, timeout: float = 30.0) -> int:
        """Wait until ``count`` connections were accepted (the accept thread may lag)."""
        with self._changed:
            self._changed.wait_for(lambda: self.accepted >= count, timeout)
            return self.accepted

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if self._thread is not None:
            self._thread.join()
        if listener is not None:
            listener.close()
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        if isinstance(self.address, str):
            os.unlink(self.address)

    @property
    def host_port(self) -> str:
        assert isinstance(self.address, tuple)
        return f"{self.address[0]}:{self.address[1]}"


@pytest.fixture
def engine() -> Iterator[EngineStandIn]:
    stand_in = EngineStandIn(("127.0.0.1", 0)).start()
    yield stand_in
    if stand_in._listener is not None:
        stand_in.stop()


def closed_port() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="session")
def dcgm_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fake_dcgm") / "libdcgm.so.4"
    cmd = ["gcc", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]
    cmd += ["-Wl,-soname,libdcgm.so.4", "-o", str(out), str(SOURCE)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def dcgm(dcgm_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDcgm:
    ctl = tmp_path / "dcgm.ctl"
    monkeypatch.setenv("FAKE_DCGM_CONTROL", str(ctl))
    return FakeDcgm(ctl, dcgm_lib)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def collector(dcgm: FakeDcgm, clock: Clock) -> Iterator[DcgmCollector]:
    c = DcgmCollector(str(dcgm.library), host_engine="embedded", update_freq_s=0.5, clock=clock)
    c.start()
    yield c
    c.close()
    assert dcgm.engines() == 0


def by_key(samples: list[Sample] | tuple[Sample, ...]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for s in samples:
        key = (s.spec.name, dict(s.labels)["gpu"])
        assert key not in out, f"duplicate series {key}"
        out[key] = s.value
    return out


def test_field_value_layout_matches_dcgm_structs() -> None:
    # dcgm_structs.h: version, fieldId, fieldType, status, (pad), int64 ts, 4096-byte union.
    assert ctypes.sizeof(FieldValueV1) == 4120
    assert FieldValueV1.ts.offset == 16
    assert FieldValueV1.value.offset == 24
    assert FIELD_VALUE_VERSION1 == 0x01001018
    assert sorted(DCGM_FIELDS) == [100, 155, *range(1002, 1013)]


def test_exact_values_per_field_and_gpu(collector: DcgmCollector, dcgm: FakeDcgm) -> None:
    got = by_key(list(collector.collect()))
    assert got == pytest.approx(EXPECTED, rel=1e-12)
    # GPU 1 has no NVLink values: blank -> the series is absent, never 0.
    assert ("gpu_dcgm_nvlink_tx_bytes_per_second", "1") not in got
    assert dcgm.calls("dcgmStartEmbedded") == 1
    assert dcgm.calls("dcgmGroupAddDevice") == 2
    assert dcgm.calls("dcgmUpdateAllFields") == 1
    assert dcgm.calls("dcgmGetLatestValuesForFields") == 2
    assert dcgm.watch_freq_us() == 500_000
    state, reason = collector.health()
    assert state is PartState.OK
    assert reason == f"2 GPU(s) via DCGM embedded host engine ({dcgm.library}); profiling: active"


def test_blank_and_error_values_are_absent(collector: DcgmCollector, dcgm: FakeDcgm) -> None:
    dcgm.unset("gpu.0.1002", "gpu.0.100")  # blank double, blank int64
    dcgm.set({"gpu.0.155": "nodata", "gpu.0.1003": "140737488355331"})  # NO_DATA, FP64 blank+3
    got = by_key(list(collector.collect()))
    for name in ("sm_active_ratio", "sm_clock_hertz", "power_watts", "sm_occupancy_ratio"):
        assert (f"gpu_dcgm_{name}", "0") not in got
        assert (f"gpu_dcgm_{name}", "1") in got
    assert got[("gpu_dcgm_tensor_active_ratio", "0")] == 0.3025
    assert not any(math.isnan(v) for v in got.values())


def test_engine_loss_degrades_then_recovers(
    collector: DcgmCollector, dcgm: FakeDcgm, clock: Clock
) -> None:
    assert collector.collect()
    dcgm.set({"engine": "down"})
    assert collector.collect() == []
    state, reason = collector.health()
    assert state is PartState.DEGRADED
    assert reason == (
        "DCGM embedded host engine lost: dcgmUpdateAllFields failed: The connection to the host "
        "engine is not valid any longer (-21); re-start in 1 s"
    )
    assert dcgm.engines() == 0  # the lost engine was stopped
    clock.now += 1.0
    assert collector.collect() == []  # the re-start fails: back-off doubles
    assert collector.restart_attempts == 1
    assert collector.health()[1].endswith("(-7); re-start in 2 s")
    dcgm.set({"engine": "up"})
    clock.now += 1.0
    assert collector.collect() == []  # not due yet
    assert collector.restart_attempts == 1
    clock.now += 1.0
    assert by_key(list(collector.collect())) == pytest.approx(EXPECTED, rel=1e-12)
    assert collector.restart_attempts == 2
    assert collector.health()[0] is PartState.OK
    assert dcgm.engines() == 1
    assert dcgm.calls("dcgmStartEmbedded") == 3


def test_pause_resume_reach_the_library(
    collector: DcgmCollector, dcgm: FakeDcgm, clock: Clock
) -> None:
    assert collector.pause_profiling(30) is True
    assert dcgm.calls("dcgmProfPause") == 1 and dcgm.paused()
    got = by_key(list(collector.collect()))
    assert got[("gpu_dcgm_profiling_paused", "0")] == 1.0
    assert ("gpu_dcgm_sm_active_ratio", "0") not in got
    assert got[("gpu_dcgm_power_watts", "0")] == 312.5  # device fields go on
    assert collector.health()[1].startswith(
        f"2 GPU(s) via DCGM embedded host engine ({dcgm.library}); profiling: paused (dcgm-pause, "
        "until "
    )
    assert collector.resume_profiling() is True
    assert dcgm.calls("dcgmProfResume") == 1 and not dcgm.paused()
    assert by_key(list(collector.collect())) == pytest.approx(EXPECTED, rel=1e-12)
    with pytest.raises(ValueError, match="positive number of seconds"):
        collector.pause_profiling(0)
    assert dcgm.calls("dcgmProfPause") == 1


def test_pause_during_a_round_is_applied_next_round(
    collector: DcgmCollector, dcgm: FakeDcgm
) -> None:
    # A round waiting in dcgmUpdateAllFields must not hold up the RPC asking for the pause.
    dcgm.set({"update_ms": 1000})
    round_ = threading.Thread(target=collector.collect)
    round_.start()
    while dcgm.calls("dcgmUpdateAllFields") == 0:
        time.sleep(0.005)
    assert collector.pause_profiling(30) is True  # accepted, deferred
    assert not dcgm.paused() and dcgm.calls("dcgmProfPause") == 0
    round_.join()
    dcgm.set({"update_ms": 0})
    got = by_key(list(collector.collect()))
    assert dcgm.calls("dcgmProfPause") == 1 and dcgm.paused()
    assert got[("gpu_dcgm_profiling_paused", "0")] == 1.0


def test_pause_expires(collector: DcgmCollector, dcgm: FakeDcgm, clock: Clock) -> None:
    assert collector.pause_profiling(10)
    clock.now += 9.5
    assert by_key(list(collector.collect()))[("gpu_dcgm_profiling_paused", "1")] == 1.0
    assert dcgm.paused()
    clock.now += 0.5
    got = by_key(list(collector.collect()))  # expired: resumed before reading
    assert dcgm.calls("dcgmProfResume") == 1 and not dcgm.paused()
    assert got == pytest.approx(EXPECTED, rel=1e-12)


def test_pause_survives_engine_restart(
    collector: DcgmCollector, dcgm: FakeDcgm, clock: Clock
) -> None:
    assert collector.pause_profiling(60)
    dcgm.set({"engine": "down"})
    assert collector.collect() == []
    assert collector.pause_profiling(60) is False  # no engine to pause
    dcgm.set({"engine": "up"})
    clock.now += 1.0
    got = by_key(list(collector.collect()))
    assert dcgm.calls("dcgmProfPause") == 2 and dcgm.paused()  # re-applied on the new engine
    assert got[("gpu_dcgm_profiling_paused", "0")] == 1.0


def test_gpus_without_profiling_read_device_fields(dcgm: FakeDcgm, clock: Clock) -> None:
    dcgm.set({"profiling": "0"})
    c = DcgmCollector(str(dcgm.library), host_engine="embedded", clock=clock)
    c.start()
    try:
        got = by_key(list(c.collect()))
        assert got == {
            ("gpu_dcgm_sm_clock_hertz", "0"): 1980e6,
            ("gpu_dcgm_power_watts", "0"): 312.5,
            ("gpu_dcgm_sm_clock_hertz", "1"): 1410e6,
            ("gpu_dcgm_power_watts", "1"): 90.25,
        }
        assert c.health()[1].endswith(
            "profiling: unavailable: Profiling is not supported for this group of GPUs or GPU "
            "(SM clock and power only)"
        )
        assert c.pause_profiling(5) is False
        assert dcgm.calls("dcgmProfPause") == 0
    finally:
        c.close()


def test_unavailable_without_library_or_engine_or_gpu(dcgm: FakeDcgm) -> None:
    with pytest.raises(CollectorUnavailable) as e:
        DcgmCollector(find=lambda: None).start()
    assert str(e.value) == "libdcgm not found — install datacenter-gpu-manager to use DCGM fields"
    with pytest.raises(CollectorUnavailable, match=r"^/nonexistent/libdcgm.so.4 does not load: "):
        DcgmCollector("/nonexistent/libdcgm.so.4").start()
    dcgm.set({"engine": "down"})
    with pytest.raises(CollectorUnavailable) as e:
        DcgmCollector(str(dcgm.library), host_engine="embedded").start()
    assert str(e.value).startswith(
        "DCGM host engine did not start (dcgmStartEmbedded failed: DCGM initialization error "
        "(-7)) — check that `nvidia-smi` works"
    )
    dcgm.set({"engine": "up", "gpus": ""})
    with pytest.raises(CollectorUnavailable, match=r"^DCGM lists no supported GPU"):
        DcgmCollector(str(dcgm.library), host_engine="embedded").start()
    assert dcgm.engines() == 0
    assert dcgm.calls("dcgmShutdown") == dcgm.calls("dcgmInit") == 2
    c = DcgmCollector(find=lambda: None)
    assert c.collect() == []
    assert c.pause_profiling(5) is False and c.resume_profiling() is False


def test_find_libdcgm_skips_names_that_do_not_load(dcgm: FakeDcgm) -> None:
    missing = ("libdcgm-does-not-exist.so.9",)
    assert find_libdcgm(lambda name: None, missing) is None
    assert find_libdcgm(lambda name: "/nonexistent/libdcgm.so", missing) is None
    assert find_libdcgm(lambda name: str(dcgm.library), missing) == str(dcgm.library)


def test_profiling_controls_act_on_nvml_and_dcgm(
    collector: DcgmCollector, dcgm: FakeDcgm, fake: FakeNvml
) -> None:
    assert profiling_controls([]) == (None, None)
    gpu = GpuCollector(str(fake.library), events_enabled=False)
    gpu.start()
    try:
        pause, resume = profiling_controls([gpu, collector])
        assert pause is not None and resume is not None
        assert pause(7) is True
        assert gpu.status().devices[0].gpm.startswith("paused (dcgm-pause, until ")
        assert dcgm.paused() and dcgm.calls("dcgmProfPause") == 1
        assert resume() is True
        assert not gpu.status().devices[0].gpm.startswith("paused")
        assert not dcgm.paused() and dcgm.calls("dcgmProfResume") == 1
        with pytest.raises(ValueError, match="positive number of seconds"):
            pause(-1)
        assert dcgm.calls("dcgmProfPause") == 1
        # DCGM without an engine refuses; NVML GPM still accepts, so the pair says True.
        collector.close()
        assert pause(3) is True
    finally:
        gpu.close()


# ---- a running nv-hostengine (standalone mode) ----


def test_a_configured_nv_hostengine_is_used_and_left_running(
    dcgm: FakeDcgm, engine: EngineStandIn, clock: Clock
) -> None:
    c = DcgmCollector(str(dcgm.library), host_engine=engine.host_port, clock=clock)
    c.start()
    try:
        assert by_key(list(c.collect())) == pytest.approx(EXPECTED, rel=1e-12)
        assert (engine.wait_accepted(1), dcgm.connections(), dcgm.engines()) == (1, 1, 0)
        assert dcgm.calls("dcgmStartEmbedded") == 0
        assert dcgm.connect_timeout_ms() == 2000
        assert c.health() == (
            PartState.OK,
            f"2 GPU(s) via DCGM nv-hostengine at {engine.host_port} ({dcgm.library}); "
            "profiling: active",
        )
        assert c.pause_profiling(30) is True  # on the shared engine, for every client of it
        assert dcgm.paused() and dcgm.calls("dcgmProfPause") == 1
    finally:
        c.close()
    # Disconnected, not stopped: the engine goes on for its other users.
    assert (dcgm.calls("dcgmDisconnect"), dcgm.calls("dcgmStopEmbedded")) == (1, 0)
    assert dcgm.connections() == 0


def test_auto_uses_a_running_nv_hostengine_else_embeds_one(
    dcgm: FakeDcgm, engine: EngineStandIn, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    c = DcgmCollector(str(dcgm.library), auto_address=engine.host_port, clock=clock)
    c.start()
    try:
        assert c.collect()
        assert (dcgm.connections(), dcgm.engines()) == (1, 0)
    finally:
        c.close()
    address = closed_port()
    caplog.set_level(logging.INFO, logger="bpfdyno.sources.gpu.dcgm")
    c = DcgmCollector(str(dcgm.library), auto_address=address, clock=clock)
    c.start()
    try:
        assert by_key(list(c.collect())) == pytest.approx(EXPECTED, rel=1e-12)
        assert (dcgm.connections(), dcgm.engines()) == (0, 1)
        assert c.health()[1].startswith("2 GPU(s) via DCGM embedded host engine (")
        said = [r.getMessage() for r in caplog.records if "no nv-hostengine" in r.getMessage()]
        assert said == [
            f"dcgm: no nv-hostengine at {address} (dcgmConnect_v2 failed: The connection to "
            "the host engine is not valid any longer (-21)); starting an embedded host engine"
        ]
    finally:
        c.close()
    assert dcgm.engines() == 0


_USER_LISTENER = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', 0)); s.listen(8)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.root
def test_auto_never_uses_a_listener_a_user_opened(dcgm: FakeDcgm, clock: Clock) -> None:
    """Found by reading the code: ``auto`` connected to whatever listened on 127.0.0.1:5555,
    so a local user listening there first would get the node's dcgm-pause calls and could
    answer with made-up GPU metrics. Only a listener root opened is used; a user's is
    refused, said in the log and in status, and an embedded engine is started instead."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tracing"))
    from local_user import local_user

    with local_user() as mallory:
        squat = subprocess.Popen(
            ["setpriv", f"--reuid={mallory.uid}", f"--regid={mallory.gid}", "--clear-groups",
             "--", "/usr/bin/python3", "-c", _USER_LISTENER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert squat.stdout is not None
            address = f"127.0.0.1:{int(squat.stdout.readline())}"
            c = DcgmCollector(str(dcgm.library), auto_address=address, clock=clock)
            c.start()
            try:
                assert (dcgm.connections(), dcgm.engines()) == (0, 1)
                assert dcgm.calls("dcgmConnect_v2") == 0
                refused = (
                    f"not connecting to {address}: it is listened on by uid {mallory.uid} "
                    f"({mallory.name}), not root (the DCGM service runs as root; a user's "
                    "program there would get the dcgm-pause calls and could report made-up GPU "
                    "metrics); name the host engine in [gpu] dcgm_host_engine if this is the "
                    "site's own"
                )
                assert c.refused_engine == refused
                assert c.health()[1].endswith(f"profiling: active; {refused}")
            finally:
                c.close()
        finally:
            squat.kill()
            squat.wait()


def test_a_configured_nv_hostengine_that_does_not_answer_makes_it_unavailable(
    dcgm: FakeDcgm,
) -> None:
    address = closed_port()
    with pytest.raises(CollectorUnavailable) as e:
        DcgmCollector(str(dcgm.library), host_engine=address).start()
    assert str(e.value) == (
        f"cannot reach the DCGM nv-hostengine at {address} (dcgmConnect_v2 failed: The "
        "connection to the host engine is not valid any longer (-21)) — start it (`systemctl "
        'start nvidia-dcgm`), fix [gpu] dcgm_host_engine, or set it to "embedded"'
    )
    assert dcgm.calls("dcgmStartEmbedded") == 0  # never a second engine beside the node's
    assert dcgm.calls("dcgmShutdown") == dcgm.calls("dcgmInit") == 1


def test_a_lost_nv_hostengine_is_reconnected_not_replaced(
    dcgm: FakeDcgm, tmp_path: Path, clock: Clock
) -> None:
    path = str(tmp_path / "nv-hostengine")
    engine = EngineStandIn(path).start()
    c = DcgmCollector(str(dcgm.library), host_engine=f"unix:{path}", clock=clock)
    c.start()
    try:
        assert c.collect()
        engine.stop()  # the engine exits: its end of the connection closes
        assert c.collect() == []
        assert c.health() == (
            PartState.DEGRADED,
            f"DCGM nv-hostengine at unix:{path} lost: dcgmUpdateAllFields failed: The "
            "connection to the host engine is not valid any longer (-21); re-connect in 1 s",
        )
        assert dcgm.connections() == 0
        clock.now += 1.0
        assert c.collect() == []  # nothing listens yet: back-off doubles
        assert c.health()[1].endswith("(-21); re-connect in 2 s")
        engine = EngineStandIn(path).start()  # restarted
        clock.now += 2.0
        assert by_key(list(c.collect())) == pytest.approx(EXPECTED, rel=1e-12)
        assert c.health()[0] is PartState.OK
        assert (engine.wait_accepted(1), dcgm.connections()) == (1, 1)
        assert dcgm.calls("dcgmStartEmbedded") == 0
    finally:
        c.close()
        engine.stop()


def test_host_engine_settings() -> None:
    assert [str(e) for e in host_engines("auto")] == [
        "nv-hostengine at 127.0.0.1:5555",
        "embedded host engine",
    ]
    assert [str(e) for e in host_engines("embedded")] == ["embedded host engine"]
    assert host_engines("unix:/run/nv-hostengine") == (HostEngine("/run/nv-hostengine", True),)
    assert host_engines("10.0.0.7:5555") == (HostEngine("10.0.0.7:5555"),)
