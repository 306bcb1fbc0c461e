"""bpfdyno top: the Textual terminal UI (talks to the agent only through a DataSource)."""
