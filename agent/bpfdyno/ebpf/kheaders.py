"""Kernel headers for bcc, generated from the running kernel when none are installed.

bcc compiles BPF C at run time against a kernel header tree (``BCC_KERNEL_SOURCE``). Many
machines have no ``/lib/modules/$(uname -r)/build``, and headers of *another* kernel version
compile fine but give wrong struct offsets: a read of ``task->real_parent`` silently returns
garbage. So bpfdyno uses, in this order:

1. the installed headers of exactly the running release (``installed``);
2. a tree generated from the running kernel itself, cached per kernel build:

   * ``minimal`` (``generated-minimal``): ``include/linux/kconfig.h`` with the ``CONFIG_*``
     defines from ``/proc/config.gz``, ``LINUX_VERSION_CODE``, the kernel's scalar typedefs and
     common macros, and ``struct pt_regs``. Enough for tracepoint, raw-syscall and uprobe
     programs, which never read kernel structs.
   * ``btf`` (``generated-btf``): the same plus ``vmlinux.h`` dumped from
     ``/sys/kernel/btf/vmlinux`` by ``bpftool``, so every kernel struct has the exact layout of
     the running kernel. The usual kernel includes (``linux/sched.h``...) become empty files, so
     programs written for installed headers compile unchanged.

The cache lives under ``/var/cache/bpfdyno/kheaders/<release>-<build id>/<flavour>`` and is
written atomically (a temporary directory renamed into place), so concurrent daemons and
tests never see half a tree. An agent that may read but not write it (an ordinary user with
the unit's capabilities, where root's agent made the cache) uses root's trees and generates
missing ones into a cache of its own (`fallback_cache_dirs`), trusted by the same rules.

What is compiled into programs loaded with CAP_BPF/CAP_SYS_ADMIN must be the agent's alone.
Every directory and file is created with explicit modes (`DIR_MODE`, `FILE_MODE`: nobody
but the owner may write), whatever the umask (the packaged unit's 0007 would otherwise make
them writable by the agent's group), and before a tree is used its owner and modes are
verified, every entry of it and every directory above it: a tree that anyone but the agent
(or root) owns or could change is refused and generated anew, and a cache directory inside
a directory others may change is refused with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

HeaderFlavour = Literal["minimal", "btf"]

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path("/var/cache/bpfdyno/kheaders")
_MARKER = ".bpfdyno-complete"
#: Modes of the cache's directories and files: only their owner writes.
DIR_MODE = 0o755
FILE_MODE = 0o644
#: Permission bits that let others than the owner change an entry.
_OTHERS_WRITE = 0o022


class KernelHeadersError(Exception):
    """No usable kernel headers; the message says what is missing and how to fix it."""


class HeaderCacheUnwritable(KernelHeadersError):
    """The cache directory exists (or its parent does) but this process may not write it."""


def fallback_cache_dirs() -> list[Path]:
    """Where an agent that may not write the system cache keeps its trees, in order: its
    user's XDG cache (``$XDG_CACHE_HOME`` or ``~/.cache``), then a directory of its own in
    the temporary directory (service users often have no home)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [
        Path(base) / "bpfdyno" / "kheaders",
        Path(tempfile.gettempdir()) / f"bpfdyno-kheaders-{os.geteuid()}",
    ]


@dataclass(frozen=True, slots=True)
class HeaderTree:
    """A kernel header tree bcc can use as ``BCC_KERNEL_SOURCE``.

    Attributes:
        path: the tree's root (holds ``include/linux/kconfig.h``).
        kind: ``installed``, ``generated-minimal`` or ``generated-btf``.
        kernel_release: ``uname -r`` of the kernel the tree belongs to.
        build_id: identifies the exact kernel build (empty for installed headers).
    """

    path: Path
    kind: str
    kernel_release: str
    build_id: str


@dataclass(frozen=True, slots=True)
class KernelSources:
    """Where facts about the running kernel are read from (replaceable in tests)."""

    release: str = field(default_factory=lambda: os.uname().release)
    version: str = field(default_factory=lambda: os.uname().version)
    btf: Path = Path("/sys/kernel/btf/vmlinux")
    config: Path = Path("/proc/config.gz")
    notes: Path = Path("/sys/kernel/notes")
    modules: Path = Path("/lib/modules")

    @property
    def installed_headers(self) -> Path:
        """Where a linux-headers package of exactly this release would be."""
        return self.modules / self.release / "build"


def kernel_build_id(kernel: KernelSources | None = None) -> str:
    """A short hex id that changes whenever the running kernel build changes.

    It hashes the release and version strings, the kernel's ELF notes (they hold the GNU
    build id) and the BTF and config blobs, so two kernels with the same ``uname -r`` but
    different builds never share cached headers.
    """
    k = kernel or KernelSources()
    h = hashlib.sha256()
    h.update(k.release.encode())
    h.update(b"\0")
    h.update(k.version.encode())
    for path in (k.notes, k.btf, k.config):
        h.update(b"\0" + str(path).encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"<missing>")
    # The generator itself is part of the id: a changed template never reuses a stale tree.
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def ensure_headers(
    flavour: HeaderFlavour = "minimal",
    cache_dir: Path | None = None,
    *,
    kernel: KernelSources | None = None,
    prefer_installed: bool = True,
) -> HeaderTree:
    """Return a header tree for the running kernel, generating and caching it if needed.

    Args:
        flavour: ``minimal`` for programs that never read kernel structs, ``btf`` for
            programs that do (exact offsets from the kernel's BTF).
        cache_dir: where generated trees are kept (default ``/var/cache/bpfdyno/kheaders``).
        kernel: where to read kernel facts from; the running kernel by default.
        prefer_installed: use ``/lib/modules/<release>/build`` when it exists.

    Returns:
        The tree to pass to bcc as ``BCC_KERNEL_SOURCE``.

    Raises:
        KernelHeadersError: nothing usable; the message says how to fix it.
    """
    if flavour not in ("minimal", "btf"):
        raise KernelHeadersError(f"unknown header flavour {flavour!r}; use 'minimal' or 'btf'")
    k = kernel or KernelSources()
    installed = k.installed_headers
    if prefer_installed and (installed / "include" / "linux" / "kconfig.h").is_file():
        return HeaderTree(installed.resolve(), "installed", k.release, "")
    build_id = kernel_build_id(k)
    if cache_dir is not None:
        return _cached_tree(cache_dir, flavour, k, build_id)
    try:
        return _cached_tree(DEFAULT_CACHE_DIR, flavour, k, build_id)
    except HeaderCacheUnwritable as e:
        # An agent run as an ordinary user with the unit's capabilities, on a machine where
        # root's agent made the system cache: it reads root's trees but cannot add one.
        tried = [str(e)]
    for fallback in fallback_cache_dirs():
        try:
            tree = _cached_tree(fallback, flavour, k, build_id)
        except KernelHeadersError as e:
            tried.append(str(e))
            continue
        if fallback not in _FALLBACKS_SAID:
            _FALLBACKS_SAID.add(fallback)
            log.info("%s; kernel headers are kept in %s instead", tried[0], fallback)
        return tree
    raise KernelHeadersError(
        f"no writable kernel header cache: {'; '.join(tried)}. Run the agent as root or as "
        "the packaged unit (its CacheDirectory is its own), or give its user a writable home "
        "or XDG_CACHE_HOME"
    )


#: Fallback caches already named in the log (once per process, not once per program).
_FALLBACKS_SAID: set[Path] = set()


def _cached_tree(
    cache: Path, flavour: HeaderFlavour, k: KernelSources, build_id: str
) -> HeaderTree:
    """The tree of ``flavour`` in ``cache``: the trusted cached one, or one generated now.

    Raises:
        HeaderCacheUnwritable: the tree is missing and this process may not write ``cache``.
        KernelHeadersError: anything else that makes the tree unusable.
    """
    root = cache / f"{k.release}-{build_id}"
    final = root / flavour
    _make_private_dirs(root, cache)
    if (final / _MARKER).is_file() or os.path.lexists(final):
        problem = tree_problem(final)
        if problem:
            log.warning("refusing the cached kernel headers in %s (%s); generating them anew",
                        final, problem)  # fmt: skip
            _remove(final)
    if not (final / _MARKER).is_file():
        _generate_atomically(final, flavour, k)
        problem = tree_problem(final)
        if problem:  # someone else's copy won the rename, or the tree was changed meanwhile
            raise KernelHeadersError(
                f"the generated kernel headers in {final} cannot be trusted ({problem}); "
                f"remove {final} and check who else writes to {root}"
            )
    return HeaderTree(final, f"generated-{flavour}", k.release, build_id)


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _entry_problem(path: Path, st: os.stat_result) -> str:
    """Why one entry of a tree cannot be trusted ("" when it can)."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return f"{path} is neither a directory nor a regular file"
    if not _trusted_owner(st.st_uid):
        return f"{path} belongs to uid {st.st_uid}"
    if st.st_mode & _OTHERS_WRITE:
        return f"{path} has mode {stat.S_IMODE(st.st_mode):04o} (others than its owner may write)"
    return ""


def tree_problem(tree: Path) -> str:
    """Why the header tree at ``tree`` cannot be trusted ("" when it can): any entry that
    is a link or a special file, belongs to someone other than the agent or root, or that
    others may write; or a directory above it that others may change."""
    problem = _ancestors_problem(tree.parent)
    if problem:
        return problem
    try:
        top = os.lstat(tree)
    except OSError as e:
        return f"{tree} cannot be read ({e.strerror})"
    if problem := _entry_problem(tree, top):
        return problem
    for dirpath, dirnames, filenames in os.walk(tree, followlinks=False):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
            except OSError as e:
                return f"{path} cannot be read ({e.strerror})"
            if problem := _entry_problem(path, st):
                return problem
    return ""


def _ancestors_problem(directory: Path) -> str:
    """Why ``directory`` or a directory above it lets others change what is inside (""
    when none does). A sticky directory of root's (``/tmp``) is fine: others cannot rename
    or remove what is not theirs."""
    current = Path(os.path.abspath(directory))
    for path in (current, *current.parents):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{path} cannot be read ({e.strerror})"
        if stat.S_ISLNK(st.st_mode) and path != current:
            continue  # a link above the cache (/var/run -> /run) is the system's
        sticky_roots = st.st_uid == 0 and st.st_mode & stat.S_ISVTX
        if not _trusted_owner(st.st_uid):
            return f"{path} belongs to uid {st.st_uid}"
        if st.st_mode & _OTHERS_WRITE and not sticky_roots:
            return (
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o} (others than its owner may write)"
            )
    return ""


def _make_private_dirs(directory: Path, cache: Path) -> None:
    """Create ``directory`` and its missing parents with `DIR_MODE`, whatever the umask;
    tighten the agent's own ones from ``cache`` down that others may write (an older
    version's, made under a permissive umask); directories above ``cache`` are only
    checked.

    Raises:
        KernelHeadersError: a directory cannot be made, or one on the way belongs to
            someone else who lets others change it.
    """
    current = Path(os.path.abspath(directory))
    top = Path(os.path.abspath(cache))
    for path in (*reversed(current.parents), current):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            try:
                os.mkdir(path, DIR_MODE)
                os.chmod(path, DIR_MODE)  # not through mkdir's mode: the umask takes bits
            except FileExistsError:
                pass
            except OSError as e:
                kind = HeaderCacheUnwritable if _unwritable(e) else KernelHeadersError
                raise kind(f"cannot create {path} ({e.strerror})") from e
            continue
        except OSError as e:
            raise KernelHeadersError(f"cannot use the header cache {path} ({e.strerror})") from e
        if (
            stat.S_ISDIR(st.st_mode)
            and path.is_relative_to(top)
            and st.st_uid == os.geteuid()
            and st.st_mode & _OTHERS_WRITE
            and not st.st_mode & stat.S_ISVTX
        ):
            os.chmod(path, DIR_MODE)
    problem = _ancestors_problem(current)
    if problem:
        raise KernelHeadersError(
            f"the header cache {directory} cannot be trusted: {problem}; whoever may change "
            "it could put code into the agent's BPF programs. Make it the agent's own (mode "
            "0755) or set another cache directory"
        )


def _unwritable(e: OSError) -> bool:
    return e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)


def _remove(tree: Path) -> None:
    """Remove a refused tree (never following its links: rmtree works by descriptor)."""
    if os.path.islink(tree) or not os.path.isdir(tree):
        with contextlib.suppress(OSError):
            os.unlink(tree)
        return
    aside = tree.with_name(f".refused-{tree.name}-{os.getpid()}-{time.monotonic_ns()}")
    with contextlib.suppress(OSError):
        os.rename(tree, aside)
        tree = aside
    shutil.rmtree(tree, ignore_errors=True)


def describe_header_source(
    cache_dir: Path | None = None, kernel: KernelSources | None = None
) -> str:
    """One line for ``bpfdyno doctor``: where BPF headers come from, or what is missing."""
    k = kernel or KernelSources()
    if (k.installed_headers / "include" / "linux" / "kconfig.h").is_file():
        return f"kernel headers: installed at {k.installed_headers} (release {k.release})"
    missing = [str(p) for p in (k.config,) if not p.is_file()]
    if missing:
        return (
            f"kernel headers: none for {k.release}: no {k.installed_headers} and no "
            f"{', '.join(missing)}; install linux-headers-{k.release} or load the configs "
            "module (modprobe configs)"
        )
    btf = "and BTF" if k.btf.is_file() and shutil.which("bpftool") else "only (no BTF/bpftool)"
    where = (cache_dir or DEFAULT_CACHE_DIR) / f"{k.release}-{kernel_build_id(k)}"
    hint = ""
    if not k.btf.is_file():
        hint = "; programs that read kernel structs need CONFIG_DEBUG_INFO_BTF=y"
    elif not shutil.which("bpftool"):
        hint = "; install bpftool to generate vmlinux.h for struct-reading programs"
    return f"kernel headers: generated from {k.config} {btf} into {where}{hint}"


def _generate_atomically(final: Path, flavour: HeaderFlavour, k: KernelSources) -> None:
    for stale in final.parent.glob(".tmp-*"):  # left by a generator that was killed
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 600:
                shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{flavour}-", dir=final.parent))
    except OSError as e:
        kind = HeaderCacheUnwritable if _unwritable(e) else KernelHeadersError
        raise kind(f"cannot write the kernel headers into {final.parent} ({e.strerror})") from e
    try:
        _write_tree(tmp, flavour, k)
        _write_file(tmp / _MARKER, f"{k.release}\n{flavour}\n")
        os.chmod(tmp, DIR_MODE)  # mkdtemp's 0700, readable like the rest once complete
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process renamed its complete copy first; theirs is as good as ours.
            if not (final / _MARKER).is_file():
                # A leftover without the marker (e.g. an old crash): replace it.
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_tree(root: Path, flavour: HeaderFlavour, k: KernelSources) -> None:
    inc = root / "include"
    configs = _read_kconfig(k.config)
    files: dict[str, str] = {
        "linux/version.h": _version_h(k.release),
        "linux/kconfig.h": _kconfig_h(configs, flavour),
        "generated/autoconf.h": "",
    }
    if flavour == "btf":
        files["bpfdyno/vmlinux.h"] = _dump_vmlinux_h(k.btf)
        files["bpfdyno/kmacros.h"] = _KMACROS_H
    else:
        files["bpfdyno/ktypes.h"] = _KTYPES_H
        files["bpfdyno/kmacros.h"] = _KMACROS_H
        files["bpfdyno/ptregs.h"] = _pt_regs_h()
        files["uapi/linux/ptrace.h"] = '#include "../../bpfdyno/ptregs.h"\n'
        files["linux/ptrace.h"] = '#include "../bpfdyno/ptregs.h"\n'
        files["asm/ptrace.h"] = '#include "../bpfdyno/ptregs.h"\n'
    for name in _EMPTY_HEADERS:
        files.setdefault(name, "")
    for name, text in files.items():
        path = inc / name
        for d in (*reversed(path.relative_to(root).parents[:-1]),):
            with contextlib.suppress(FileExistsError):
                os.mkdir(root / d, DIR_MODE)
                os.chmod(root / d, DIR_MODE)
        _write_file(path, text)
    # bcc adds -I<tree>/arch/<arch>/include...; those directories need not exist.


def _write_file(path: Path, text: str) -> None:
    """A new file with `FILE_MODE`, whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE)  # fmt: skip
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, FILE_MODE)
        f.write(text)


def _read_kconfig(path: Path) -> list[tuple[str, str]]:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError as e:
        raise KernelHeadersError(
            f"{path} does not exist, so kernel headers cannot be generated; load the configs "
            "module (modprobe configs) or install the linux-headers package of this kernel"
        ) from e
    except (OSError, gzip.BadGzipFile, EOFError) as e:
        raise KernelHeadersError(
            f"cannot read the kernel config {path} ({e}); install the linux-headers package "
            "of this kernel"
        ) from e
    out: list[tuple[str, str]] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.startswith("CONFIG_") and name.isidentifier():
            out.append((name, value.strip()))
    if not out:
        raise KernelHeadersError(f"{path} holds no CONFIG_ lines; is it a kernel config?")
    return out


def _kconfig_h(configs: list[tuple[str, str]], flavour: HeaderFlavour) -> str:
    lines = [
        "/* Generated by bpfdyno from the running kernel's config. Do not edit. */",
        "#ifndef __BPFDYNO_KCONFIG_H",
        "#define __BPFDYNO_KCONFIG_H",
    ]
    for name, value in configs:
        if value == "y":
            lines.append(f"#define {name} 1")
        elif value == "m":
            lines.append(f"#define {name}_MODULE 1")
        elif value != "n":
            lines.append(f"#define {name} {value}")
    lines.append(_KCONFIG_MACROS)
    if flavour == "btf":
        lines += [
            # bcc's built-in copy of uapi/linux/bpf.h would clash with vmlinux.h's types.
            "#define _UAPI__LINUX_BPF_H__",
            # bcc does no CO-RE relocation; offsets in vmlinux.h are already exact.
            "#define BPF_NO_PRESERVE_ACCESS_INDEX",
            '#include "../bpfdyno/vmlinux.h"',
        ]
    else:
        lines.append('#include "../bpfdyno/ktypes.h"')
    lines += ['#include "../bpfdyno/kmacros.h"', "#endif"]
    return "\n".join(lines) + "\n"


def _version_h(release: str) -> str:
    parts = [int(p) for p in _leading_numbers(release)[:3]] + [0, 0, 0]
    major, minor, patch = parts[0], parts[1], min(parts[2], 255)
    code = (major << 16) + (minor << 8) + patch
    return (
        f"#define LINUX_VERSION_CODE {code}\n"
        "#define KERNEL_VERSION(a, b, c) (((a) << 16) + ((b) << 8) + ((c) > 255 ? 255 : (c)))\n"
        f"#define LINUX_VERSION_MAJOR {major}\n"
        f"#define LINUX_VERSION_PATCHLEVEL {minor}\n"
        f"#define LINUX_VERSION_SUBLEVEL {parts[2]}\n"
    )


def _leading_numbers(release: str) -> list[str]:
    nums: list[str] = []
    for chunk in release.split("."):
        digits = ""
        for ch in chunk:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        nums.append(digits)
        if len(digits) != len(chunk):
            break
    return nums


def _dump_vmlinux_h(btf: Path) -> str:
    if not btf.is_file():
        raise KernelHeadersError(
            f"{btf} does not exist: this kernel has no BTF, so programs that read kernel "
            "structs cannot be compiled; boot a kernel with CONFIG_DEBUG_INFO_BTF=y or install "
            "the linux-headers package of exactly this kernel"
        )
    bpftool = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    if bpftool is None:
        raise KernelHeadersError(
            "bpftool is not installed, so vmlinux.h cannot be generated from BTF; install it "
            "(Debian/Ubuntu: apt-get install bpftool)"
        )
    try:
        res = subprocess.run(
            [bpftool, "btf", "dump", "file", str(btf), "format", "c"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KernelHeadersError(f"running bpftool failed ({e}); check the bpftool install") from e
    if res.returncode != 0 or "struct task_struct {" not in res.stdout:
        raise KernelHeadersError(
            f"bpftool could not dump {btf} (exit {res.returncode}: {res.stderr.strip()[:200]}); "
            "update bpftool to a version that knows this kernel's BTF"
        )
    return res.stdout


def _pt_regs_h() -> str:
    # The user-visible register layout (uapi asm/ptrace.h) is stable ABI per architecture.
    machine = platform.machine()
    if machine == "x86_64":
        body = (
            "struct pt_regs {\n"
            "  unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di;\n"
            "  unsigned long orig_ax, ip, cs, flags, sp, ss;\n"
            "};\n"
        )
    elif machine == "aarch64":
        body = (
            "struct user_pt_regs { __u64 regs[31]; __u64 sp; __u64 pc; __u64 pstate; };\n"
            "struct pt_regs { union { struct user_pt_regs user_regs; struct { __u64 regs[31];"
            " __u64 sp; __u64 pc; __u64 pstate; }; }; __u64 orig_x0; };\n"
        )
    else:
        body = (
            f"/* struct pt_regs is not provided for {machine}; uprobes need installed headers */\n"
        )
    return "#ifndef __BPFDYNO_PTREGS_H\n#define __BPFDYNO_PTREGS_H\n" + body + "#endif\n"


_KCONFIG_MACROS = r"""
#define __ARG_PLACEHOLDER_1 0,
#define __take_second_arg(__ignored, val, ...) val
#define __is_defined(x) ___is_defined(x)
#define ___is_defined(val) ____is_defined(__ARG_PLACEHOLDER_##val)
#define ____is_defined(arg1_or_junk) __take_second_arg(arg1_or_junk 1, 0)
#define IS_BUILTIN(option) __is_defined(option)
#define IS_MODULE(option) __is_defined(option##_MODULE)
#define IS_ENABLED(option) (IS_BUILTIN(option) || IS_MODULE(option))
"""

# Kernel scalar types for the minimal flavour (vmlinux.h provides them in the btf flavour;
# mixing the two clashes).
_KTYPES_H = r"""#ifndef __BPFDYNO_KTYPES_H
#define __BPFDYNO_KTYPES_H
typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __s8 s8;
typedef __u8 u8;
typedef __s16 s16;
typedef __u16 u16;
typedef __s32 s32;
typedef __u32 u32;
typedef __s64 s64;
typedef __u64 u64;
typedef __u16 __le16;
typedef __u16 __be16;
typedef __u32 __le32;
typedef __u32 __be32;
typedef __u64 __le64;
typedef __u64 __be64;
typedef __u16 __sum16;
typedef __u32 __wsum;
typedef __u64 __attribute__((aligned(8))) __aligned_u64;
typedef _Bool bool;
enum { false = 0, true = 1 };
typedef int pid_t;
typedef unsigned int uid_t;
typedef unsigned int gid_t;
typedef long __kernel_long_t;
typedef unsigned long __kernel_ulong_t;
typedef __kernel_ulong_t size_t;
typedef __kernel_long_t ssize_t;
typedef long long loff_t;
typedef unsigned short umode_t;
typedef unsigned int __poll_t;
typedef __u32 dev_t;
typedef unsigned long uintptr_t;
typedef long long ktime_t;
typedef unsigned short sa_family_t;
#define TASK_COMM_LEN 16
#endif
"""

# Macros are not in BTF, so both flavours carry the commonly used ones.
_KMACROS_H = r"""#ifndef __BPFDYNO_KMACROS_H
#define __BPFDYNO_KMACROS_H
#ifndef NULL
#define NULL ((void *)0)
#endif
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#endif
#ifndef unlikely
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif
#ifndef offsetof
#define offsetof(TYPE, MEMBER) __builtin_offsetof(TYPE, MEMBER)
#endif
#ifndef container_of
#define container_of(ptr, type, member) \
  ((type *)((void *)(ptr) - offsetof(type, member)))
#endif
#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif
#define TASK_RUNNING 0x0000
#define TASK_INTERRUPTIBLE 0x0001
#define TASK_UNINTERRUPTIBLE 0x0002
#define __TASK_STOPPED 0x0004
#define __TASK_TRACED 0x0008
#define TASK_REPORT 0x007f
#define PF_KTHREAD 0x00200000
#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define MSG_PEEK 2
#ifndef PAGE_SHIFT
#define PAGE_SHIFT 12
#define PAGE_SIZE (1UL << PAGE_SHIFT)
#endif
#endif
"""

# Headers bcc's helpers and typical programs include; their content comes from kconfig.h's
# types (minimal) or vmlinux.h (btf), so they exist only to satisfy #include.
_EMPTY_HEADERS = (
    "linux/types.h",
    "uapi/linux/bpf.h",
    "linux/bpf.h",
    "linux/bpf_common.h",
    "uapi/linux/if_packet.h",
    "uapi/linux/if_ether.h",
    "linux/log2.h",
    "asm/page.h",
    "linux/compiler.h",
    "linux/errno.h",
    "uapi/linux/errno.h",
    "linux/sched.h",
    "linux/ptrace.h",
    "uapi/linux/ptrace.h",
    "asm/ptrace.h",
    "linux/mm_types.h",
    "linux/fs.h",
    "linux/nsproxy.h",
    "linux/pid_namespace.h",
    "linux/cgroup.h",
    "linux/socket.h",
    "linux/skbuff.h",
    "linux/netdevice.h",
    "linux/in.h",
    "linux/in6.h",
    "linux/ip.h",
    "linux/ipv6.h",
    "linux/tcp.h",
    "linux/udp.h",
    "net/sock.h",
    "net/inet_sock.h",
    "net/inet_connection_sock.h",
    "net/tcp.h",
    "net/udp.h",
    "net/net_namespace.h",
    "net/dropreason.h",
    "net/dropreason-core.h",
    "uapi/linux/tcp.h",
    "uapi/linux/in.h",
    "uapi/linux/in6.h",
)
