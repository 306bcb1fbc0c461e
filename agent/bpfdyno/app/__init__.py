"""Assembling and running the daemon: wiring, the collection loop, serve, doctor."""
