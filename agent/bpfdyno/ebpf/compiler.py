"""Running bcc's compiler (clang/LLVM inside libbcc), and giving back the memory it used.

`compile_bpf` turns C source into a ``bcc.BPF`` object against a given kernel header tree,
explaining failures. It runs in the compile helper (`bpfdyno.ebpf.compilehelper`), never in
the daemon: `COMPILER_LIBRARIES` names what must not be mapped there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.kheaders import HeaderTree

if TYPE_CHECKING:
    import bcc

# bcc reads BCC_KERNEL_SOURCE from the environment while compiling: one compile at a time,
# so concurrent loads never see each other's header tree.
_compile_lock = threading.Lock()

#: Shared libraries of the BPF compiler (bcc bundles clang and LLVM in libbcc).
COMPILER_LIBRARIES = re.compile(r"/lib(bcc|LLVM|clang)[^/]*\.so")


def compile_bpf(name: str, text: str, flags: Sequence[str], tree: HeaderTree) -> bcc.BPF:
    """Compile ``text`` with bcc against the header tree ``tree``.

    Args:
        name: the program's file name, for messages.
        text: the C source.
        flags: compiler flags (``-I``, ``-D``...).
        tree: the kernel header tree (`bpfdyno.ebpf.kheaders`).

    Returns:
        The ``bcc.BPF`` object; its functions are loaded into the kernel when attached.

    Raises:
        BpfLoadError: bcc is missing, or compiling failed; the message says what to do.
    """
    try:
        import bcc
    except ImportError as e:
        raise BpfLoadError(
            "bcc is not importable; install python3-bpfcc (Debian/Ubuntu) and make it visible "
            "to this Python (see vagrant/bootstrap.sh)"
        ) from e
    with _compile_lock, _captured_stderr() as diag:
        old = os.environ.get("BCC_KERNEL_SOURCE")
        os.environ["BCC_KERNEL_SOURCE"] = str(tree.path)
        try:
            result = _run_compiler(bcc.BPF, text, flags)
        finally:
            if old is None:
                os.environ.pop("BCC_KERNEL_SOURCE", None)
            else:
                os.environ["BCC_KERNEL_SOURCE"] = old
    if isinstance(result, Exception):
        raise BpfLoadError(_explain_failure(name, result, diag.text, tree.kind)) from result
    trim_heap()
    return result


def trim_heap() -> None:
    """Hand freed heap back to the OS.

    clang/LLVM free tens of MB after a compile (and libbpf ~14 MB after parsing the kernel's
    BTF), but glibc keeps freed memory in its arenas; ``malloc_trim`` returns it (measured:
    ~40 MB of RSS per compiled program).
    """
    # Not glibc (no malloc_trim): nothing to trim this way.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _run_compiler(factory: Any, text: str, flags: Sequence[str]) -> Any:
    """Run bcc's compiler, returning the exception instead of raising (bcc raises bare ones)."""
    try:
        return factory(text=text.encode(), cflags=list(flags))
    except Exception as e:
        return e


def _explain_failure(name: str, err: Exception, diagnostics: str, kind: str) -> str:
    if os.geteuid() != 0 or "super-user" in str(err) or "not permitted" in str(err):
        return (
            f"loading {name} was refused ({err}); run the daemon as root "
            "(or with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)"
        )
    lines = [ln for ln in diagnostics.splitlines() if "error" in ln.lower()][:5]
    detail = "; ".join(lines) or str(err)
    return (
        f"compiling {name} against {kind} kernel headers failed: {detail}; "
        "check that bcc matches this kernel (see `bpfdyno doctor`)"
    )


class _Captured:
    text = ""


@contextlib.contextmanager
def _captured_stderr() -> Iterator[_Captured]:
    """Capture fd 2 (clang writes diagnostics there), then replay it to the real stderr."""
    out = _Captured()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            out.text = data.decode("utf-8", "replace")
            if data:
                os.write(2, data)
