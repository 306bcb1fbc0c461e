"""/proc/interrupts and /proc/softirqs read from fixture trees in the kernel's format, and the
interrupt collector's per-IRQ rates from them (its BPF part off)."""

from __future__ import annotations

from pathlib import Path

import pytest
from large_interrupts import big_interrupts

from bpfdyno.core.metrics import Sample
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.host.procfs import ProcfsError
from bpfdyno.sources.irq.collector import SOFTIRQS, IrqCollector
from bpfdyno.sources.irq.procfs import IrqLine, read_interrupts, read_softirqs

#: A GPU server's /proc/interrupts (x86, 4 CPUs shown) and /proc/softirqs, as the kernel
#: prints them (padding included).
FIXTURES = Path(__file__).parent / "fixtures"
INTERRUPTS = (FIXTURES / "interrupts").read_text()
SOFTIRQS_TEXT = (FIXTURES / "softirqs").read_text()


def write_proc(root: Path, interrupts: str, softirqs: str = SOFTIRQS_TEXT) -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/interrupts").write_text(interrupts)
    (root / "proc/softirqs").write_text(softirqs)
    online = root / "sys/devices/system/cpu/online"
    online.parent.mkdir(parents=True, exist_ok=True)
    online.write_text("0-3\n")


def test_every_line_with_its_handlers_names(tmp_path: Path) -> None:
    write_proc(tmp_path, INTERRUPTS)
    interrupts = read_interrupts(tmp_path)
    assert interrupts.cpus == (0, 1, 2, 3)
    lines = interrupts.lines
    assert list(lines) == [
        "0",
        "9",
        "118",
        "119",
        "120",
        "158",
        "170",
        "NMI",
        "LOC",
        "RES",
        "ERR",
        "MIS",
    ]
    assert lines["119"] == IrqLine("119", "mlx5_comp0@pci:0000:3b:00.0", ("9129981", "0", "0", "0"))
    assert lines["119"].counts == (9129981, 0, 0, 0)
    assert lines["9"].name == "acpi"
    assert lines["158"].name == "nvidia"
    assert lines["170"].name == "xhci_hcd, snd_hda_intel:card0"  # a shared line
    assert lines["LOC"].name == "Local timer interrupts"
    assert lines["LOC"].counts == (88123456, 87123456, 86123456, 85123456)
    assert lines["ERR"] == IrqLine("ERR", "", ("0",))
    assert lines["120"].counts == (0, 4294967290, 0, 0)


def test_softirqs_by_name_and_cpu(tmp_path: Path) -> None:
    write_proc(tmp_path, INTERRUPTS)
    s = read_softirqs(tmp_path)
    assert tuple(s) == SOFTIRQS  # the kernel's order
    assert s["NET_RX"] == {0: 345592, 1: 196193, 2: 1000, 3: 9}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "truncated"),
        ("CPU0 CPU1\n", "truncated"),
        ("cpu0 cpu1\n  0: 1 2 x\n", "unexpected header word 'cpu0'"),
        ("CPU0\n  0: timer\n", "no counts on the line of '0'"),
    ],
)
def test_a_malformed_file_says_which_and_what(tmp_path: Path, text: str, problem: str) -> None:
    write_proc(tmp_path, text)
    with pytest.raises(ProcfsError, match=problem) as e:
        read_interrupts(tmp_path)
    assert str(tmp_path / "proc/interrupts") in str(e.value)


class Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def __call__(self) -> float:
        return self.t


def rates(samples: list[Sample], name: str) -> dict[tuple[str, ...], float]:
    return {tuple(v for _, v in s.labels): s.value for s in samples if s.spec.name == name}


def test_rates_per_irq_and_per_cpu_from_two_readings(tmp_path: Path) -> None:
    write_proc(tmp_path, INTERRUPTS)
    clock = Clock()
    c = IrqCollector(root=tmp_path, load_bpf=False, clock=clock)
    c.start()
    later = (
        INTERRUPTS.replace(" 9129981 ", " 9130981 ")  # +1000 on CPU0
        .replace("4294967290", "        20")  # a 32-bit count wrapped: +26
        .replace("1204551", "1204751")  # +200
        .replace("88123456", "88123706")  # +250
    )
    (tmp_path / "proc/interrupts").write_text(later)
    clock.t += 2.0
    out = list(c.collect())
    per_irq = rates(out, "irq_interrupts_per_second")
    assert per_irq[("119", "mlx5_comp0@pci:0000:3b:00.0")] == 500
    assert per_irq[("120", "mlx5_comp1@pci:0000:3b:00.0")] == 13
    assert per_irq[("158", "nvidia")] == 100
    assert per_irq[("LOC", "Local timer interrupts")] == 125
    assert per_irq[("9", "acpi")] == 0
    assert ("ERR", "") in per_irq
    # Per (IRQ, CPU): only the pairs that ever had an interrupt.
    per_cpu = rates(out, "irq_cpu_interrupts_per_second")
    assert per_cpu[("119", "0")] == 500
    assert per_cpu[("120", "1")] == 13
    assert ("119", "1") not in per_cpu
    assert ("LOC", "3") in per_cpu
    assert rates(out, "irq_cpu_series_omitted") == {(): 0}
    assert c.health() == (
        PartState.DEGRADED,
        "softirq and interrupt-handler time unavailable: the BPF part is turned off",
    )


def test_irq_cpu_pairs_are_capped(tmp_path: Path) -> None:
    write_proc(tmp_path, INTERRUPTS)
    clock = Clock()
    c = IrqCollector(root=tmp_path, load_bpf=False, clock=clock, max_irq_cpu_series=3)
    c.start()
    clock.t += 1.0
    out = list(c.collect())
    assert len(rates(out, "irq_cpu_interrupts_per_second")) == 3
    lines = read_interrupts(tmp_path).lines.values()
    nonzero = sum(1 for line in lines if len(line.counts) == 4 for n in line.counts if n)
    assert rates(out, "irq_cpu_series_omitted") == {(): nonzero - 3}


def test_nothing_to_read_is_unavailable_with_both_reasons(tmp_path: Path) -> None:
    c = IrqCollector(root=tmp_path, load_bpf=False)
    with pytest.raises(
        CollectorUnavailable,
        match=r"softirq time: the BPF part is turned off; /proc/interrupts: .*cannot read",
    ):
        c.start()


def test_a_large_machine_file_at_its_real_size(tmp_path: Path) -> None:
    cpus, irqs = 224, 400
    write_proc(tmp_path, big_interrupts(cpus, irqs, 0))
    (tmp_path / "sys/devices/system/cpu/online").write_text(f"0-{cpus - 1}\n")
    assert len((tmp_path / "proc/interrupts").read_bytes()) > 1_000_000
    clock = Clock()
    c = IrqCollector(root=tmp_path, load_bpf=False, clock=clock)
    c.start()
    for step in (1, 2):
        (tmp_path / "proc/interrupts").write_text(big_interrupts(cpus, irqs, step))
        clock.t += 0.5
        out = list(c.collect())
    per_irq = rates(out, "irq_interrupts_per_second")
    assert len(per_irq) == irqs + 1
    assert per_irq[("24", "mlx5_comp0@pci:0000:3b:00.0")] == 2.0
    assert per_irq[("423", "mlx5_comp399@pci:0000:3b:00.0")] == 800.0
    assert per_irq[("LOC", "Local timer interrupts")] == 224 * 500.0
    per_cpu = rates(out, "irq_cpu_interrupts_per_second")
    # One pair per device IRQ (its CPU), every CPU for the timer.
    assert len(per_cpu) == irqs + cpus
    assert per_cpu[("250", str(226 % cpus))] == 454.0
    assert per_cpu[("LOC", "223")] == 500.0
