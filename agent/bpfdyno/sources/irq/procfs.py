"""Parsers of ``/proc/interrupts`` and ``/proc/softirqs`` over any root directory.

Both files have a header of the online CPUs (``CPU0 CPU1 ...``) and one line per source
with a count per online CPU. Values are cumulative, exactly as the kernel prints them.
Any problem with a file raises `ProcfsError` naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.sources.host.procfs import ProcfsError

#: The trigger field of an x86 or generic line ("4-edge", "27-fasteoi", "Level", ...): the
#: device's handler names follow it.
_TRIGGER = re.compile(r"^(?:\d+-[a-z]+|[Ee]dge|[Ll]evel)$")


@dataclass(frozen=True, slots=True)
class IrqLine:
    """One line of ``/proc/interrupts``.

    Attributes:
        irq: the IRQ number, or the architecture's name of the line (``LOC``, ``RES``...).
        name: the handlers' names (``virtio2-input.0``, ``mlx5_comp0@pci:0000:3b:00.0``;
            several joined by ", "), or the description of a named line.
        fields: the interrupts per column of the file's CPUs (`Interrupts.cpus`), as the
            kernel printed them (decimal digits); a line with one count for the whole system
            (``ERR``, ``MIS``) has that one only. Kept as text: on a large machine most of
            them do not change from one reading to the next, and only those that did need
            converting (see `counts` for all of them as numbers).
        text: the line as read (a line that did not change need not be split again).
    """

    irq: str
    name: str
    fields: tuple[str, ...]
    text: str = field(default="", compare=False, repr=False)

    @property
    def counts(self) -> tuple[int, ...]:
        """The interrupts per column, as numbers."""
        return tuple(map(int, self.fields))


@dataclass(frozen=True, slots=True)
class Interrupts:
    """``/proc/interrupts``: the online CPUs of its columns, and its lines by IRQ."""

    cpus: tuple[int, ...]
    lines: dict[str, IrqLine]


def _header_cpus(path: Path, header: str) -> tuple[int, ...]:
    cpus = []
    for word in header.split():
        if not word.startswith("CPU") or not word[3:].isdigit():
            raise ProcfsError(path, f"unexpected header word {word!r} (expected CPU<n>)")
        cpus.append(int(word[3:]))
    if not cpus:
        raise ProcfsError(path, "no CPU columns in the header")
    return tuple(cpus)


def _read_lines(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise ProcfsError(path, f"cannot read ({e.strerror})") from e
    if len(lines) < 2:
        raise ProcfsError(path, "truncated: no lines after the header")
    return lines


def read_interrupts(root: Path = Path("/"), previous: Interrupts | None = None) -> Interrupts:
    """``<root>/proc/interrupts``.

    On a large machine the file is a megabyte (hundreds of IRQs, a column per CPU) read every
    collection, so a line that is the same as in ``previous`` (an IRQ that did not fire) is
    taken from it, and a line's counts are checked in one go and kept as text.

    Raises:
        ProcfsError: the file is missing, unreadable or not in the kernel's format.
    """
    path = root / "proc" / "interrupts"
    lines = _read_lines(path)
    cpus = _header_cpus(path, lines[0])
    n = len(cpus)
    before = previous.lines if previous is not None and previous.cpus == cpus else {}
    out: dict[str, IrqLine] = {}
    for line in lines[1:]:
        label, colon, rest = line.partition(":")
        if not colon:
            continue
        irq = label.strip()
        same = before.get(irq)
        if same is not None and same.text == rest:
            out[irq] = same
            continue
        tokens = rest.split()
        if len(tokens) >= n and "".join(tokens[:n]).isdigit():  # a count per CPU
            fields, text = tuple(tokens[:n]), tokens[n:]
        elif tokens and tokens[0].isdigit():  # ERR, MIS: one count for the system
            fields, text = (tokens[0],), tokens[1:]
        else:
            raise ProcfsError(path, f"no counts on the line of {irq!r}")
        out[irq] = IrqLine(irq, _handler_names(irq, text), fields, rest)
    return Interrupts(cpus, out)


def _handler_names(irq: str, tokens: list[str]) -> str:
    """What follows the counts: the handlers' names of a numbered IRQ, else the description."""
    if not irq.isdigit():
        return " ".join(tokens)
    for i in range(len(tokens) - 1, -1, -1):
        if _TRIGGER.match(tokens[i]):
            return " ".join(tokens[i + 1 :])
    # No trigger field (an unusual chip): everything after the chip's name.
    return " ".join(tokens[1:]) if len(tokens) > 1 else " ".join(tokens)


def read_softirqs(root: Path = Path("/")) -> dict[str, dict[int, int]]:
    """``<root>/proc/softirqs``: softirq name (``NET_RX``...) -> online CPU -> runs.

    Raises:
        ProcfsError: the file is missing, unreadable or not in the kernel's format.
    """
    path = root / "proc" / "softirqs"
    lines = _read_lines(path)
    cpus = _header_cpus(path, lines[0])
    out: dict[str, dict[int, int]] = {}
    for line in lines[1:]:
        name, colon, rest = line.partition(":")
        values = rest.split()
        if not colon or len(values) != len(cpus) or not all(v.isdigit() for v in values):
            raise ProcfsError(path, f"malformed line {line.strip()!r}")
        out[name.strip()] = {cpu: int(v) for cpu, v in zip(cpus, values, strict=True)}
    return out
