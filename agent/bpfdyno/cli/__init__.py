"""The `bpfdyno` command line: one module per command group."""
