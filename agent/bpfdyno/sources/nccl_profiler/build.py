"""Builds the NCCL profiler plugin library from the C sources shipped in this package.

The library is built with the machine's C compiler (``$CC``, else ``cc``) where it is to be
used: it needs only libc and pthreads, so it builds without NCCL or CUDA installed. A build is
reused while the sources are unchanged (their hash names a stamp file next to the library).

Command line: ``python -m bpfdyno.sources.nccl_profiler.build DIR`` prints the library's path.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LIBRARY_NAME = "libbpfdyno-nccl-profiler.so"
SOURCES = ("plugin.c", "bpfdyno_nccl.h", "nccl_profiler_abi.h")
CFLAGS = (
    "-O2",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-pthread",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-std=gnu11",
)


class PluginBuildError(Exception):
    """The plugin library could not be built; the message says why and what to do."""


def source_dir() -> Path:
    """Where the plugin's C sources are installed."""
    return Path(str(importlib.resources.files("bpfdyno.sources.nccl_profiler")))


def sources_hash() -> str:
    """A short hash of the sources: a changed source means a rebuild."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((source_dir() / name).read_bytes())
    return digest.hexdigest()[:16]


def compiler() -> str:
    """The C compiler's path; PluginBuildError when there is none."""
    name = os.environ.get("CC") or "cc"
    found = shutil.which(name)
    if found is None:
        raise PluginBuildError(
            f"no C compiler ({name!r}) on PATH to build {LIBRARY_NAME}: install one "
            "(Debian/Ubuntu: apt-get install gcc) or set CC to its path"
        )
    return found


def build_plugin(out_dir: Path) -> Path:
    """Builds the library into out_dir (unless an identical build is there) and returns its path.

    Raises:
        PluginBuildError: no compiler, an unwritable out_dir, or a failed compile.
    """
    out = out_dir / LIBRARY_NAME
    stamp = out_dir / f".{LIBRARY_NAME}.{sources_hash()}"
    if out.is_file() and stamp.is_file():
        return out
    cc = compiler()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY_NAME}.", dir=out_dir)
        os.close(fd)
    except OSError as e:
        raise PluginBuildError(
            f"cannot write the plugin library into {out_dir}: {e.strerror}; "
            "choose a directory you can write"
        ) from e
    cmd = [cc, *CFLAGS, "-o", tmp, str(source_dir() / "plugin.c")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        os.unlink(tmp)
        raise PluginBuildError(
            f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr.strip()}\n"
            "the compiler must build C11 with pthreads for this machine"
        )
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    for old in out_dir.glob(f".{LIBRARY_NAME}.*"):
        if len(old.name) == len(stamp.name):
            old.unlink()  # stamps of older sources
    stamp.touch()
    return out


def main(argv: list[str] | None = None) -> int:
    """Builds into the directory given and prints the library's path."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bpfdyno.sources.nccl_profiler.build DIR", file=sys.stderr)
        return 2
    try:
        print(build_plugin(Path(args[0])))
    except PluginBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
