"""The errors every data source raises; the UI shows their messages as they are."""

from __future__ import annotations


class DataSourceError(Exception):
    """Base of the data source errors; the message is shown to the user as is."""


class Disconnected(DataSourceError):
    """The agent cannot be reached (not running, restarting, wrong address, no permission)."""


class ServiceUnavailable(DataSourceError):
    """The agent answers, but not this part of the API (an older agent, a disabled part)."""


class RequestFailed(DataSourceError):
    """The agent refused a request (bad argument, nothing matched); the message says why."""
