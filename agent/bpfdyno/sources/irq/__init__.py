"""Interrupt telemetry: softirq and device-interrupt time from BPF, interrupts per IRQ."""
