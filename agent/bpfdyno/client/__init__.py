"""Talking to running agents over gRPC (the CLI, the TUI and tool builders use this)."""
