"""The Kineto on-demand config text: building it (as the dyno CLI does) and checking it.

Kineto parses ``KEY=VALUE`` lines and *silently stops at the first bad line* (a malformed
line, a bad integer or boolean, a ``PROFILE_START_TIME`` more than 10 s in the past),
ignoring everything after it and telling nobody. So every config — built here from options,
or received as raw text from the legacy RPC — is validated before it is handed out, and a
rejection names the rule it broke.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.text import printable
from bpfdyno.rpc.traces import KINETO_WARMUP_S, TraceSpec
from bpfdyno.tracing.paths import PathRejected, check_log_file

#: Largest config text accepted (Kineto's limit is the ~212 KB datagram; stay far below).
MAX_CONFIG_BYTES = 32 * 1024
#: Kineto drops a config whose PROFILE_START_TIME is more than this far in the past.
KINETO_MAX_REQUEST_AGE_S = 10.0

TRACE_ID_KEY = "REQUEST_TRACE_ID"
_KEY_RE = re.compile(r"[A-Z][A-Z0-9_]*")
_INT_KEYS = frozenset(
    {
        "ACTIVITIES_DURATION_MSECS",
        "ACTIVITIES_DURATION_SECS",
        "ACTIVITIES_ITERATIONS",
        "ACTIVITIES_WARMUP_PERIOD_SECS",
        "ACTIVITIES_WARMUP_ITERATIONS",
        "ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB",
        "PROFILE_START_ITERATION",
        "PROFILE_START_ITERATION_ROUNDUP",
        "PROFILE_START_TIME",
        "PROFILE_MEMORY_DURATION_MSECS",
        "VERBOSE_LOG_LEVEL",
    }
)
_BOOL_KEYS = frozenset(
    {
        "ACTIVITIES_ENABLED",
        "PROFILE_REPORT_INPUT_SHAPES",
        "PROFILE_PROFILE_MEMORY",
        "PROFILE_WITH_STACK",
        "PROFILE_WITH_FLOPS",
        "PROFILE_WITH_MODULES",
        "PROFILE_MEMORY",
    }
)
#: What Kineto's toBool accepts (case-insensitive); anything else stops its parse.
_BOOL_VALUES = frozenset({"n", "y", "no", "yes", "f", "t", "false", "true", "0", "1"})
_TRUE_VALUES = frozenset({"y", "yes", "t", "true", "1"})
#: Kineto reads every integer key as int32 except the epoch-ms start time (int64), and
#: rejects negative values.
_INT32_MAX = 2**31 - 1
_INT64_KEYS = frozenset({"PROFILE_START_TIME"})


class ConfigRejected(InvalidArgument):
    """A config (or one of the options it is built from) that breaks a rule.

    Attributes:
        rule: the rule's short name, shown to the user.
    """

    def __init__(self, rule: str, message: str, *, prefixed: bool = False) -> None:
        super().__init__(
            message if prefixed else f"config rejected by rule '{rule}': {message}", rule=rule
        )


def _b(v: bool) -> str:
    return "true" if v else "false"


def build_config(opts: TraceSpec) -> str:
    """The config text of a request's profiler options, line for line what ``dyno gputrace``
    sends (the spec's other fields — who to trace — are not the config's).

    Raises:
        ConfigRejected: options Kineto cannot honour (memory profiling in iteration mode).
    """
    _check_options(opts)
    lines = [f"ACTIVITIES_LOG_FILE={opts.log_file}"]
    if opts.iteration_mode:
        if opts.profile_memory:
            raise ConfigRejected(
                "memory_needs_duration",
                "memory profiling works only with a duration trace; drop --iterations",
            )
        lines += [
            "PROFILE_START_ITERATION=0",
            f"PROFILE_START_ITERATION_ROUNDUP={opts.profile_start_iteration_roundup}",
            f"ACTIVITIES_ITERATIONS={opts.iterations}",
        ]
    else:
        lines += [
            f"PROFILE_START_TIME={opts.profile_start_time_ms}",
            f"ACTIVITIES_DURATION_MSECS={opts.duration_ms}",
        ]
    lines.append(f"PROFILE_REPORT_INPUT_SHAPES={_b(opts.record_shapes)}")
    if opts.profile_memory:
        # PROFILE_PROFILE_MEMORY turns on the Python side; PROFILE_MEMORY the snapshot.
        lines += [
            "PROFILE_PROFILE_MEMORY=true",
            "PROFILE_MEMORY=true",
            f"PROFILE_MEMORY_DURATION_MSECS={opts.duration_ms}",
        ]
    lines += [
        f"PROFILE_WITH_STACK={_b(opts.with_stacks)}",
        f"PROFILE_WITH_FLOPS={_b(opts.with_flops)}",
        f"PROFILE_WITH_MODULES={_b(opts.with_modules)}",
    ]
    return "\n".join(lines)


def _check_options(opts: TraceSpec) -> None:
    def bad(what: str) -> ConfigRejected:
        return ConfigRejected("bad_option", what)

    if not 0 < opts.duration_ms <= _INT32_MAX:
        raise bad(f"duration_ms = {opts.duration_ms}; give a duration in 1..{_INT32_MAX} ms")
    if opts.iterations > _INT32_MAX:
        raise bad(f"iterations = {opts.iterations} is too large")
    if opts.iteration_mode and not 1 <= opts.profile_start_iteration_roundup <= _INT32_MAX:
        raise bad(
            f"profile_start_iteration_roundup = {opts.profile_start_iteration_roundup}; it must be "
            "at least 1"
        )
    if opts.profile_start_time_ms < 0:
        raise bad(
            f"profile_start_time_ms = {opts.profile_start_time_ms}; use 0 or epoch milliseconds"
        )


@dataclass(frozen=True, slots=True)
class CheckedConfig:
    """A config that passed every rule, with what the tracker needs to know about it.

    Attributes:
        text: the config text, normalised (trimmed lines, comments and blanks dropped).
        log_file: ``ACTIVITIES_LOG_FILE``, or "" when Kineto's default is used.
        iteration_mode: True when the trace is counted in optimizer steps.
        memory_snapshot: True when Kineto writes a memory snapshot instead of a trace.
        start_time_ms: ``PROFILE_START_TIME`` (0 = relative to delivery).
        values: every key and its (trimmed) value, for the limits of
            `bpfdyno.tracing.policy`.
    """

    text: str
    log_file: str
    iteration_mode: bool
    memory_snapshot: bool
    start_time_ms: int
    values: Mapping[str, str] = field(default_factory=dict)


def check_config(
    text: str,
    allowed_dirs: Sequence[str],
    now_s: float | None = None,
    sees: Callable[[str], bool] | None = None,
) -> CheckedConfig:
    """Validate config text line by line so Kineto never silently drops part of it.

    ``sees`` is passed to `paths.check_log_file` (what the requester could look up).

    Raises:
        ConfigRejected: naming the rule: size, line syntax, key, value characters, integer
            or boolean values, start time, ``REQUEST_TRACE_ID`` (set by the daemon), or the
            log-file rules of `paths.check_log_file`.
    """
    now_s = time.time() if now_s is None else now_s
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigRejected(
            "too_large", f"the config is {size} bytes; the limit is {MAX_CONFIG_BYTES}"
        )
    if "\0" in text or "\r" in text:
        raise ConfigRejected(
            "control_character", "the config contains a NUL or carriage return; use plain lines"
        )
    values: dict[str, str] = {}
    lines: list[str] = []
    for n, raw in enumerate(text.split("\n"), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep:
            raise ConfigRejected(
                "line_syntax",
                f"line {n} ({raw.strip()[:60]!r}) is not KEY=VALUE; Kineto "
                "would silently ignore it and every line after it",
            )
        if not _KEY_RE.fullmatch(key):
            raise ConfigRejected(
                "bad_key", f"line {n}: {key[:60]!r} is not an upper-case config key"
            )
        if "=" in value or not all(map(printable, value)):
            raise ConfigRejected(
                "bad_value_character",
                f"line {n}: the value of {key} contains '=', a control or line-separator "
                "character, or an invisible (e.g. bidirectional) character",
            )
        if key == TRACE_ID_KEY:
            raise ConfigRejected(
                "trace_id_reserved", f"{TRACE_ID_KEY} is set by the daemon; remove line {n}"
            )
        if key in _INT_KEYS:
            limit = 2**63 - 1 if key in _INT64_KEYS else _INT32_MAX
            if not re.fullmatch(r"\d{1,19}", value) or int(value) > limit:
                raise ConfigRejected(
                    "bad_integer",
                    f"line {n}: {key}={value[:40]} is not an integer in 0..{limit}",
                )
        if key in _BOOL_KEYS and value.lower() not in _BOOL_VALUES:
            raise ConfigRejected("bad_boolean", f"line {n}: {key}={value[:40]} is not true/false")
        values[key] = value
        lines.append(f"{key}={value}")
    start_time_ms = int(values.get("PROFILE_START_TIME", "0"))
    if start_time_ms != 0 and start_time_ms / 1000.0 < now_s + KINETO_WARMUP_S:
        raise ConfigRejected(
            "start_time_too_early",
            f"PROFILE_START_TIME={start_time_ms} is less than {KINETO_WARMUP_S:.0f} s from now "
            "(or in the past); Kineto needs that long to warm up and would not trace. Use 0 "
            "(start ~7 s after delivery) or a time at least 10 s ahead",
        )
    log_file = values.get("ACTIVITIES_LOG_FILE", "")
    if log_file:
        try:
            check_log_file(log_file, allowed_dirs, sees)
        except PathRejected as e:
            raise ConfigRejected(e.rule, str(e), prefixed=True) from e
    iteration_mode = int(values.get("ACTIVITIES_ITERATIONS", "0")) > 0 or (
        "PROFILE_START_ITERATION" in values
    )
    memory = values.get("PROFILE_MEMORY", "false").lower() in _TRUE_VALUES
    return CheckedConfig(
        text="\n".join(lines),
        log_file=log_file,
        iteration_mode=iteration_mode,
        memory_snapshot=memory,
        start_time_ms=start_time_ms,
        values=values,
    )


def with_trace_id(config: str, trace_id: str) -> str:
    """The config as handed to a process: the request's text plus its trace id."""
    return f"{config}\n{TRACE_ID_KEY}={trace_id}"
