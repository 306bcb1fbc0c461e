"""A BPF program file compiled in the compile helper, held by the daemon as fds: `Compiled`.

`compile_in_helper` starts ``python -m bpfdyno.ebpf.compilehelper`` on one end of a Unix
socket pair, sends it the source, and gets back each function's instructions and each map's
fd (`bpfdyno.ebpf.handover`). The instructions refer to the maps by the helper's fd numbers;
they are rewritten to ours here, so `BpfProgram` can load them as whatever program type it
attaches them as. bcc, clang and LLVM never enter this process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from bpfdyno.ebpf import ctypedesc, fdops, handover
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.fdmap import MapSpec, MapTable
from bpfdyno.ebpf.kheaders import HeaderTree

#: How long a compile may take before the helper is given up (clang on a loaded 2-CPU
#: machine takes seconds; the BTF header flavour the longest).
COMPILE_TIMEOUT_S = 300.0


@dataclass(slots=True)
class Compiled:
    """Functions ready to load (map references already ours) and the maps by name."""

    license: bytes
    kern_version: int
    functions: dict[str, bytes]
    maps: dict[str, MapTable] = field(default_factory=dict)

    def close(self) -> None:
        """Close every map fd (the maps go when no program uses them any more)."""
        for table in self.maps.values():
            os.close(table.map_fd)
        self.maps = {}


def compile_in_helper(
    name: str,
    text: str,
    flags: Sequence[str],
    tree: HeaderTree,
    *,
    timeout_s: float = COMPILE_TIMEOUT_S,
) -> Compiled:
    """Compile ``text`` in a helper process and take over its maps.

    Raises:
        BpfLoadError: the helper could not start, compiling failed, or its answer was not
            usable; the message says what to do.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        ours.settimeout(timeout_s)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bpfdyno.ebpf.compilehelper", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                # The helper imports the same bpfdyno (and bcc) this process would.
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        except OSError as e:
            raise BpfLoadError(
                f"starting the BPF compile helper ({sys.executable}) failed: {e.strerror}"
            ) from e
        theirs.close()
        try:
            request = {
                "name": name,
                "text": text,
                "flags": list(flags),
                "tree": {
                    "path": str(tree.path),
                    "kind": tree.kind,
                    "kernel_release": tree.kernel_release,
                    "build_id": tree.build_id,
                },
            }
            handover.send(ours, request)
            answer, fds = handover.receive(ours)
        except (OSError, ConnectionError, ValueError) as e:
            proc.kill()
            raise BpfLoadError(
                f"the BPF compile helper for {name} gave no answer ({e}); its errors are in "
                "the agent's log"
            ) from e
        finally:
            proc.wait()
    finally:
        ours.close()
        theirs.close()
    if "error" in answer:
        raise BpfLoadError(str(answer["error"]))
    try:
        return _take_over(answer, fds)
    except (KeyError, ValueError, TypeError) as e:
        for fd in fds:
            os.close(fd)
        raise BpfLoadError(f"the BPF compile helper's answer for {name} is unusable: {e}") from e


def _take_over(answer: dict[str, object], fds: list[int]) -> Compiled:
    """The `Compiled` of an answer: our fds in place of the helper's."""
    maps_desc = answer["maps"]
    if not isinstance(maps_desc, list):
        raise ValueError("no list of maps")
    if len(maps_desc) != len(fds):
        raise ValueError(f"{len(maps_desc)} maps described, {len(fds)} fds received")
    ncpus = fdops.possible_cpus()
    renumber: dict[int, int] = {}
    maps: dict[str, MapTable] = {}
    for desc, fd in zip(maps_desc, fds, strict=True):
        spec = MapSpec(
            name=str(desc["name"]),
            map_type=int(desc["type"]),
            max_entries=int(desc["max_entries"]),
            key=ctypedesc.build(desc["key"]),
            leaf=ctypedesc.build(desc["leaf"]),
            event=ctypedesc.build(desc["event"]) if desc["event"] is not None else None,
        )
        renumber[int(desc["fd"])] = fd
        maps[spec.name] = MapTable(spec, fd, ncpus)
    functions_desc = answer["functions"]
    if not isinstance(functions_desc, dict):
        raise ValueError("no table of functions")
    functions = {
        str(fn): fdops.relocate_maps(bytes.fromhex(code), renumber)
        for fn, code in functions_desc.items()
    }
    return Compiled(
        license=str(answer["license"]).encode(),
        kern_version=int(str(answer["kern_version"])),
        functions=functions,
        maps=maps,
    )
