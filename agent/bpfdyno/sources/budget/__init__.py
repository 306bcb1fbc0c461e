"""The overhead budget: what the agent costs, kept under ``[budget]`` by reducing itself."""
