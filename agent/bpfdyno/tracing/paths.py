"""Where Kineto writes a trace, and which log-file paths a request may name.

Kineto derives each process's file from ``ACTIVITIES_LOG_FILE`` by inserting ``_<pid>``
before the first ``.pt.trace.json`` of the whole path, else before the first ``.json``, else
nowhere (then every process writes, and overwrites, the same file). The dyno CLI instead
prints ``replace(".json", "_<pid>.json")``, which is wrong for ``*.pt.trace.json``; this
module is the one place that knows the real rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.text import printable
from bpfdyno.rpc.traces import before_kineto_extension

#: Where Kineto writes when the config names no log file.
DEFAULT_LOG_FILE_PATTERN = "/tmp/libkineto_activities_{pid}.json"
#: Where Kineto writes a memory snapshot (PROFILE_MEMORY=true) instead of a trace.
MEMORY_SNAPSHOT_PATTERN = "/tmp/memory_snapshot_{pid}.pickle"
#: Longest log-file path accepted (Kineto itself has no limit; file systems do).
MAX_PATH_BYTES = 1024
#: Suffix Kineto writes to first, then renames to the final name.
TMP_SUFFIX = ".tmp"


class PathRejected(InvalidArgument):
    """A log-file path that breaks one of the safety rules.

    Attributes:
        rule: the rule's short name (shown to the user, e.g. "outside_allowed_dirs").
    """

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"log file rejected by rule '{rule}': {message}", rule=rule)


def kineto_output_path(log_file: str, pid: int) -> str:
    """The file Kineto in process ``pid`` writes for ``ACTIVITIES_LOG_FILE=log_file``."""
    return before_kineto_extension(log_file, f"_{pid}") or log_file


def inserts_pid(log_file: str) -> bool:
    """True when Kineto gives every process its own file for this log file."""
    return ".json" in log_file


def default_output_path(pid: int) -> str:
    """Kineto's own file name when the config sets no ``ACTIVITIES_LOG_FILE``."""
    return DEFAULT_LOG_FILE_PATTERN.format(pid=pid)


def memory_snapshot_path(pid: int) -> str:
    """The file Kineto writes in memory-snapshot mode (``PROFILE_MEMORY=true``)."""
    return MEMORY_SNAPSHOT_PATTERN.format(pid=pid)


def normalize(path: str) -> str:
    """``os.path.normpath`` that also folds a leading ``//`` (POSIX keeps it; Linux does not
    treat it specially), so ``//tmp/x`` is recognised as inside ``/tmp``."""
    normalized = os.path.normpath(path)
    return "/" + normalized.lstrip("/") if normalized.startswith("//") else normalized


def _inside(path: str, directory: str) -> bool:
    directory = directory.rstrip("/") or "/"
    return path == directory or path.startswith(directory if directory == "/" else directory + "/")


def check_log_file(
    log_file: str, allowed_dirs: Sequence[str], sees: Callable[[str], bool] | None = None
) -> str:
    """Validate a requested log-file path; return it unchanged when it passes.

    Rules, checked in order: printable text without ``=`` or ``#`` (it goes into
    ``KEY=VALUE`` config text), an absolute path, no ``..`` component, a file name (not a
    directory), inside one of ``allowed_dirs`` also after resolving symbolic links, an
    existing parent directory (Kineto creates none), and ``_<pid>`` landing in the file name
    rather than a directory.

    Args:
        sees: whether the requester could look up a path itself
            (`bpfdyno.tracing.safety.visible_to`); the file system is probed only where it
            could, so the answer tells nothing about what lies behind a directory the
            requester may not enter (the placement rules then refuse such a path with one
            answer for all). None: everywhere (root, the daemon itself).

    Raises:
        PathRejected: naming the rule that failed and what to do.
    """
    probe_ok = sees or (lambda path: True)
    if not log_file:
        raise PathRejected("empty", "no log file given; pass an absolute path such as /tmp/t.json")
    if len(log_file.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise PathRejected("too_long", f"the path is longer than {MAX_PATH_BYTES} bytes")
    bad_char = next((c for c in log_file if not printable(c)), None)
    if bad_char is not None:
        raise PathRejected(
            "control_character",
            f"the path contains U+{ord(bad_char):04X}, a control, line-separator or invisible "
            "(e.g. bidirectional) character, which could inject config lines or disguise the "
            "name in listings and logs; use a plain path",
        )
    if "=" in log_file:
        raise PathRejected(
            "equals_sign", "the path contains '=', which is not allowed in a config value"
        )
    if "#" in log_file:
        raise PathRejected(
            "hash_sign", "the path contains '#', where Kineto's config parser starts a comment"
        )
    if not log_file.startswith("/"):
        raise PathRejected(
            "not_absolute",
            f"{log_file!r} is relative; each trainer would resolve it against its own working "
            "directory. Pass an absolute path",
        )
    if ".." in log_file.split("/"):
        raise PathRejected("dot_dot", f"{log_file!r} contains a '..' component; remove it")
    if log_file.endswith("/"):
        raise PathRejected("not_a_file", f"{log_file!r} names a directory; add a file name")
    normalized = normalize(log_file)
    allowed = [normalize(d) for d in allowed_dirs if d]
    shown = ", ".join(allowed) or "(none configured)"
    if normalized in allowed or (probe_ok(normalized) and os.path.isdir(normalized)):
        raise PathRejected(
            "not_a_file",
            f"{log_file!r} is a directory; add a file name such as {normalized}/trace.json",
        )
    if not any(_inside(normalized, d) for d in allowed):
        raise PathRejected(
            "outside_allowed_dirs",
            f"{log_file} is not inside an allowed trace directory ({shown}); write under one "
            "of them, or leave out --log-file (the agent then writes into your own trace "
            "directory), or add the directory to [tracing] allowed_dirs",
        )
    parent = os.path.dirname(normalized)
    # A trainer in a container writes in its own file system, where the directory is checked
    # (it exists, it is safe: `bpfdyno.tracing.safety`) once the writer is known. Here, only a
    # directory this agent sees can be checked for links out of the allowed ones.
    if probe_ok(parent) and os.path.isdir(parent):
        real_parent = os.path.realpath(parent)
        if not any(_inside(real_parent, os.path.realpath(d)) for d in allowed):
            raise PathRejected(
                "outside_allowed_dirs",
                f"{parent} resolves to {real_parent} through a symbolic link, outside the "
                f"allowed trace directories ({shown})",
            )
    probe = kineto_output_path(log_file, 1)
    if os.path.dirname(probe) != os.path.dirname(log_file):
        raise PathRejected(
            "json_in_directory",
            f"'.json' appears in a directory name of {log_file}; Kineto would insert _<pid> "
            "there and fail to write. Rename the directory",
        )
    return log_file
