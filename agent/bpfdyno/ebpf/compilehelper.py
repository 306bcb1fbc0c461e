"""The compile helper: a short-lived process that compiles one BPF program file with bcc.

bcc bundles clang and LLVM (tens of MB once used); compiling here keeps them out of the
daemon. The helper compiles (`bpfdyno.ebpf.compiler.compile_bpf`), which creates the maps,
and answers with each function's instructions and each map's fd and types
(`bpfdyno.ebpf.handover`); the daemon loads and attaches the functions itself. Then it exits;
the maps live on through the daemon's copies of their fds.

Run as ``python -m bpfdyno.ebpf.compilehelper FD`` with FD a connected Unix socket on which
the request comes: ``{"name", "text", "flags", "tree": {path, kind, kernel_release,
build_id}}``.
"""

from __future__ import annotations

import ctypes
import json
import socket
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bpfdyno.ebpf import ctypedesc, handover
from bpfdyno.ebpf.compiler import compile_bpf
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.kheaders import HeaderTree


def compile_request(request: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """Compile what ``request`` asks; returns the answer and the fds to send with it.

    Raises:
        BpfLoadError: compiling failed (the message says why and what to do).
    """
    tree = HeaderTree(**{**request["tree"], "path": Path(request["tree"]["path"])})
    bpf = compile_bpf(request["name"], request["text"], request["flags"], tree)
    from bcc import table as bcc_table
    from bcc.libbcc import lib

    module = bpf.module
    functions = {}
    for i in range(int(lib.bpf_num_functions(module))):
        fname = lib.bpf_function_name(module, i)
        start = lib.bpf_function_start(module, fname)
        size = int(lib.bpf_function_size(module, fname))
        functions[fname.decode()] = ctypes.string_at(start, size).hex()
    tables = _tables_lib()
    maps, fds = [], []
    for i in range(int(tables.bpf_num_tables(module))):
        mname = tables.bpf_table_name(module, i)
        fd = int(tables.bpf_table_fd_id(module, i))
        ttype = int(lib.bpf_table_type_id(module, i))
        key = bpf._decode_table_type(json.loads(lib.bpf_table_key_desc(module, mname)))
        leaf = bpf._decode_table_type(json.loads(lib.bpf_table_leaf_desc(module, mname)))
        event = None
        if ttype == 27:  # a ring buffer: its record type, as bcc derives it
            try:
                record = bcc_table._get_event_class(SimpleNamespace(bpf=bpf, _name=mname))
                event = ctypedesc.describe(record)
            except (SystemExit, Exception):  # no record type known to bcc
                event = None
        maps.append(
            {
                "name": mname.decode(),
                "fd": fd,
                "type": ttype,
                "max_entries": int(lib.bpf_table_max_entries_id(module, i)),
                "key": ctypedesc.describe(key),
                "leaf": ctypedesc.describe(leaf),
                "event": event,
            }
        )
        fds.append(fd)
    answer = {
        "license": (lib.bpf_module_license(module) or b"GPL").decode(),
        "kern_version": int(lib.bpf_module_kern_version(module)),
        "functions": functions,
        "maps": maps,
    }
    return answer, fds


def _tables_lib() -> ctypes.CDLL:
    """libbcc's table listing, which bcc's binding does not declare (a handle of our own)."""
    lib = ctypes.CDLL("libbcc.so.0")
    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.bpf_table_fd_id.restype = ctypes.c_int
    lib.bpf_table_fd_id.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    request, _ = handover.receive(sock)
    try:
        answer, fds = compile_request(request)
    except BpfLoadError as e:
        handover.send(sock, {"error": str(e)})
        return 0
    except Exception as e:  # anything else still gets an answer rather than silence
        handover.send(sock, {"error": f"the compile helper failed: {type(e).__name__}: {e}"})
        return 1
    handover.send(sock, answer, fds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
