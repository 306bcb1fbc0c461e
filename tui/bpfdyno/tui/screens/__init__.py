"""Screens pushed over the main tabs: help, process details, the trace form."""
