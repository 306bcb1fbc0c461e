"""Status and doctor say whether trainers use the NCCL profiler plugin (and can build it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from nccl_harness import Plugin

from bpfdyno.app.doctor import check_nccl_profiler
from bpfdyno.core.status import PartState
from bpfdyno.sources.nccl_profiler.build import build_plugin
from bpfdyno.sources.nccl_profiler.collector import NcclProfilerCollector


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plugin]:
    monkeypatch.setenv("BPFDYNO_NCCL_SHM_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    p = Plugin(build_plugin(tmp_path / "lib"))
    yield p
    p.close()


def test_collector_reports_the_trainers_using_the_plugin(plugin: Plugin, tmp_path: Path) -> None:
    collector = NcclProfilerCollector(shm_dir=tmp_path / "shm")
    assert collector.collect() == ()
    state, reason = collector.health() or (None, "")
    assert state == PartState.OK
    assert reason.startswith(f"no trainer publishes NCCL profiler data in {tmp_path / 'shm'}")
    _, ctx, _ = plugin.init(1, nranks=2, rank=0)
    collector.collect()
    assert collector.health() == (PartState.OK, f"in use by 1 trainer process(es): {os.getpid()}")
    assert list(collector.receiver.snapshot()) == [os.getpid()]
    plugin.finalize(ctx)


def test_doctor_names_the_plugin_in_use_or_how_to_build_it(
    plugin: Plugin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    check = check_nccl_profiler(shm)
    assert (check.ok, check.required) == (True, False)
    assert check.detail.startswith("not in use; /usr/bin/cc can build libbpfdyno-nccl-profiler.so")
    monkeypatch.setenv("CC", "no-such-cc")
    check = check_nccl_profiler(shm)
    assert check.ok is None
    assert check.detail == (
        "not in use; no C compiler ('no-such-cc') on PATH to build libbpfdyno-nccl-profiler.so: "
        "install one (Debian/Ubuntu: apt-get install gcc) or set CC to its path"
    )
    _, ctx, _ = plugin.init(1)
    check = check_nccl_profiler(shm)
    assert (check.ok, check.detail) == (True, f"in use by 1 trainer process(es): {os.getpid()}")
    plugin.finalize(ctx)
