"""Where a traced process may write its trace: only where nobody else can tamper with it.

Kineto, running as the traced process's user (often root), opens ``<file>.tmp``, follows
any symbolic link it finds there, writes, then renames to the final name. In a directory
another user can write, that user can plant ``<name>_<pid>.json.tmp -> /etc/shadow`` and a
root trainer overwrites the victim (dynolog allows exactly this), or receive a root
process's trace in a directory of theirs. So before a config is stored, and again just
before it is handed to the process, the file's directory must be one that only root and the
process's owner control:

* every directory from ``/`` down to it (symbolic links resolved, each link owned by root or
  the owner) belongs to root or the owner, and nobody else may write it — unless it has
  the sticky bit, which stops others from moving entries they do not own
  (rule ``unsafe_directory``);
* if the directory itself is shared (sticky and writable by others, like ``/tmp``), the
  kernel must refuse to follow links and open files other users planted there
  (``fs.protected_symlinks``, ``fs.protected_hardlinks``, ``fs.protected_regular``), because
  a link can appear between this check and Kineto's open (rule
  ``shared_directory_unprotected``);
* the directory exists (rule ``missing_directory``), and neither the final name nor
  ``<name>.tmp`` exists yet (rules ``would_overwrite``, ``tmp_exists``);
* the owner can create files there (rule ``directory_not_writable``);
* the owner can enter every directory on the way (rule ``directory_not_reachable``). This
  one is checked before anything inside a directory is looked at, and its answer is the
  same words whatever lies beyond (nothing, a file, a link and where it points, another
  user's directory): the check runs with the agent's rights, and must not tell a user what
  she could not see herself. Nor does it take longer for one than another: the walk stops
  at the directory she may not enter.

A process in another mount namespace (a container) is checked through
``/proc/<pid>/root`` (`mount_root`), so the rules apply to the directory it will really write
into; the trace tracker and the kernel tracks' merge reach its file the same way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.core.errors import InvalidArgument, PermissionDenied, RequestError
from bpfdyno.core.identity import ROOT_UID, primary_gid, user_groups, user_name
from bpfdyno.core.pidfs import read_status, status_ints
from bpfdyno.tracing.paths import TMP_SUFFIX
from bpfdyno.tracing.policy import describe_uid

#: Symbolic links followed while resolving one directory (the kernel's own limit).
MAX_SYMLINKS = 40
#: The kernel's protections for shared sticky directories, and the least value each needs.
PROTECTIONS = {
    "fs.protected_symlinks": 1,
    "fs.protected_hardlinks": 1,
    "fs.protected_regular": 1,
}


@dataclass(frozen=True, slots=True)
class Writer:
    """The process that will write a trace file.

    Attributes:
        uid: its owner (the uid the kernel attached to its polls); None when unknown, which
            is treated like root (only root-controlled directories pass).
        host_pid: its pid in the daemon's namespace, to see its mount namespace and groups;
            0 when unknown.
    """

    uid: int | None
    host_pid: int = 0


def mount_root(host_pid: int, proc_root: Path = Path("/proc")) -> str:
    """Where this agent sees the file system of process ``host_pid``: "" when it shares the
    agent's mount namespace (or is unknown, 0), ``/proc/<pid>/root`` when it is in another
    one (a container): prefix a path the process names with it to reach the same file."""
    if not host_pid:
        return ""
    try:
        theirs = os.stat(proc_root / str(host_pid) / "ns" / "mnt").st_ino
        ours = os.stat(proc_root / "self" / "ns" / "mnt").st_ino
    except OSError:
        return ""
    return "" if theirs == ours else str(proc_root / str(host_pid) / "root")


def read_protections(proc_sys: Path = Path("/proc/sys")) -> dict[str, int]:
    """The current value of each of `PROTECTIONS` (0 when unreadable)."""
    values = {}
    for name in PROTECTIONS:
        try:
            values[name] = int((proc_sys / name.replace(".", "/")).read_text())
        except (OSError, ValueError):
            values[name] = 0
    return values


def _rejected(rule: str, message: str) -> RequestError:
    text = f"trace file rejected by rule '{rule}': {message}"
    if rule in ("would_overwrite", "tmp_exists", "missing_directory"):
        return InvalidArgument(text, rule=rule)
    return PermissionDenied(text, rule=rule)


def _unreachable(path: str, writer: Writer) -> RequestError:
    """The one answer for every path that passes through a directory the writer may not
    enter: the same words (but the path asked for) whether what lies beyond is missing, a
    file, a link or someone else's, so the refusal reveals nothing its user could not see."""
    return _rejected(
        "directory_not_reachable",
        f"{_writer_text(writer)} cannot reach the directory of {path}: one of the "
        "directories on the way does not exist, is not a directory, or may not be entered "
        "by that user. Name a file in a directory that user can write, or leave out "
        "--log-file (the agent then writes into your own trace directory, [tracing] "
        "user_dirs)",
    )


def _is_own(path: str, writer: Writer, identity: tuple[int, int]) -> bool:
    """Whether ``path`` is still the writer's regular file with this (inode, mtime ns)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == (ROOT_UID if writer.uid is None else writer.uid)
        and (st.st_ino, st.st_mtime_ns) == identity
    )


class PlacementChecker:
    """Checks trace file paths against the rules above.

    Args:
        proc_root: where /proc is (per-process roots, groups and namespaces).
        protections: returns the kernel's link protections (see `read_protections`).
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        protections: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self._proc = proc_root
        self._protections = protections or read_protections

    def check(self, path: str, writer: Writer, own_tmp: tuple[int, int] | None = None) -> None:
        """Refuse ``path`` unless ``writer`` may safely write it now.

        ``own_tmp`` is the (inode, mtime ns) of a ``<name>.tmp`` that the writer's own
        Kineto left when it dropped this trace's config: that file, still a regular file of
        the writer's, is no reason to refuse the config handed out again.

        Raises:
            PermissionDenied: rules ``unsafe_directory``, ``shared_directory_unprotected``,
                ``directory_not_writable``, ``directory_not_reachable``.
            InvalidArgument: rules ``would_overwrite``, ``tmp_exists``, ``missing_directory``.
        """
        root = self._root_of(writer)
        directory, st, shared = self._walk(
            root, os.path.dirname(path) or "/", _trusted(writer), writer, path
        )
        who = _writer_text(writer)
        if shared:
            off = {k: v for k, v in self._protections().items() if v < PROTECTIONS[k]}
            if off:
                settings = " ".join(f"{k}={PROTECTIONS[k]}" for k in off)
                raise _rejected(
                    "shared_directory_unprotected",
                    f"{directory} is shared (sticky and writable by every user) and this "
                    f"kernel follows links other users plant there "
                    f"({', '.join(f'{k} = {v}' for k, v in off.items())}): a link named like "
                    f"the trace could send {who}'s writes anywhere. Use a directory only its "
                    f"owner can write (e.g. mkdir -m 700 {directory}/traces), or leave out "
                    "--log-file (the agent then writes into your own trace directory, "
                    f"[tracing] user_dirs), or enable `sysctl {settings}`",
                )
        if not self._can_create(st, writer):
            raise _rejected(
                "directory_not_writable",
                f"{who} cannot create files in {directory} (owner {describe_uid(st.st_uid)}, "
                f"mode {stat.S_IMODE(st.st_mode):o}); choose a directory it can write",
            )
        for name, rule in ((path, "would_overwrite"), (path + TMP_SUFFIX, "tmp_exists")):
            if (
                rule == "tmp_exists"
                and own_tmp is not None
                and _is_own(root + name, writer, own_tmp)
            ):
                continue
            if os.path.lexists(root + name):
                raise _rejected(
                    rule,
                    f"{name} already exists; Kineto would "
                    f"{'overwrite it' if rule == 'would_overwrite' else 'write through it'}. "
                    "Choose another file name, or move that file away",
                )

    def check_directory(self, directory: str, writer: Writer) -> bool:
        """Check only the directory rules (every component from ``/``) for ``writer``.

        Returns:
            Whether the directory is shared (sticky and writable by others).

        Raises:
            PermissionDenied: rules ``unsafe_directory``, ``directory_not_reachable``.
        """
        root = self._root_of(writer)
        return self._walk(root, directory, _trusted(writer), writer, directory)[2]

    def _root_of(self, writer: Writer) -> str:
        return mount_root(writer.host_pid, self._proc)

    def _walk(
        self, root: str, directory: str, trusted: set[int], writer: Writer, asked: str
    ) -> tuple[str, os.stat_result, bool]:
        """Resolve ``directory`` one component at a time, checking each.

        Nothing inside a directory the writer may not enter is looked at: the walk stops
        there with one answer for all (`_unreachable`, naming only ``asked``, the path the
        request gave).

        Returns:
            (the resolved directory, its stat, whether it is shared: sticky + others write).
        """
        enters = self._enters(writer)
        pending = [c for c in directory.split("/") if c]
        current = "/"
        st = self._lstat(root, current)
        self._check_dir(current, st, trusted, writer)
        links = 0
        while pending:
            if not enters(st):
                raise _unreachable(asked, writer)
            name = pending.pop(0)
            if name == ".":
                continue
            if name == "..":  # only from a link's target: back to a directory already checked
                current = os.path.dirname(current)
                st = self._lstat(root, current)
                continue
            nxt = os.path.join(current, name)
            st = self._lstat(root, nxt)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_SYMLINKS:
                    raise _rejected("unsafe_directory", f"too many symbolic links in {directory}")
                if st.st_uid not in trusted:
                    raise _rejected(
                        "unsafe_directory",
                        f"{nxt} is a symbolic link owned by {describe_uid(st.st_uid)}, who "
                        f"could point it elsewhere at any time; use the real path",
                    )
                target = os.readlink(root + nxt)
                if target.startswith("/"):
                    current = "/"
                pending[:0] = [c for c in target.split("/") if c]
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise _rejected("unsafe_directory", f"{nxt} is not a directory")
            self._check_dir(nxt, st, trusted, writer)
            current = nxt
        if not enters(st):  # the directory itself: its entries are hers to see only if so
            raise _unreachable(asked, writer)
        mode = st.st_mode
        shared = bool(mode & stat.S_ISVTX) and bool(mode & (stat.S_IWGRP | stat.S_IWOTH))
        return current, st, shared

    def _enters(self, writer: Writer) -> Callable[[os.stat_result], bool]:
        """Whether ``writer`` may enter a directory of the given stat (`enters`), by its uid
        and groups (from /proc, else the group database); root and an unknown writer enter
        everything."""
        uid = writer.uid
        if uid is None or uid == ROOT_UID:
            return lambda st: True
        groups = self._groups(writer)
        if groups is None:
            groups = set(user_groups(uid, primary_gid(uid)))
        return lambda st: enters(st, uid, groups)

    def _lstat(self, root: str, path: str) -> os.stat_result:
        try:
            return os.lstat(root + path)
        except FileNotFoundError:
            raise _rejected(
                "missing_directory",
                f"{path} does not exist for the process that would write there, and Kineto "
                "does not create it; create it first (in the process's container, if it runs "
                "in one)",
            ) from None
        except OSError as e:
            raise _rejected("unsafe_directory", f"cannot check {path}: {e.strerror}") from None

    def _check_dir(self, path: str, st: os.stat_result, trusted: set[int], writer: Writer) -> None:
        if st.st_uid not in trusted:
            owners = "root"
            if writer.uid not in (None, ROOT_UID):
                owners += " or " + describe_uid(writer.uid)
            raise _rejected(
                "unsafe_directory",
                f"{path} belongs to {describe_uid(st.st_uid)}, who could replace what is in it "
                f"while {_writer_text(writer)} writes there. Write into a directory of {owners}",
            )
        others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if others_write and not st.st_mode & stat.S_ISVTX:
            who = "its group" if st.st_mode & stat.S_IWGRP else "every user"
            raise _rejected(
                "unsafe_directory",
                f"{path} can be written by {who} (mode {stat.S_IMODE(st.st_mode):o}, no sticky "
                f"bit): they could plant links where {_writer_text(writer)} writes. Remove that "
                f"permission (chmod go-w {path}) or write elsewhere",
            )

    def _can_create(self, st: os.stat_result, writer: Writer) -> bool:
        if writer.uid in (None, ROOT_UID):
            return True
        mode = st.st_mode
        if st.st_uid == writer.uid:
            return bool(mode & stat.S_IWUSR and mode & stat.S_IXUSR)
        groups = self._groups(writer)
        if groups is None or st.st_gid in groups:
            # Unknown groups: do not refuse what might work; Kineto's failure is reported.
            return groups is None or bool(mode & stat.S_IWGRP and mode & stat.S_IXGRP)
        return bool(mode & stat.S_IWOTH and mode & stat.S_IXOTH)

    def _groups(self, writer: Writer) -> set[int] | None:
        """The writer's effective and supplementary groups, from /proc (None: unknown)."""
        if not writer.host_pid:
            return None
        fields = read_status(self._proc, writer.host_pid, ("Gid", "Groups"))
        if fields is None:
            return None
        gids = status_ints(fields, "Gid")  # real, effective, saved, fs
        supplementary = status_ints(fields, "Groups")
        if not gids or supplementary is None:
            return None
        return {gids[1], *supplementary}


def enters(st: os.stat_result, uid: int, groups: set[int]) -> bool:
    """Whether ``uid`` with ``groups`` may enter (search) a directory of stat ``st``: the
    owner's, the group's or others' execute bit, as the kernel picks it."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def visible_to(uid: int) -> Callable[[str], bool]:
    """A test of whether ``uid`` (with its groups in the group database) could look up a
    path itself: every directory the lookup passes through, links followed as the kernel
    follows them, may be entered by that user. A path that stops at something missing or
    not a directory counts as seen (that user gets the same answer from the kernel).

    The agent's own probes of a path a user named (is it a directory, where do its links
    lead) run with the agent's rights; they answer only where this says yes, so a refusal
    tells a user nothing about what lies behind a directory she may not enter.
    """
    if uid == ROOT_UID:
        return lambda path: True
    groups = set(user_groups(uid, primary_gid(uid)))

    def sees(path: str) -> bool:
        pending = [c for c in path.split("/") if c]
        current = "/"
        try:
            st = os.lstat(current)
            links = 0
            while pending:
                if not stat.S_ISDIR(st.st_mode):
                    return True  # the kernel answers ENOTDIR to her too
                if not enters(st, uid, groups):
                    return False
                name = pending.pop(0)
                if name == ".":
                    continue
                if name == "..":
                    current = os.path.dirname(current)
                    st = os.lstat(current)
                    continue
                nxt = os.path.join(current, name)
                st = os.lstat(nxt)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > MAX_SYMLINKS:
                        return True  # ELOOP for her as well
                    target = os.readlink(nxt)
                    current = "/" if target.startswith("/") else current
                    pending[:0] = [c for c in target.split("/") if c]
                    st = os.lstat(current)
                    continue
                current = nxt
        except OSError:
            return True  # missing (or gone meanwhile): she sees that herself
        return True

    return sees


def _trusted(writer: Writer) -> set[int]:
    """Whose directories the writer may use: root's and its own."""
    return {ROOT_UID} if writer.uid is None else {ROOT_UID, writer.uid}


def _writer_text(writer: Writer) -> str:
    pid = f"pid {writer.host_pid}, " if writer.host_pid else ""
    return f"the traced process ({pid}{describe_uid(writer.uid)})"


# -- the per-user trace directories -----------------------------------------------------------
#
# Every user gets a directory that always passes the rules above, whatever the host's link
# protections: ``<parent>/<user>``, made by the agent, owned by the user, mode 0700, in a
# parent only the agent (or root) can write (0755). Nobody else can create, rename or link
# anything in either, so no sticky-directory race exists there. Both are checked before every
# use: another user may have made the parent first in the world-writable /tmp (a directory or
# a link of theirs), and then it is refused, never followed.

#: Mode of the parent of the per-user directories (only the agent writes it; all traverse).
USER_DIRS_MODE = 0o755
#: Mode a per-user trace directory is made with (its owner may widen reading later).
USER_DIR_MODE = 0o700


def user_trace_dir_path(parent: str, uid: int) -> str:
    """``<parent>/<user name>`` (the uid's number when it has no name)."""
    return os.path.join(parent, user_name(uid) or str(uid))


def ensure_user_trace_dir(parent: str, uid: int) -> str:
    """Make (or verify) the per-user trace directory of ``uid`` and return its path.

    Raises:
        PermissionDenied: rule ``unsafe_user_dirs`` (the parent is not root's alone, or the
            user's directory belongs to someone else or others may write it), or
            ``user_dir_unavailable`` (it cannot be made: the agent does not run as root, a
            file is in the way).
    """
    path = user_trace_dir_path(parent, uid)
    try:
        os.makedirs(os.path.dirname(parent.rstrip("/")) or "/", exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(parent, USER_DIRS_MODE)
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        # O_NOFOLLOW met a symbolic link (ELOOP, or ENOTDIR with O_DIRECTORY): never followed.
        link = e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(parent)
        raise _user_dir_refused(
            "unsafe_user_dirs" if link else "user_dir_unavailable",
            f"{parent} cannot be used ({'a symbolic link' if link else e.strerror}); remove it "
            f"(rm -r {parent}: the agent makes it again) or set [tracing] user_dirs",
        ) from None
    try:
        st = os.fstat(parent_fd)
        if st.st_uid not in (ROOT_UID, os.geteuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise _user_dir_refused(
                "unsafe_user_dirs",
                f"{parent} belongs to {describe_uid(st.st_uid)} with mode "
                f"{stat.S_IMODE(st.st_mode):o}; only the agent's user may own and write it, or "
                f"another user could swap the per-user directories. Remove it (rm -r {parent}: "
                "the agent makes it again)",
            )
        name = os.path.basename(path)
        created = False
        try:
            os.mkdir(name, USER_DIR_MODE, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            pass
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        except OSError as e:
            raise _user_dir_refused(
                "user_dir_unavailable",
                f"{path} is not a directory ({e.strerror}); remove it (the agent makes it again)",
            ) from None
        try:
            if created:
                try:
                    os.fchown(fd, uid, _primary_gid(uid))
                except PermissionError:
                    os.rmdir(name, dir_fd=parent_fd)
                    raise _user_dir_refused(
                        "user_dir_unavailable",
                        f"this agent may not give {path} to {describe_uid(uid)} (it runs "
                        "without root or CAP_CHOWN: docs/deployment.md); name a log file in a "
                        "directory of that user",
                    ) from None
            own = os.fstat(fd)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)
    if own.st_uid != uid or own.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _user_dir_refused(
            "unsafe_user_dirs",
            f"{path} belongs to {describe_uid(own.st_uid)} with mode "
            f"{stat.S_IMODE(own.st_mode):o}, not to {describe_uid(uid)} alone; remove it "
            f"(rm -r {path}: the agent makes it again for its user)",
        )
    return path


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except (KeyError, OverflowError):
        return -1  # keep the agent's group; the directory's mode gives the group nothing


def _user_dir_refused(rule: str, message: str) -> RequestError:
    text = f"per-user trace directory refused by rule '{rule}': {message}"
    return PermissionDenied(text, rule=rule)


def home_directory(uid: int) -> str:
    """The home directory of ``uid`` in the passwd database ("" when none, or ``/``)."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except (KeyError, OverflowError):
        return ""
    return home if home.startswith("/") and home.rstrip("/") else ""
