"""``bpfdyno run -- CMD``: run a job step's command with an agent on its node.

When the node's agent (systemd, DaemonSet, a SLURM prolog) is up, the command just runs.
Otherwise the first task on the node starts one agent for every task of this user there,
and the last task to end stops it:

- every task holds a *shared* lock on ``<state dir>/users.lock`` while its command runs
  (the kernel drops it when the task ends, however it ends);
- starting happens under an exclusive ``<state dir>/start.lock``, so several tasks starting
  at once start one agent, on one socket (``<state dir>/bpfdyno.sock``): no port or socket
  clash however many tasks share the node;
- a small supervisor (``python -m bpfdyno.app.job_agent supervise``), in its own session,
  runs ``bpfdyno serve``, waits for its ``READY=1`` (the systemd notify protocol), then waits
  for the *exclusive* lock on ``users.lock``: it gets it once no task holds it, stops the
  agent and exits. The agent dies with the supervisor (``PR_SET_PDEATHSIG``) and the command
  with its task, so nothing is left behind even when something is SIGKILLed.

If no agent can be started (no Python, a broken config, a state directory that is not safe),
the command runs anyway with a warning: monitoring never stops a job.

The state directory holds the socket the task is pointed at and files the task writes, so
it must be the user's alone (`private_state_dir`): ``$XDG_RUNTIME_DIR/bpfdyno`` (systemd's
per-user ``/run/user/<uid>``), else ``$TMPDIR/bpfdyno-<uid>`` (``/tmp``), created mode 0700
and checked on the opened directory — a directory someone else planted there (with links
named like its files, or a socket of theirs) is refused, never used — and every file in it
is opened without following links.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

USERS_LOCK = "users.lock"
START_LOCK = "start.lock"
SOCKET = "bpfdyno.sock"
STATE = "state"  # "starting", "ready <agent pid>", "failed <why>", "stopped"
NOTIFY = "notify.sock"
AGENT_LOG = "agent.log"

#: How long a starting agent may take (BPF compiles on a busy node).
READY_TIMEOUT_S = 120.0
#: How long a stopping agent may take before it is killed.
STOP_TIMEOUT_S = 30.0
#: How long `bpfdyno run` waits for the node's agent to hand out the user's socket directory
#: (an interpreter's start included).
SOCKET_DIR_TIMEOUT_S = 10.0
#: What the task's command and the agent run under: SIGTERM when `bpfdyno run` (or the
#: supervisor) dies, so nothing is orphaned. util-linux's setpriv, not a preexec_fn: that
#: makes subprocess fork() the whole threaded process, where gRPC's fork handler can wait
#: for open calls for good.
DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "TERM", "--")


def default_state_dir() -> Path:
    """``/run/bpfdyno/job`` for root, else ``$XDG_RUNTIME_DIR/bpfdyno`` or
    ``$TMPDIR/bpfdyno-<uid>`` (per user: tasks of one user share an agent; another user's
    tasks use the node's agent or their own)."""
    if os.geteuid() == 0:
        return Path("/run/bpfdyno/job")
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return Path(runtime) / "bpfdyno"
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"bpfdyno-{os.geteuid()}"


class UnsafeStateDir(Exception):
    """The state directory could be someone else's; the message says why and what to do."""


def private_state_dir(path: Path) -> Path:
    """``path`` as a directory only this user controls: created mode 0700 if missing, and
    checked (on the opened directory, not through links) to be ours and closed to others,
    in a parent nobody else can rename it in. Returns it with links resolved.

    Raises:
        UnsafeStateDir: it belongs to someone else, others may use it, or it is a link or
            not a directory — or its parent lets others replace it.
    """
    me = os.geteuid()
    parent = Path(os.path.realpath(path.parent))
    _check_parents(parent, me)
    path = parent / path.name
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        is_link = os.path.islink(path)  # O_DIRECTORY | O_NOFOLLOW on a link: ENOTDIR
        what = "a symbolic link" if is_link else f"unusable ({e.strerror})"
        raise UnsafeStateDir(f"{path} is {what}; {_FIX}") from e
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != me:
        raise UnsafeStateDir(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {me}): someone else made "
            f"it, and could read or replace what the agent keeps there; {_FIX}"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise UnsafeStateDir(
            f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):o}); check what is in "
            f"it, then chmod 700 {path} (or {_FIX})"
        )
    return path


_FIX = "remove it if it is not yours, or give --state-dir a directory only you can use"


def _check_parents(directory: Path, me: int) -> None:
    """Every directory from / down to ``directory`` (no links: resolved) is root's or ours
    and not writable by others, unless sticky (others cannot rename what is ours there)."""
    current = Path("/")
    for part in (*directory.parts[1:], None):
        st = os.lstat(current)
        if st.st_uid not in (0, me) or (
            st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX
        ):
            raise UnsafeStateDir(
                f"{current} (above the state directory) can be changed by others (owner uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): they could swap the state "
                "directory; give --state-dir a directory under one only you and root control"
            )
        if part is None:
            return
        current = current / part


def _open_nofollow(path: Path, flags: int) -> int:
    """Open a file of the state directory, never through a link."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _write_state(state_dir: Path, text: str) -> None:
    fd = _open_nofollow(state_dir / STATE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _read_state(state_dir: Path) -> str:
    fd = _open_nofollow(state_dir / STATE, os.O_RDONLY)
    with os.fdopen(fd) as f:
        return f.read(4096)


def agent_listening(path: str | os.PathLike[str]) -> bool:
    """Whether an agent listens on the Unix socket ``path``.

    A socket we may not connect to (EACCES: the node's agent, group bpfdyno) still means an
    agent is up: trainers reach it through the Kineto IPC socket, which has no permissions.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(2)
        try:
            s.connect(os.fspath(path))
        except PermissionError:
            return True
        except OSError:
            return False
    return True


def run(
    cmd: Sequence[str],
    *,
    node_socket: str,
    state_dir: Path,
    serve_args: Sequence[str] = (),
    out: Callable[[str], None] = lambda msg: print(f"bpfdyno run: {msg}", file=sys.stderr),
) -> int:
    """Run ``cmd`` with an agent on this node; returns its exit status (128+N if signalled).

    Args:
        cmd: the command and its arguments.
        node_socket: where the node's agent listens, if it runs.
        state_dir: where this user's job agent keeps its socket, locks and log.
        serve_args: extra ``bpfdyno serve`` arguments (``--config``, ``--set``...) for an
            agent started here.
        out: prints the few lines the user should see.
    """
    env = dict(os.environ)
    env.setdefault("KINETO_USE_DAEMON", "1")
    if agent_listening(node_socket):
        _use_own_socket_dir(node_socket, env, out)
        return _run_command(cmd, env)
    try:
        state_dir = private_state_dir(state_dir)
    except (UnsafeStateDir, OSError) as e:
        out(f"no agent started ({e}); running the command without one")
        return _run_command(cmd, env)
    # Held until this process exits: the agent stays while any task of the node needs it.
    users = _open_nofollow(state_dir / USERS_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(users, fcntl.LOCK_SH)
    sock = state_dir / SOCKET
    with _locked(state_dir / START_LOCK):
        if not agent_listening(sock):
            problem = _start_supervisor(state_dir, serve_args)
            if problem:
                out(f"no agent on this node ({problem}); running the command without one")
            else:
                out(f"started an agent for this node's tasks on {sock}")
    env["BPFDYNO_TARGET"] = str(sock)
    try:
        return _run_command(cmd, env)
    finally:
        os.close(users)


def _use_own_socket_dir(node_socket: str, env: dict[str, str], out: Callable[[str], None]) -> None:
    """Give the command this user's own Kineto socket directory, if the node's agent serves
    the per-user layout: there nobody else on the node can configure its trainers.

    Asked by ``bpfdyno kineto-dir`` in a process of its own: gRPC's threads in this one
    would make the command's start (a fork) print warnings on the job's stderr.
    """
    from bpfdyno.tracing.ipc.user_dirs import NO_LAYOUT

    try:
        r = subprocess.run(
            [sys.executable, "-m", "bpfdyno", "kineto-dir", "--socket", node_socket],
            capture_output=True,
            text=True,
            timeout=SOCKET_DIR_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if k != "BPFDYNO_TARGET"},
        )
    except subprocess.TimeoutExpired:
        out("trainers use the agent's shared Kineto socket (it did not answer in time)")
        return
    path = r.stdout.strip()
    if r.returncode != 0 or not path.startswith("/"):
        if NO_LAYOUT not in r.stderr:
            out(f"trainers use the agent's shared Kineto socket ({r.stderr.strip()[-300:]})")
        return
    old = env.get("KINETO_IPC_SOCKET_DIR")
    if old and old != path:
        out(f"KINETO_IPC_SOCKET_DIR={old} replaced by your own directory {path}")
    env["KINETO_IPC_SOCKET_DIR"] = path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[int]:
    fd = _open_nofollow(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _start_supervisor(state_dir: Path, serve_args: Sequence[str]) -> str:
    """Start the supervisor and wait for its agent; "" when ready, else what went wrong."""
    _write_state(state_dir, "starting\n")
    log_fd = _open_nofollow(state_dir / AGENT_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with os.fdopen(log_fd, "ab") as agent_log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "bpfdyno.app.job_agent", "supervise", str(state_dir),
             "--", *serve_args],
            stdin=subprocess.DEVNULL, stdout=agent_log, stderr=agent_log,
            start_new_session=True,  # not in the task's process group: it outlives the task
        )  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT_S + 10
    while time.monotonic() < deadline:
        text = _read_state(state_dir).strip()
        if text.startswith("ready"):
            return ""
        if text.startswith("failed") or supervisor.poll() is not None:
            why = text.removeprefix("failed").strip() or f"exit {supervisor.poll()}"
            return f"{why}; see {state_dir / AGENT_LOG}"
        time.sleep(0.05)
    return f"the agent was not ready within {READY_TIMEOUT_S:.0f} s; see {state_dir / AGENT_LOG}"


def _run_command(cmd: Sequence[str], env: dict[str, str]) -> int:
    """Run ``cmd`` as a child that dies with us; forward termination signals to it."""
    if shutil.which(cmd[0], path=env.get("PATH")) is None:
        print(
            f"bpfdyno run: cannot run {cmd[0]!r}: not found on PATH or not executable",
            file=sys.stderr,
        )
        return 127
    try:
        child = subprocess.Popen([*DIE_WITH_PARENT, *cmd], env=env)
    except OSError as e:
        print(f"bpfdyno run: cannot run {cmd[0]!r}: {e.strerror}", file=sys.stderr)
        return 127 if e.errno == errno.ENOENT else 126

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    rc = child.wait()
    return 128 - rc if rc < 0 else rc


# --- the supervisor ----------------------------------------------------------------------


def supervise(state_dir: Path, serve_args: Sequence[str]) -> int:
    """Run the agent until no task holds ``users.lock``; then stop it and exit."""
    notify_path = state_dir / NOTIFY
    with contextlib.suppress(FileNotFoundError):
        notify_path.unlink()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    notify.bind(str(notify_path))
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path)}
    agent = subprocess.Popen(
        [*DIE_WITH_PARENT, sys.executable, "-m", "bpfdyno", "serve", "--socket",
         str(state_dir / SOCKET), *serve_args],
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not _wait_ready(notify, agent):
        _write_state(state_dir, f"failed the agent exited ({agent.poll()}) or was not ready\n")
        _stop_agent(agent)
        return 1
    _write_state(state_dir, f"ready {agent.pid}\n")
    users = _open_nofollow(state_dir / USERS_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        while not stopping and agent.poll() is None:
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.5)  # a task still runs
                continue
            break  # no task holds it: done (and new tasks wait until the agent is gone)
        _stop_agent(agent)
        _write_state(state_dir, "stopped\n")
    finally:
        os.close(users)  # lets tasks waiting for the shared lock start a new agent
        notify.close()
    return 0


def _wait_ready(notify: socket.socket, agent: subprocess.Popen[bytes]) -> bool:
    notify.settimeout(0.5)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and agent.poll() is None:
        try:
            message = notify.recv(4096).decode(errors="replace")
        except TimeoutError:
            continue
        if "READY=1" in message.split("\n"):
            return True
    return False


def _stop_agent(agent: subprocess.Popen[bytes]) -> None:
    if agent.poll() is None:
        agent.terminate()
        try:
            agent.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bpfdyno.app.job_agent supervise STATE_DIR -- SERVE_ARGS...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] != "supervise" or args[2] != "--":
        print("usage: python -m bpfdyno.app.job_agent supervise STATE_DIR -- [SERVE ARGS...]",
              file=sys.stderr)  # fmt: skip
        return 2
    return supervise(Path(args[1]), args[3:])


if __name__ == "__main__":
    sys.exit(main())
