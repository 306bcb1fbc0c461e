"""The numbers the BPF programs and their readers share come from the C headers."""

from __future__ import annotations

from bpfdyno.core.histogram import LOG2_SLOTS
from bpfdyno.ebpf.headers import header_defines, header_enum, header_text
from bpfdyno.sources.sched import collector as sched


def test_defines_with_a_prefix_and_trailing_comments() -> None:
    text = "#define CAP_F_NET 1\n#define CAP_F_SCHED 2 /* the scheduler track */\n#define X 3\n"
    assert header_defines(text, "CAP_F_") == {"CAP_F_NET": 1, "CAP_F_SCHED": 2}


def test_the_sched_reader_takes_its_numbers_from_sched_h() -> None:
    text = header_text("sched.h")
    assert header_enum(text, "sched_event_kind") == {"SCHED_EV_EXEC": 1, "SCHED_EV_EXIT": 2}
    assert (sched.SCHED_EV_EXEC, sched.SCHED_EV_EXIT) == (1, 2)
    assert (sched.SCHED_ERR_EXIT_FULL, sched.SCHED_ERR_RINGBUF, sched.SCHED_ERR_MARK) == (0, 1, 2)
    # The per-CPU histogram is decoded with the log2 decoder: the slot counts must agree.
    assert sched.SCHED_HIST_SLOTS == LOG2_SLOTS == 64
