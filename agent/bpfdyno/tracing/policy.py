"""What a requester may ask of a trace: whose processes, and how much of their time and memory.

Two kinds of rules; every refusal names its rule and what to do.

**Ownership.** A request acts on other processes: the traced process's profiler records into
its memory and writes a file as that process's user. So a requester other than root may only
trace processes of its own uid; root may trace any. The owner of a trainer is the uid the
kernel attached to its polls (``SCM_CREDENTIALS``), not anything the trainer claims. Rules:
``unattributed_requester`` (the request's uid could not be established),
``not_process_owner`` (every process it matched belongs to someone else),
``unknown_process_owner`` (a trainer registered without kernel credentials: only root).

**Limits.** The profiler keeps every event in memory until the trace is written; dynolog
accepted ``ACTIVITIES_DURATION_MSECS=2147483647`` (24 days), and a traced PyTorch process
grows by tens to hundreds of MB per traced second with stacks and shapes
(docs/security.md). Every key that sets how long or from when a process traces is bounded
by ``[tracing]`` keys: ``duration_too_long`` (``max_duration_ms``), ``too_many_iterations``
(``max_iterations``), ``start_too_late`` (``max_start_delay_s``, ``max_start_iterations``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bpfdyno.core.config import TracingSection
from bpfdyno.core.errors import PermissionDenied
from bpfdyno.core.identity import Requester, user_name
from bpfdyno.rpc.traces import KINETO_WARMUP_S
from bpfdyno.tracing.config_text import CheckedConfig, ConfigRejected

#: Kineto's duration when a config names none.
KINETO_DEFAULT_DURATION_MS = 500
#: With PROFILE_START_TIME=0 Kineto starts this long after it receives the config.
KINETO_RELATIVE_START_S = KINETO_WARMUP_S + 2.0
#: Time-valued keys and their unit in milliseconds.
_DURATION_KEYS = {
    "ACTIVITIES_DURATION_MSECS": 1,
    "ACTIVITIES_DURATION_SECS": 1000,
    "PROFILE_MEMORY_DURATION_MSECS": 1,
}
_ITERATION_KEYS = ("ACTIVITIES_ITERATIONS", "ACTIVITIES_WARMUP_ITERATIONS")
_START_ITERATION_KEYS = ("PROFILE_START_ITERATION", "PROFILE_START_ITERATION_ROUNDUP")


@dataclass(frozen=True, slots=True)
class TraceLimits:
    """Upper bounds of what one trace request may ask (``[tracing]`` keys of the same names)."""

    max_duration_ms: int = 30_000
    max_iterations: int = 100
    max_start_delay_s: float = 120.0
    max_start_iterations: int = 10_000

    @classmethod
    def from_config(cls, t: TracingSection) -> TraceLimits:
        return cls(t.max_duration_ms, t.max_iterations, t.max_start_delay_s, t.max_start_iterations)


def check_limits(checked: CheckedConfig, limits: TraceLimits, now_s: float) -> float:
    """Refuse a config that would keep a process tracing (or waiting) longer than allowed.

    Returns:
        For a duration trace, the seconds from now until it must have ended (start plus
        duration); 0 for an iteration trace (its length is in steps, not seconds).

    Raises:
        ConfigRejected: naming the rule and the ``[tracing]`` key that sets the limit.
    """
    values = checked.values
    duration_ms = KINETO_DEFAULT_DURATION_MS
    for key, unit_ms in _DURATION_KEYS.items():
        if key not in values:
            continue
        ms = int(values[key]) * unit_ms
        if ms > limits.max_duration_ms:
            raise ConfigRejected(
                "duration_too_long",
                f"{key}={values[key]} is {ms / 1000:g} s, over this agent's limit of "
                f"{limits.max_duration_ms / 1000:g} s ([tracing] max_duration_ms): the traced "
                "process holds every event in memory until the file is written. Trace for "
                "less time (or fewer iterations), or ask the operator to raise the limit",
            )
        duration_ms = max(duration_ms, ms)
    for key in _ITERATION_KEYS:
        if key in values and int(values[key]) > limits.max_iterations:
            raise ConfigRejected(
                "too_many_iterations",
                f"{key}={values[key]} is over this agent's limit of {limits.max_iterations} "
                "iterations ([tracing] max_iterations); trace fewer steps",
            )
    for key in _START_ITERATION_KEYS:
        if key in values and int(values[key]) > limits.max_start_iterations:
            raise ConfigRejected(
                "start_too_late",
                f"{key}={values[key]} is over this agent's limit of "
                f"{limits.max_start_iterations} ([tracing] max_start_iterations); the process "
                "would wait that many steps holding the config. Use a smaller round-up",
            )
    warmup = values.get("ACTIVITIES_WARMUP_PERIOD_SECS")
    if warmup is not None and int(warmup) > limits.max_start_delay_s:
        raise ConfigRejected(
            "start_too_late",
            f"ACTIVITIES_WARMUP_PERIOD_SECS={warmup} is over this agent's limit of "
            f"{limits.max_start_delay_s:g} s ([tracing] max_start_delay_s)",
        )
    start_in_s = KINETO_RELATIVE_START_S
    if checked.start_time_ms:
        start_in_s = checked.start_time_ms / 1000 - now_s
        if start_in_s > limits.max_start_delay_s:
            raise ConfigRejected(
                "start_too_late",
                f"PROFILE_START_TIME={checked.start_time_ms} is {start_in_s:.0f} s from now, "
                f"later than this agent's limit of {limits.max_start_delay_s:g} s ([tracing] "
                "max_start_delay_s); the process would stay busy until then. Start sooner, "
                "or use 0 (about 7 s after delivery)",
            )
    if checked.iteration_mode:
        return 0.0
    return start_in_s + duration_ms / 1000


def require_attributed(requester: Requester) -> None:
    """Refuse a request whose uid is unknown: it may read, not act.

    Raises:
        PermissionDenied: rule ``unattributed_requester``, with why and the fix.
    """
    if requester.attributed:
        return
    raise PermissionDenied(
        f"refused by rule 'unattributed_requester': the agent cannot tell which user sent "
        f"this request ({requester.note or 'no credentials'}), and only a known user may "
        "start traces. Send it from this host (bpfdyno gputrace, or dyno on this host), or "
        "over gRPC TCP with TLS and a token (docs/security.md)",
        rule="unattributed_requester",
    )


def sees(requester: Requester, requested_by: int | None) -> bool:
    """Whether ``requester`` may see a trace (its state, files, summary) that the uid
    ``requested_by`` asked for: root sees every trace, any other user the traces it asked
    for, an unattributed requester none (the rule of the audit trail)."""
    if requester.privileged:
        return True
    return requester.attributed and requested_by == requester.uid


def ownership_problem(requester: Requester, owner_uid: int | None) -> str:
    """Why ``requester`` may not trace a process owned by ``owner_uid`` ("" when it may)."""
    if requester.privileged:
        return ""
    if owner_uid is None:
        return (
            "its owner is unknown (it registered without kernel credentials), so only root "
            "may trace it (rule 'unknown_process_owner')"
        )
    if owner_uid == requester.uid:
        return ""
    return (
        f"it belongs to {describe_uid(owner_uid)}; {describe_uid(requester.uid)} may trace "
        "only its own processes (rule 'not_process_owner')"
    )


def refuse_not_owner(requester: Requester, others: Sequence[tuple[int, int | None]]) -> None:
    """Every process a request matched belongs to someone else: refuse the whole request.

    Args:
        requester: who asked.
        others: (pid, owner uid) of the matched processes the requester may not trace.

    Raises:
        PermissionDenied: rule ``not_process_owner``.
    """
    shown = ", ".join(f"pid {pid} ({describe_uid(uid)})" for pid, uid in others[:8])
    more = f" and {len(others) - 8} more" if len(others) > 8 else ""
    rule = "unknown_process_owner" if all(uid is None for _, uid in others) else "not_process_owner"
    raise PermissionDenied(
        f"refused by rule '{rule}': the request matched {shown}{more}, and "
        f"{describe_uid(requester.uid)} may trace only its own processes. Trace your own "
        "processes (bpfdyno trainers lists each one's owner), or ask their owner or root",
        rule=rule,
    )


def describe_uid(uid: int | None) -> str:
    """``uid 1000 (alice)``, or ``an unknown owner``."""
    if uid is None:
        return "an unknown owner"
    name = user_name(uid)
    return f"uid {uid} ({name})" if name else f"uid {uid}"
