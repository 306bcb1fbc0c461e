"""Short, fixed-width text for numbers, by unit. Pure functions, no I/O.

Units come from the agent's metric specs (``bytes``, ``bytes/s``, ``ratio``, ``1/s``...);
every function shows an unknown value (None or NaN) as ``-`` rather than a misleading 0.
"""

from __future__ import annotations

import math
import time

UNKNOWN = "-"
_BYTE_UNITS = ("B", "K", "M", "G", "T", "P")
_SI_UNITS = ("", "k", "M", "G", "T", "P")
#: Blocks for sparklines, from empty to full.
SPARK_BLOCKS = " ▁▂▃▄▅▆▇█"
#: Eighth blocks for horizontal bars.
_BAR_EIGHTHS = " ▏▎▍▌▋▊▉"


def _unknown(value: float | int | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _scaled(value: float, step: float, units: tuple[str, ...]) -> tuple[str, float, str]:
    """(sign, magnitude, unit) of ``value`` in the largest unit (``step`` apart) that keeps
    the magnitude under ``step``."""
    sign, v = ("-" if value < 0 else ""), abs(value)
    for unit in units[:-1]:
        if v < step:
            return sign, v, unit
        v /= step
    return sign, v, units[-1]


def fmt_bytes(value: float | int | None) -> str:
    """Bytes in binary units with 3 significant digits: ``512B``, ``1.5K``, ``12.3G``."""
    if value is None or _unknown(value):
        return UNKNOWN
    sign, v, unit = _scaled(float(value), 1024, _BYTE_UNITS)
    if unit == "B":
        return f"{sign}{v:.0f}B"
    return f"{sign}{v:.1f}{unit}" if v < 100 else f"{sign}{v:.0f}{unit}"


def fmt_si(value: float | int | None, suffix: str = "") -> str:
    """A count or rate in SI units with up to 3 significant digits: ``950``, ``1.2k``."""
    if value is None or _unknown(value):
        return UNKNOWN
    sign, v, unit = _scaled(float(value), 1000, _SI_UNITS)
    if unit == "":
        text = f"{v:.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"
    else:
        text = f"{v:.1f}" if v < 100 else f"{v:.0f}"
    return f"{sign}{text}{unit}{suffix}"


def fmt_percent(ratio: float | None, digits: int = 0) -> str:
    """A 0..1 ratio as a percentage: ``0.456`` -> ``46%``."""
    if _unknown(ratio):
        return UNKNOWN
    assert ratio is not None
    return f"{ratio * 100:.{digits}f}%"


def fmt_duration(seconds: float | None) -> str:
    """A duration, compact: ``45s``, ``12m03s``, ``5h07m``, ``3d04h``."""
    if _unknown(seconds):
        return UNKNOWN
    assert seconds is not None
    s = max(0, int(seconds))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


def fmt_ns(ns: float | None) -> str:
    """Nanoseconds per event: ``87ns``, ``1.2us``, ``3.4ms``."""
    return fmt_seconds(None if ns is None else ns / 1e9, micro_digits=1)


def fmt_seconds(seconds: float | None, micro_digits: int = 0) -> str:
    """A short duration with sub-second precision: ``850ns``, ``12us``, ``3.4ms``, ``1.2s``
    (microseconds with ``micro_digits`` decimals)."""
    if seconds is None or _unknown(seconds):
        return UNKNOWN
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f}ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.{micro_digits}f}us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.1f}s"


def fmt_clock(ts: float | None) -> str:
    """Epoch seconds as local ``HH:MM:SS``."""
    if _unknown(ts) or not ts:
        return UNKNOWN
    assert ts is not None
    return time.strftime("%H:%M:%S", time.localtime(ts))


def fmt_value(value: float | None, unit: str) -> str:
    """Format a metric value by the unit its spec declares.

    Args:
        value: the value; None or NaN shows as ``-``.
        unit: the spec's unit: bytes, bytes/s, ratio, 1/s, seconds, ns, celsius, watts,
            hertz, boolean, or a count noun (tasks, threads...).
    """
    if _unknown(value):
        return UNKNOWN
    assert value is not None
    u = unit.strip().lower()
    if u in ("bytes", "byte", "b"):
        return fmt_bytes(value)
    if u in ("bytes/s", "b/s", "bytes per second"):
        return fmt_bytes(value) + "/s"
    if u in ("ratio", "fraction"):
        return fmt_percent(value)
    if u in ("1/s", "/s", "per second"):
        return fmt_si(value, "/s")
    if u in ("seconds", "s"):
        return fmt_duration(value)
    if u in ("ns", "nanoseconds"):
        return fmt_ns(value)
    if u in ("celsius", "°c", "c"):
        return f"{value:.0f}°C"
    if u in ("watts", "w"):
        return f"{value:.0f}W" if value >= 10 else f"{value:.1f}W"
    if u in ("hertz", "hz"):
        return fmt_si(value, "Hz")
    if u == "boolean":
        return "yes" if value else "no"
    return fmt_si(value)


def unit_from_name(name: str) -> str:
    """A unit guessed from a metric name's suffix, for metrics without a known spec."""
    for suffix, unit in (
        ("_bytes_per_second", "bytes/s"),
        ("_per_second", "1/s"),
        ("_bytes", "bytes"),
        ("_ratio", "ratio"),
        ("_celsius", "celsius"),
        ("_watts", "watts"),
        ("_hertz", "hertz"),
        ("_ns", "ns"),
        ("_seconds", "seconds"),
    ):
        if name.endswith(suffix):
            return unit
    return ""


def sparkline(values: list[float], width: int, top: float | None = None) -> str:
    """The last ``width`` values as block characters, scaled to ``top`` (default: the max).

    Unknown values show as a space; an empty history is all spaces, so the widget keeps its
    width while data arrives.
    """
    if width <= 0:
        return ""
    tail = values[-width:]
    known = [v for v in tail if not math.isnan(v)]
    scale = top if top is not None else (max(known) if known else 0.0)
    out = []
    for v in tail:
        if math.isnan(v):
            out.append(" ")
        elif scale <= 0:
            out.append(SPARK_BLOCKS[1])
        else:
            level = round(min(max(v / scale, 0.0), 1.0) * (len(SPARK_BLOCKS) - 2)) + 1
            out.append(SPARK_BLOCKS[level])
    return " " * (width - len(out)) + "".join(out)


def bar(ratio: float, width: int) -> str:
    """A horizontal bar ``width`` cells wide, filled to ``ratio`` (0..1) in eighths."""
    if width <= 0:
        return ""
    if math.isnan(ratio):
        return " " * width
    eighths = round(min(max(ratio, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_BAR_EIGHTHS[part] if part else "")
    return text.ljust(width)
