"""Test harness for the GPU collector: builds the fake NVML library and drives its values.

`nvml_fake/fake_nvml.c` (next to this file) implements the NVML ABI; it is compiled with gcc
once per test session (a full driver and an "old driver" variant lacking newer functions).
The real pynvml loads it, so the collector runs exactly its production code. The library
reads its values from a key=value control file named by ``FAKE_NVML_CONTROL``; `FakeNvml`
writes that file atomically so a test can change values between two collections.

pynvml binds one NVML library per process, so tests of another variant (or of no library at
all) run the collector in a child process with `run_child`.

Test modules load this file as a plugin (``pytest_plugins``) after importing helpers from
it, so assertion rewriting is off here: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from bpfdyno.core.metrics import Sample

SOURCE = Path(__file__).resolve().parent / "nvml_fake" / "fake_nvml.c"

H100_UUID = "GPU-11111111-2222-3333-4444-555555555555"
A100_UUID = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

#: Two GPUs: an H100 with GPM and every field set, and an A100 without GPM.
DEFAULT_VALUES: dict[str, str] = {
    "driver": "loaded",
    "driver_version": "550.54.15",
    "device_count": "2",
    "clock_us": "1000000",
    "gpu.0.uuid": H100_UUID,
    "gpu.0.minor": "3",  # /dev/nvidia3: not its index, as on nodes with gaps
    "gpu.0.name": "NVIDIA H100 80GB HBM3",
    "gpu.0.pci_bus_id": "00000000:18:00.0",
    "gpu.0.util_gpu": "57",
    "gpu.0.util_mem": "45",
    "gpu.0.mem_total": "85899345920",
    "gpu.0.mem_used": "42949672960",
    "gpu.0.mem_free": "42278584320",
    "gpu.0.mem_reserved": "671088640",
    "gpu.0.power_mw": "312500",
    "gpu.0.power_limit_mw": "700000",
    "gpu.0.temp_c": "64",
    "gpu.0.clock_sm_mhz": "1980",
    "gpu.0.clock_mem_mhz": "2619",
    "gpu.0.pcie_tx_kbps": "123456",
    "gpu.0.pcie_rx_kbps": "654321",
    "gpu.0.nvlink_tx_kib": "1000",
    "gpu.0.nvlink_rx_kib": "2000",
    "gpu.0.ecc_corrected": "3",
    "gpu.0.ecc_uncorrected": "0",
    "gpu.0.throttle": "0x24",
    "gpu.0.mig_current": "0",
    "gpu.0.mig_pending": "0",
    "gpu.0.event_types": "0x0b",
    "gpu.0.procs": "4242:1073741824,4343:2147483648",
    "gpu.0.proc_util": "4242:900000:55:20,4242:950000:60:25",
    "gpu.0.gpm": "1",
    "gpu.0.gpm.1": "91.0",
    "gpu.0.gpm.2": "45.5",
    "gpu.0.gpm.3": "30.25",
    "gpu.0.gpm.5": "12.5",
    "gpu.0.gpm.10": "57.0",
    "gpu.0.gpm.11": "0.5",
    "gpu.0.gpm.12": "20.0",
    "gpu.0.gpm.13": "8.0",
    "gpu.0.gpm.20": "100.0",
    "gpu.0.gpm.21": "250.0",
    "gpu.0.gpm.60": "1024.0",
    "gpu.0.gpm.61": "512.0",
    "gpu.1.uuid": A100_UUID,
    "gpu.1.minor": "1",
    "gpu.1.name": "NVIDIA A100-SXM4-40GB",
    "gpu.1.pci_bus_id": "00000000:3B:00.0",
    "gpu.1.util_gpu": "10",
    "gpu.1.util_mem": "5",
    "gpu.1.mem_total": "42949672960",
    "gpu.1.mem_used": "1073741824",
    "gpu.1.mem_free": "41339060224",
    "gpu.1.mem_reserved": "536870912",
    "gpu.1.power_mw": "90250",
    "gpu.1.power_limit_mw": "400000",
    "gpu.1.temp_c": "41",
    "gpu.1.clock_sm_mhz": "1410",
    "gpu.1.clock_mem_mhz": "1215",
    "gpu.1.pcie_tx_kbps": "0",
    "gpu.1.pcie_rx_kbps": "1",
    "gpu.1.ecc_corrected": "0",
    "gpu.1.ecc_uncorrected": "2",
    "gpu.1.throttle": "0x1",
    "gpu.1.mig_current": "1",
    "gpu.1.mig_pending": "1",
    "gpu.1.event_types": "0x0b",
    "gpu.1.procs": "4343:536870912",
    "gpu.1.gpm": "0",
}


def build_fake_nvml(out_dir: Path, old_driver: bool = False) -> Path:
    """Compile the fake into ``out_dir/libnvidia-ml.so.1`` (soname as the real one)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / "libnvidia-ml.so.1"
    cmd = ["gcc", "-O1", "-Wall", "-Wextra", "-shared", "-fPIC", "-pthread"]
    if old_driver:
        cmd.append("-DFAKE_OLD_DRIVER")
    cmd += ["-Wl,-soname,libnvidia-ml.so.1", "-o", str(lib), str(SOURCE)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return lib


@dataclass(frozen=True)
class FakeLibs:
    full: Path
    old: Path


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> FakeLibs:
    """The fake NVML library, compiled once per session: full and old-driver variants."""
    root = tmp_path_factory.mktemp("fake_nvml")
    return FakeLibs(build_fake_nvml(root / "full"), build_fake_nvml(root / "old", old_driver=True))


class FakeNvml:
    """The control file of the fake library: the values a test chose."""

    def __init__(self, path: Path, library: Path) -> None:
        self.path = path
        self.library = library
        self.values: dict[str, str] = dict(DEFAULT_VALUES)
        self._events: list[str] = []
        self.write()

    def set(self, values: Mapping[str, object]) -> None:
        """Change values (and write the file, so the next NVML call sees them)."""
        for key, value in values.items():
            self.values[key] = str(value)
        self.write()

    def unset(self, *keys: str) -> None:
        """Remove values: NVML then answers NOT_SUPPORTED for them."""
        for key in keys:
            self.values.pop(key, None)
        self.write()

    def push_event(self, gpu: int, event_type: int, data: int) -> None:
        """Queue an event for nvmlEventSetWait (seen by event sets created before it)."""
        self._events.append(f"{gpu}:{event_type:#x}:{data}")
        self.values["events"] = ";".join(self._events)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()))
        os.replace(tmp, self.path)  # a new inode: the library notices the change

    def calls(self, function: str, gpu: int = -1) -> int:
        """How often the library's ``function`` ran in this test (one GPU, or all with -1)."""
        lib = ctypes.CDLL(str(self.library))
        lib.fake_nvml_call_count.restype = ctypes.c_ulong
        return int(lib.fake_nvml_call_count(function.encode(), gpu))

    def reset_calls(self) -> None:
        ctypes.CDLL(str(self.library)).fake_nvml_reset_counts()

    def init_refcount(self) -> int:
        """nvmlInit calls not yet matched by nvmlShutdown (0 once every user shut down)."""
        return int(ctypes.CDLL(str(self.library)).fake_nvml_init_refcount())


@pytest.fixture
def fake(fake_libs: FakeLibs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """A fresh control file with `DEFAULT_VALUES`, selected for this test."""
    ctl = tmp_path / "nvml.ctl"
    monkeypatch.setenv("FAKE_NVML_CONTROL", str(ctl))
    fake = FakeNvml(ctl, fake_libs.full)
    fake.reset_calls()
    return fake


Key = tuple[str, tuple[tuple[str, str], ...]]


def as_dict(samples: Iterable[Sample]) -> dict[Key, float]:
    """Samples keyed by (name, labels); asserts no series appears twice in a round."""
    out: dict[Key, float] = {}
    for s in samples:
        assert s.key not in out, f"duplicate series {s.key}"
        out[s.key] = s.value
    return out


def value(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    found = [
        s.value for s in samples if s.spec.name == name and labels.items() <= dict(s.labels).items()
    ]
    assert len(found) == 1, f"{name} {labels}: {len(found)} samples"
    return found[0]


def available(samples: Iterable[Sample]) -> Iterator[str]:
    """Names of the series that have a value (not NaN)."""
    return (s.spec.name for s in samples if not math.isnan(s.value))


def run_child(
    script: str, library: Path | None, control: Path, **env_vars: str
) -> dict[str, object]:
    """Run ``script`` in a fresh interpreter (its own pynvml state); it prints one JSON line.

    The script sees ``LIB`` (the library path or None) as a global; ``env_vars`` are added to
    its environment.
    """
    env = dict(os.environ, FAKE_NVML_CONTROL=str(control), **env_vars)
    prelude = f"LIB = {str(library)!r}\n" if library else "LIB = None\n"
    r = subprocess.run(
        [sys.executable, "-c", prelude + script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))
