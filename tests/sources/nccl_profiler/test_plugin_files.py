"""The receiver reads a real unprivileged trainer's plugin file, and refuses files that are not
the live process's own: another user's file under a root process's pid, a symbolic link, a file
left by an earlier process, a file of the wrong size or layout."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bpfdyno.core.status import PartState
from bpfdyno.sources.nccl_profiler import layout
from bpfdyno.sources.nccl_profiler.build import build_plugin
from bpfdyno.sources.nccl_profiler.collector import NcclProfilerCollector
from bpfdyno.sources.nccl_profiler.receiver import NcclProfilerReceiver

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tracing"))
from local_user import LocalUser, local_user  # noqa: E402

pytestmark = pytest.mark.root

TRAINER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from nccl_harness import Plugin
p = Plugin(Path(sys.argv[2]))
rc, ctx, mask = p.init(0x77, name="world", nranks=2, rank=1)
assert rc == 0, rc
p.now = 100
c = p.start_coll(ctx, seq=5, count=10, datatype="ncclInt64")
p.now = 400
p.stop(c)
print("ready", flush=True)
sys.stdin.readline()
p.finalize(ctx)
"""


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(library, shm dir) that any user can reach: the library 0755, the dir 1777."""
    top = Path(tempfile.mkdtemp(prefix="bdtnccl-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        library = build_plugin(top / "lib")
        os.chmod(top / "lib", 0o755)
        shm = top / "shm"
        shm.mkdir()
        os.chmod(shm, 0o1777)
        yield library, shm
    finally:
        shutil.rmtree(top, ignore_errors=True)


def start_trainer(user: LocalUser, library: Path, shm: Path) -> subprocess.Popen[str]:
    argv = user.wrap([sys.executable, "-c", TRAINER, str(HERE), str(library)])
    proc = subprocess.Popen(
        argv, env=user.env(BPFDYNO_NCCL_SHM_DIR=str(shm)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=user.home,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line != "ready\n":
        proc.kill()
        raise AssertionError(f"trainer did not start: {line!r} {proc.communicate()[1]}")
    return proc


def stop_trainer(proc: subprocess.Popen[str]) -> None:
    proc.communicate("\n", timeout=30)
    assert proc.returncode == 0


def test_unprivileged_trainer_is_read_by_its_pid(shared: tuple[Path, Path]) -> None:
    library, shm = shared
    with local_user() as user:
        proc = start_trainer(user, library, shm)
        try:
            path = shm / f"bpfdyno-nccl.{proc.pid}"
            assert path.stat().st_uid == user.uid
            receiver = NcclProfilerReceiver(shm_dir=shm)
            receiver.poll()
            rank = receiver.snapshot()[proc.pid]
            assert (rank.rank, rank.nranks, rank.colls_completed, rank.last_seq) == (1, 2, 1, 5)
            assert (rank.time_in_collectives_ns, rank.bytes) == (300, 80)
            # Full mode is asked of it through the same checked file.
            assert receiver.request_detail(5.0) == [proc.pid]
        finally:
            stop_trainer(proc)
        assert not path.exists()


def test_files_that_are_not_the_live_process_own_are_refused(shared: tuple[Path, Path]) -> None:
    library, shm = shared
    with local_user() as user:
        proc = start_trainer(user, library, shm)
        try:
            real = (shm / f"bpfdyno-nccl.{proc.pid}").read_bytes()
            # The user's file under the name of a root process (this test's own pid).
            squat = shm / f"bpfdyno-nccl.{os.getpid()}"
            squat.write_bytes(real)
            os.chown(squat, user.uid, user.gid)
            # A link to the user's real file, named after another root process.
            link = shm / "bpfdyno-nccl.1"
            link.symlink_to(shm / f"bpfdyno-nccl.{proc.pid}")
            receiver = NcclProfilerReceiver(shm_dir=shm)
            receiver.poll()
            assert set(receiver.snapshot()) == {proc.pid}
            assert receiver.rejected[str(squat)] == (
                f"owned by uid {user.uid}, but process {os.getpid()} runs as 0"
            )
            assert receiver.rejected[str(link)] == (
                f"not a regular file of {layout.FILE_BYTES} bytes"
            )
            status = receiver.status()
            assert status.state == PartState.DEGRADED
            assert status.reason.startswith("2 plugin file(s) refused")

            # Root's own file, but the header of another process: left by an earlier one.
            os.chown(squat, 0, 0)
            link.unlink()
            receiver.poll()
            assert receiver.rejected == {
                str(squat): f"left by an earlier process {os.getpid()} (start time differs)"
            }
            # Wrong size, then the right size without the plugin's magic.
            squat.write_bytes(real[:100])
            receiver.poll()
            assert receiver.rejected[str(squat)] == (
                f"not a regular file of {layout.FILE_BYTES} bytes"
            )
            squat.write_bytes(bytes(layout.FILE_BYTES))
            receiver.poll()
            assert "no plugin magic" in receiver.rejected[str(squat)]
            assert set(receiver.snapshot()) == {proc.pid}
        finally:
            stop_trainer(proc)


def test_trainer_in_its_own_namespaces_is_read_through_its_root(
    shared: tuple[Path, Path],
) -> None:
    # Like a container: its own pid namespace (it is pid 1 there: its file is bpfdyno-nccl.1)
    # and mount namespace, with a tmpfs at box/ in which the shm dir, box/link, is an absolute
    # link to box/target. On the host box/target holds a decoy: following the link from the
    # agent's root instead of the trainer's would read the decoy.
    library, shm = shared
    box = shm.parent / "box"
    (box / "target").mkdir(parents=True)
    (box / "target" / "bpfdyno-nccl.1").write_bytes(bytes(layout.FILE_BYTES))
    link = box / "link"
    script = (
        f"mount -t tmpfs none {box} && mkdir {box / 'target'} && "
        f'ln -s {box / "target"} {link} && exec "$@"'
    )
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
         "sh", "-c", script, "sh", sys.executable, "-c", TRAINER, str(HERE), str(library)],
        env={**os.environ, "BPFDYNO_NCCL_SHM_DIR": str(link)}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "ready\n", proc.stderr.read() if proc.stderr else ""
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        trainer = int(children[0])
        status = Path(f"/proc/{trainer}/status").read_text().splitlines()
        assert next(x for x in status if x.startswith("NSpid:")).split()[1:] == [str(trainer), "1"]
        receiver = NcclProfilerReceiver(shm_dir=link)
        receiver.poll()
        assert receiver.snapshot() == {}  # the agent's own view has no such directory
        receiver.poll([trainer])
        assert receiver.rejected == {}
        rank = receiver.snapshot()[trainer]
        assert (rank.rank, rank.colls_completed, rank.last_seq, rank.bytes) == (1, 1, 5, 80)
        assert receiver.request_detail(5.0) == [trainer]
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    # The request went into the trainer's file, not the decoy.
    assert (box / "target" / "bpfdyno-nccl.1").read_bytes() == bytes(layout.FILE_BYTES)


FORKER = r"""
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from nccl_harness import Plugin
p = Plugin(Path(sys.argv[2]))
_, parent_ctx, _ = p.init(0x10, name="parent", nranks=2, rank=0)
child = os.fork()
if child == 0:
    _, ctx, _ = p.init(0x20, name="child", nranks=4, rank=3)
    p.stop(p.start_coll(ctx, seq=1))
    os.write(1, f"{os.getpid()}\n".encode())  # one write: the two processes share the pipe
    sys.stdin.readline()
    p.finalize(ctx)
    os._exit(0)
os.write(1, f"{os.getpid()}\n".encode())
os.waitpid(child, 0)
p.finalize(parent_ctx)
"""


def test_a_child_forked_after_nccl_started_gets_its_own_file(
    shared: tuple[Path, Path],
) -> None:
    library, shm = shared
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKER, str(HERE), str(library)],
        env={**os.environ, "BPFDYNO_NCCL_SHM_DIR": str(shm)}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        pids = {int(proc.stdout.readline()), int(proc.stdout.readline())}
        receiver = NcclProfilerReceiver(shm_dir=shm)
        receiver.poll()
        snapshot = receiver.snapshot()
        assert set(snapshot) == pids
        child = snapshot[max(pids, key=lambda p: p != proc.pid)]
        parent = snapshot[proc.pid]
        assert [c.name for c in parent.comms] == ["parent"]
        assert (parent.colls_completed, child.rank, child.colls_completed) == (0, 3, 1)
        assert [c.name for c in child.comms] == ["child"]
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0


def _opens_of(path: Path) -> Callable[[], int]:
    """A counter of the opens of path (inotify IN_OPEN), read by calling it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, str(path).encode(), 0x20) >= 0  # IN_OPEN

    def count() -> int:
        try:
            events = os.read(fd, 4096)
        except BlockingIOError:
            return 0
        return len(events) // 16  # struct inotify_event, no name for a watched file

    return count


def test_what_is_not_a_regular_file_is_never_opened(tmp_path: Path) -> None:
    # A FIFO (it could be a device) under a live process's name: looked at, not opened.
    shm = tmp_path / "shm"
    shm.mkdir()
    fifo = shm / f"bpfdyno-nccl.{os.getpid()}"
    os.mkfifo(fifo, 0o600)
    opens = _opens_of(fifo)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    receiver.poll()
    assert receiver.rejected == {str(fifo): f"not a regular file of {layout.FILE_BYTES} bytes"}
    assert opens() == 0


AGENT = """
import sys
from pathlib import Path
from bpfdyno.sources.nccl_profiler.receiver import NcclProfilerReceiver
r = NcclProfilerReceiver(shm_dir=Path(sys.argv[1]))
r.poll()
print(sorted(r.snapshot()), r.rejected, r.request_detail(60.0))
"""


def test_the_packaged_units_agent_reads_and_asks_full_mode_of_another_users_trainer(
    shared: tuple[Path, Path],
) -> None:
    # The agent as the systemd unit runs it: its own user, CAP_DAC_READ_SEARCH (reads any
    # file, writes none), CAP_SETUID/CAP_SETGID: it writes the trainer's file as its owner.
    library, shm = shared
    with local_user() as trainer_user, local_user() as agent_user:
        proc = start_trainer(trainer_user, library, shm)
        try:
            path = shm / f"bpfdyno-nccl.{proc.pid}"
            argv = agent_user.wrap([sys.executable, "-c", AGENT, str(shm)], unit=True)
            done = subprocess.run(
                argv, env=agent_user.env(), capture_output=True, text=True, timeout=120,
                cwd=agent_user.home,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout == f"[{proc.pid}] {{}} [{proc.pid}]\n", done.stderr
            header = layout.decode_header(path.read_bytes())
            assert header.detail_until_ns > time.monotonic_ns()
            assert path.stat().st_uid == trainer_user.uid  # still the trainer's
        finally:
            stop_trainer(proc)


SQUATTED = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from nccl_harness import Plugin
p = Plugin(Path(sys.argv[2]))
Path(sys.argv[3]).write_text(str(os.getpid()))
while not Path(sys.argv[4]).exists():
    pass
rc, ctx, _ = p.init(0x77)
print(rc, ctx, p.logged[0] if p.logged else "")
"""


def test_a_file_another_user_put_under_the_trainers_name_is_never_written(
    shared: tuple[Path, Path],
) -> None:
    # Another user guesses the trainer's pid and makes the file first: the plugin neither
    # writes into it nor follows it; its init fails (NCCL runs on without it) and says why.
    library, shm = shared
    with local_user() as trainer_user, local_user() as other:
        pid_file, go = trainer_user.home / "pid", trainer_user.home / "go"
        argv = [sys.executable, "-c", SQUATTED, str(HERE), str(library), str(pid_file), str(go)]
        proc = subprocess.Popen(
            trainer_user.wrap(argv), env=trainer_user.env(BPFDYNO_NCCL_SHM_DIR=str(shm)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=trainer_user.home,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.05)
        squat = shm / f"bpfdyno-nccl.{pid_file.read_text()}"
        squat.write_bytes(b"theirs")
        os.chown(squat, other.uid, other.gid)
        os.chmod(squat, 0o666)  # even one the trainer could write
        go.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        rc, ctx, message = out.split(" ", 2)
        assert (rc, ctx) == ("2", "0")
        assert message.startswith("bpfdyno NCCL profiler: cannot create %s: %s;")
        assert (squat.read_bytes(), squat.stat().st_uid) == (b"theirs", other.uid)


EXITS = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from nccl_harness import Plugin
p = Plugin(Path(sys.argv[2]))
rc, ctx, _ = p.init(0x77)
p.stop(p.start_coll(ctx, seq=0))
print(json.dumps(sorted(f.name for f in Path(sys.argv[3]).iterdir())), flush=True)
sys.exit(0)  # no finalize, as a job that never destroys its process group
"""


def test_a_trainer_that_exits_without_finalizing_takes_its_file(
    shared: tuple[Path, Path],
) -> None:
    library, shm = shared
    done = subprocess.run(
        [sys.executable, "-c", EXITS, str(HERE), str(library), str(shm)],
        env={**os.environ, "BPFDYNO_NCCL_SHM_DIR": str(shm)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid_files = [n for n in json.loads(done.stdout) if n.startswith("bpfdyno-nccl.")]
    assert len(pid_files) == 1  # it had its file while it ran
    assert list(shm.iterdir()) == []


def test_the_reader_keeps_the_normal_cadence_only_while_a_trainers_file_is_read(
    shared: tuple[Path, Path],
) -> None:
    """While no trainer uses the plugin nothing fills between rounds: the collector lets the
    daemon look for files at its slow cadence while nobody reads (any interval keeps up).
    While a real trainer's file is read, no longer interval than the normal one does."""
    library, shm = shared
    collector = NcclProfilerCollector(shm_dir=shm)
    collector.collect()
    assert collector.longest_interval_s() == float("inf")
    with local_user() as user:
        proc = start_trainer(user, library, shm)
        try:
            collector.collect()
            assert collector.longest_interval_s() == 0.0
        finally:
            stop_trainer(proc)
    collector.collect()
    assert collector.longest_interval_s() == float("inf")
