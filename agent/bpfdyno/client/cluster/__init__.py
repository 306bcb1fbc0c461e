"""Job-wide operations across many agents: the library behind ``bpfdyno gputrace --job-id``
and ``bpfdyno top --job-id``, for tool builders too.

- `nodes`: a job's nodes from SLURM (array tasks and heterogeneous jobs included) or from
  hosts given by hand, with each agent's address and the job ids to ask for there;
- `fanout`: concurrent calls to every agent, bounded, with a deadline per host and one
  result per host (an answer, or why there is none);
- `clock`: each agent's clock offset against ours (NTP-style);
- `jobtrace`: a trace of every rank with a common start, reported per host;
- `summary`: one row of live numbers per node (CPU, memory, GPUs, network, run queue,
  trainers, the agent's state).

Example::

    job = resolve_slurm_job(JobRef.parse("1234"), port=50051)
    async with FanOut(job.nodes) as fanout:
        result = await trace_job(fanout, TraceSpec(log_file="/tmp/t.json", iterations=5),
                                 wait=True)
    for host in result.hosts:
        print(host.node.name, host.outcome, [f.path for f in host.files()])
"""

from bpfdyno.client.cluster.clock import ClockOffset, measure_clock
from bpfdyno.client.cluster.fanout import FanOut, HostResult
from bpfdyno.client.cluster.jobtrace import (
    HostOutcome,
    HostTrace,
    JobOutcome,
    JobTraceResult,
    TraceFile,
    plan_start_time_ms,
    trace_job,
)
from bpfdyno.client.cluster.nodes import (
    DEFAULT_AGENT_PORT,
    JobRef,
    Node,
    NodeResolutionError,
    SchedulerUnavailable,
    SlurmJob,
    parse_hosts,
    read_hosts_file,
    resolve_slurm_job,
)

__all__ = [
    "DEFAULT_AGENT_PORT",
    "ClockOffset",
    "FanOut",
    "HostOutcome",
    "HostResult",
    "HostTrace",
    "JobOutcome",
    "JobRef",
    "JobTraceResult",
    "Node",
    "NodeResolutionError",
    "SchedulerUnavailable",
    "SlurmJob",
    "TraceFile",
    "measure_clock",
    "parse_hosts",
    "plan_start_time_ms",
    "read_hosts_file",
    "resolve_slurm_job",
    "trace_job",
]
