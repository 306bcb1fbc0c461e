"""The plugin driven from two threads as NCCL drives it (stress_driver.c: the launching thread
enqueues collectives, a proxy thread behind it runs their parts, mostly after the enqueue), read
by the receiver while they run; and the same under ThreadSanitizer."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from bpfdyno.sources.nccl_profiler import layout
from bpfdyno.sources.nccl_profiler.build import CFLAGS, build_plugin, source_dir
from bpfdyno.sources.nccl_profiler.receiver import NcclProfilerReceiver

HERE = Path(__file__).resolve().parent
N = 1500  # with their updates, every record still fits in the ring


def driver(out: Path, *flags: str) -> Path:
    subprocess.run(
        ["cc", "-O1", "-g", "-pthread", *flags, f"-I{source_dir()}", "-o", str(out),
         str(HERE / "stress_driver.c"), "-ldl"],
        check=True,
    )  # fmt: skip
    return out


def test_two_threads_give_exact_aggregates_read_while_they_run(tmp_path: Path) -> None:
    library = build_plugin(tmp_path / "lib")
    shm = tmp_path / "shm"
    shm.mkdir()
    proc = subprocess.Popen(
        [str(driver(tmp_path / "stress")), str(library), str(N)],
        env={**os.environ, "BPFDYNO_NCCL_SHM_DIR": str(shm)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    receiver = NcclProfilerReceiver(shm_dir=shm)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    polls = 0
    seen = 0
    out = ""
    try:
        while "done\n" not in out:
            with contextlib.suppress(BlockingIOError):
                out += os.read(fd, 64).decode()
            assert proc.poll() is None, proc.returncode
            receiver.poll()
            rank = receiver.snapshot().get(proc.pid)
            if rank is None:
                continue
            polls += 1
            # A consistent slot: bytes come with the count under the same sequence lock.
            assert rank.bytes == rank.colls_completed * 4096
            assert seen <= rank.colls_completed <= rank.colls_started <= N
            seen = rank.colls_completed
        receiver.poll()
        rank = receiver.snapshot()[proc.pid]
        assert (rank.colls_started, rank.colls_completed, rank.in_flight) == (N, N, 0)
        assert (rank.last_seq, rank.bytes, rank.colls_dropped) == (N - 1, N * 4096, 0)
        assert rank.gpu_time_ns == N * 40  # each collective's one channel: 40 ns of GPU time
        # Each collective's last record holds its final values; the aggregates are their sums.
        final: dict[int, layout.Record] = {}
        for r in receiver.drain_records(proc.pid) or _ring(shm / f"bpfdyno-nccl.{proc.pid}"):
            final[r.seq] = r
        assert sorted(final) == list(range(N))
        assert rank.time_in_collectives_ns == sum(r.duration_ns for r in final.values())
        assert rank.net_wait_ns == sum(r.net_wait_ns for r in final.values())
        assert rank.records_lost == 0
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    print(f"{polls} reads while it ran")


def _ring(path: Path) -> list[layout.Record]:
    """The collective records (and updates) in a plugin file's ring, in order."""
    data = path.read_bytes()
    head = layout.decode_header(data).ring_head
    records = [
        layout.decode_record(data, layout.RING_OFFSET + (i % layout.RING_RECORDS) * 80)
        for i in range(max(0, head - layout.RING_RECORDS), head)
    ]
    kinds = (layout.RecordKind.COLL, layout.RecordKind.COLL_UPDATE)
    return [r for r in records if r.kind in kinds]


def test_no_data_race_under_thread_sanitizer(tmp_path: Path) -> None:
    probe = subprocess.run(
        ["cc", "-fsanitize=thread", "-x", "c", "-", "-o", str(tmp_path / "probe")],
        input="int main(void){return 0;}", text=True, capture_output=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"the C compiler here has no ThreadSanitizer: {probe.stderr.strip()}")
    library = tmp_path / "libtsan-plugin.so"
    # Its fences order the shared file for the agent (another process), which TSan does not model.
    flags = [f for f in CFLAGS if f != "-O2"] + ["-Wno-error=tsan", "-Wno-tsan"]
    subprocess.run(
        ["cc", *flags, "-O1", "-g", "-fsanitize=thread", "-o", str(library),
         str(source_dir() / "plugin.c")],
        check=True,
    )  # fmt: skip
    shm = tmp_path / "shm"
    shm.mkdir()
    done = subprocess.run(
        [str(driver(tmp_path / "stress", "-fsanitize=thread")), str(library), "400"],
        env={**os.environ, "BPFDYNO_NCCL_SHM_DIR": str(shm), "TSAN_OPTIONS": "exitcode=66"},
        input="\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-4000:]
    assert (done.returncode, done.stdout) == (0, "done\n")
