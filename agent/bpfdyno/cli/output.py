"""What the client commands share: talking to one agent, ``--json`` documents, failed calls.

``--json`` output is stable: its field names are the API's (see each command), and numbers
are JSON numbers, 64-bit counters included (`bpfdyno.rpc.wire.message_dict`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import EXIT_FAIL
from bpfdyno.client.errors import AgentError, ErrorKind


def print_json(obj: Any, *, indent: bool = True) -> None:
    """Write one JSON document on stdout (indented, or on one line for streams)."""
    option = orjson.OPT_INDENT_2 if indent else 0
    sys.stdout.write(orjson.dumps(obj, option=option).decode() + "\n")
    sys.stdout.flush()


def with_agent(
    target: str, work: Callable[[AgentClient], Awaitable[int]], *, refused: int = EXIT_FAIL
) -> int:
    """Run ``work`` with a client of the agent at ``target``; returns its exit status.

    A failed call is said on stderr, in the client's words (what went wrong and what to do):
    exit status ``refused`` when the agent refused the request itself, else 1.
    """

    async def run() -> int:
        async with AgentClient(target) as agent:
            return await work(agent)

    try:
        return asyncio.run(run())
    except AgentError as e:
        print(f"bpfdyno: {e}", file=sys.stderr)
        return refused if e.kind is ErrorKind.REFUSED else EXIT_FAIL
