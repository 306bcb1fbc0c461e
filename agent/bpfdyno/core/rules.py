"""Validation rules that more than one entry point applies, each written once.

The CLI checks its arguments with these before it sends anything (so a typo fails fast with
exit 2), and the services apply the same functions to what arrives over gRPC and the legacy
RPC, so every entry point accepts and refuses exactly the same values with the same words.
Rules specific to one domain live with it (trace configs in `bpfdyno.tracing.config_text`,
log-file paths in `bpfdyno.tracing.paths`); they raise the same `InvalidArgument`.
"""

from __future__ import annotations

import math

from bpfdyno.core.errors import InvalidArgument

#: Longest dcgm-pause accepted: a week (profiling metrics should not stay off forever).
MAX_PAUSE_S = 7 * 24 * 3600


def pause_duration_s(value: object) -> int:
    """A dcgm-pause duration: a whole number of seconds in 1..`MAX_PAUSE_S`.

    Raises:
        InvalidArgument: anything else (rule ``pause_duration``).
    """
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value == int(value)
        and 1 <= value <= MAX_PAUSE_S
    ):
        return int(value)
    raise InvalidArgument(
        f"the pause duration must be a positive number of seconds up to {MAX_PAUSE_S} "
        f"(7 days), got {value!r}; pass e.g. --duration-s 300",
        rule="pause_duration",
    )
