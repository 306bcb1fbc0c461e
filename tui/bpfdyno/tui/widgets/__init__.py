"""Panels and lists of the bpfdyno top UI."""
