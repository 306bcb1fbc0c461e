"""The overhead budget's metrics: what the agent costs against its budget, and every step.

Costs are shares of one CPU: the BPF programs' run time from the kernel's run statistics
(duty-cycled windows, their own ~20 ns per run included) and the CPU time of the agent's
threads (work done at someone's request, such as compiling programs or merging a trace, is
left out).
"""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricTable

TABLE = MetricTable("budget")

COST = TABLE.declare(
    "agent_cost_ratio",
    MetricKind.RATIO,
    "ratio",
    'What the agent costs as a share of one CPU, as the budget counts it: part "bpf" (its '
    "BPF programs' run time in the last run-statistics window, the statistics' own cost left "
    'out), "agent" (its threads\' CPU time over the last 10 s, requested one-off work left '
    'out) and "total" (both, what the budget limits).',
    ("part",),
)
BUDGET = TABLE.declare(
    "agent_budget_ratio",
    MetricKind.GAUGE,
    "ratio",
    "The most the agent may cost, as a share of one CPU ([budget] cpu_ratio).",
)
OVER = TABLE.declare(
    "agent_budget_exceeded",
    MetricKind.GAUGE,
    "boolean",
    "1 while the agent's total cost in the last period was above its budget.",
)
STEP_ACTIVE = TABLE.declare(
    "agent_budget_step_active",
    MetricKind.GAUGE,
    "boolean",
    "1 while the budget holds this step (what it does and what it costs the data: `bpfdyno "
    "status`, part budget), 0 otherwise.",
    ("step",),
)
STEPS_TAKEN = TABLE.declare(
    "agent_budget_steps_total",
    MetricKind.COUNTER,
    "steps",
    "Times the budget took this step since the agent started (undoing it is not counted).",
    ("step",),
)
FUNCTION_COST = TABLE.declare(
    "bpf_function_cost_ratio",
    MetricKind.RATIO,
    "ratio",
    "Run time of one BPF function of the agent in the last run-statistics window as a share "
    "of one CPU (every program of the agent: collectors and trace capture).",
    ("program",),
)
RSS_BUDGET = TABLE.declare(
    "agent_rss_budget_bytes",
    MetricKind.GAUGE,
    "bytes",
    "The most resident memory the agent may use before it sheds history ([budget] rss_bytes).",
)
