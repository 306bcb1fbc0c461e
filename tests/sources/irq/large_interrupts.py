"""A large machine's /proc/interrupts, built to size (for tests and benchmarks)."""

from __future__ import annotations


def big_interrupts(cpus: int, irqs: int, step: int) -> str:
    """A large machine's /proc/interrupts (a megabyte at 224 CPUs): IRQ i fires on CPU
    i % cpus only, i + 1 times per step; the local timer on every CPU, 250 per step."""
    lines = ["    " + "".join(f"{'CPU' + str(c):>11}" for c in range(cpus))]
    for i in range(irqs):
        counts = "".join(
            f"{(1_000 + (i + 1) * step) if c == i % cpus else 0:>11}" for c in range(cpus)
        )
        lines.append(
            f"{i + 24:>4}:{counts}  IR-PCI-MSIX-0000:3b:00.0  {i}-edge      "
            f"mlx5_comp{i}@pci:0000:3b:00.0"
        )
    lines.append(
        " LOC:"
        + "".join(f"{10**9 + 250 * step:>11}" for _ in range(cpus))
        + "   Local timer interrupts"
    )
    return "\n".join(lines) + "\n"
