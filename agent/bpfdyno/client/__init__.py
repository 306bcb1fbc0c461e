"""Talking to running agents over gRPC: the CLI, the TUI and tool builders use this.

`AgentClient` is one agent's whole API in the API's own records (`bpfdyno.rpc`); every call
returns records or raises an `AgentError`. `bpfdyno.client.cluster` asks every agent of a job
at once.
"""

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.errors import AgentError, ClientSetupError, ErrorKind

__all__ = ["AgentClient", "AgentError", "ClientSetupError", "ErrorKind"]
