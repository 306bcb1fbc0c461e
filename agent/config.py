"""Daemon configuration: a TOML file, then command-line overrides, validated in one place.

Every problem is reported as a `ConfigError` naming the file, the line and the key, so the
CLI can print it and exit 2 before anything is started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/bpfdyno/bpfdyno.toml")
DEFAULT_SOCKET = "/run/bpfdyno/bpfdyno.sock"

#: Collectors the daemon knows; ``[collectors.<name>]`` may only name these.
KNOWN_COLLECTORS = ("host", "self", "sched", "net", "pmu", "gpu")


class ConfigError(Exception):
    """A configuration problem, with where it is and what to do about it."""

    def __init__(self, message: str, source: str = "", line: int | None = None) -> None:
        where = source
        if line is not None:
            where = f"{source}:{line}" if source else f"line {line}"
        super().__init__(f"{where}: {message}" if where else message)
        self.source = source
        self.line = line


@dataclass
class DaemonSection:
    #: Default collection interval for every collector, in seconds.
    interval_s: float = 1.0
    #: How much history the in-memory store keeps for window queries, in seconds.
    history_s: float = 900.0
    #: Most series the store holds before evicting the least recently updated.
    max_series: int = 50_000
    #: One of debug, info, warning, error.
    log_level: str = "info"


@dataclass
class GrpcSection:
    #: Unix socket path of the gRPC API; its file permissions are the access control.
    socket: str = DEFAULT_SOCKET
    #: Permission bits of the socket file.
    socket_mode: int = 0o660
    #: Optional group owning the socket (e.g. "bpfdyno"), so members can use `bpfdyno top`.
    socket_group: str = ""
    #: "host:port" to also listen on TCP; empty (the default) means Unix socket only.
    tcp: str = ""


@dataclass
class JsonlSection:
    #: Write every collection round as one JSON line.
    enabled: bool = False
    #: Output file, or "-" for stdout.
    path: str = "-"
    #: Rotate the file when the next line would take it past this size (bytes).
    max_bytes: int = 64 * 1024 * 1024
    #: Rotated files kept (path.1 ... path.N).
    backups: int = 5


@dataclass
class ExportSection:
    jsonl: JsonlSection = field(default_factory=JsonlSection)


@dataclass
class CollectorSection:
    enabled: bool = True
    #: Overrides [daemon].interval_s for this collector; 0 means "use the daemon's".
    interval_s: float = 0.0


def _default_collectors() -> dict[str, CollectorSection]:
    return {name: CollectorSection() for name in KNOWN_COLLECTORS}


@dataclass
class Config:
    daemon: DaemonSection = field(default_factory=DaemonSection)
    grpc: GrpcSection = field(default_factory=GrpcSection)
    export: ExportSection = field(default_factory=ExportSection)
    collectors: dict[str, CollectorSection] = field(default_factory=_default_collectors)
    #: Where the values came from, for error messages and `status`.
    source: str = field(default="<defaults>", compare=False)

    def collector_interval(self, name: str) -> float:
        section = self.collectors.get(name)
        if section is not None and section.interval_s > 0:
            return section.interval_s
        return self.daemon.interval_s

    def collector_enabled(self, name: str) -> bool:
        section = self.collectors.get(name)
        return section is None or section.enabled


_LOG_LEVELS = ("debug", "info", "warning", "error")


def load(path: Path | None, overrides: list[tuple[str, str]] = ()) -> Config:  # type: ignore[assignment]
    """Read ``path`` (None: defaults only), apply ``overrides`` ("section.key", "value").

    Raises:
        ConfigError: unreadable file, TOML syntax error, unknown key, wrong type, bad value.
    """
    cfg = Config()
    if path is not None:
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(
                f"cannot read the config file ({e.strerror}); fix the path or its permissions, "
                "or leave out --config to use the defaults",
                source,
            ) from e
        except UnicodeDecodeError as e:
            raise ConfigError("the config file is not UTF-8 text", source) from e
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            m = re.search(r"\(at line (\d+), column \d+\)", str(e))
            line = int(m.group(1)) if m else None
            msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
            raise ConfigError(f"TOML syntax error: {msg}", source, line) from e
        _apply(cfg, data, (), _Locator(source, text))
        cfg.source = source
    for dotted, raw in overrides:
        _apply_override(cfg, dotted, raw)
    _validate(cfg)
    return cfg


class _Locator:
    """Finds the line of ``section.key`` in the TOML text, for error messages."""

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.lines = text.splitlines()

    def line_of(self, path: tuple[str, ...]) -> int | None:
        if not path:
            return None
        table: tuple[str, ...] = ()
        key = path[-1]
        parent = path[:-1]
        header = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
        for i, line in enumerate(self.lines, start=1):
            m = header.match(line)
            if m:
                table = tuple(p.strip().strip('"') for p in m.group(1).split("."))
                if table == path:
                    return i
                continue
            m = re.match(r"^\s*([A-Za-z0-9_\-.\"]+)\s*=", line)
            if m:
                full = table + tuple(p.strip().strip('"') for p in m.group(1).split("."))
                if full == path or (full[-1] == key and table == parent):
                    return i
        return None

    def error(self, message: str, path: tuple[str, ...]) -> ConfigError:
        return ConfigError(message, self.source, self.line_of(path))


def _apply(obj: Any, data: dict[str, Any], path: tuple[str, ...], loc: _Locator) -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj) if f.name != "source"}
    for key, value in data.items():
        kpath = (*path, key)
        dotted = ".".join(kpath)
        if key not in names:
            known = ", ".join(sorted(names))
            raise loc.error(f"unknown key '{dotted}'; known keys here: {known}", kpath)
        target_type = hints[key]
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise loc.error(f"'{dotted}' must be a table ([{dotted}])", kpath)
            _apply(current, value, kpath, loc)
        elif isinstance(current, dict):
            if not isinstance(value, dict):
                raise loc.error(f"'{dotted}' must be a table ([{dotted}.<name>])", kpath)
            for sub, subval in value.items():
                spath = (*kpath, sub)
                if sub not in current:
                    known = ", ".join(sorted(current))
                    raise loc.error(f"unknown key '{dotted}.{sub}'; known: {known}", spath)
                if not isinstance(subval, dict):
                    raise loc.error(f"'{dotted}.{sub}' must be a table", spath)
                _apply(current[sub], subval, spath, loc)
        else:
            setattr(obj, key, _coerce(value, target_type, dotted, kpath, loc))


def _coerce(value: Any, target: Any, dotted: str, kpath: tuple[str, ...], loc: _Locator) -> Any:
    origin = typing.get_origin(target)
    if origin is list:
        (item_type,) = typing.get_args(target)
        if not isinstance(value, list):
            raise loc.error(f"'{dotted}' must be a list, got {type(value).__name__}", kpath)
        return [_coerce(v, item_type, dotted, kpath, loc) for v in value]
    if origin in (typing.Union, types.UnionType):
        raise TypeError("unions are not supported in config sections")
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is bool and not isinstance(value, bool):
        raise loc.error(f"'{dotted}' must be true or false, got {value!r}", kpath)
    if target is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise loc.error(f"'{dotted}' must be an integer, got {value!r}", kpath)
    if not isinstance(value, target):
        raise loc.error(f"'{dotted}' must be a {target.__name__}, got {value!r}", kpath)
    return value


def _apply_override(cfg: Config, dotted: str, raw: str) -> None:
    """Apply one ``--set section.key=value`` (value parsed as a TOML value, else a string)."""
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    nested: dict[str, Any] = {}
    cursor = nested
    parts = dotted.split(".")
    for p in parts[:-1]:
        cursor = cursor.setdefault(p, {})
    cursor[parts[-1]] = value
    _apply(cfg, nested, (), _Locator("command line", ""))


def _validate(cfg: Config) -> None:
    def bad(msg: str, dotted: str) -> ConfigError:
        loc = _Locator(cfg.source, "")
        if cfg.source != "<defaults>":
            with contextlib.suppress(OSError):
                loc = _Locator(cfg.source, Path(cfg.source).read_text(encoding="utf-8"))
        return loc.error(f"'{dotted}' {msg}", tuple(dotted.split(".")))

    if cfg.daemon.interval_s < 0.05:
        raise bad("must be at least 0.05 seconds", "daemon.interval_s")
    if cfg.daemon.history_s < cfg.daemon.interval_s:
        raise bad("must be at least daemon.interval_s", "daemon.history_s")
    if cfg.daemon.max_series < 100:
        raise bad("must be at least 100", "daemon.max_series")
    if cfg.daemon.log_level not in _LOG_LEVELS:
        raise bad(f"must be one of {', '.join(_LOG_LEVELS)}", "daemon.log_level")
    if not cfg.grpc.socket.startswith("/"):
        raise bad("must be an absolute path", "grpc.socket")
    if not 0 <= cfg.grpc.socket_mode <= 0o777:
        raise bad("must be permission bits such as 0o660", "grpc.socket_mode")
    if cfg.grpc.tcp and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\s]+):\d{1,5}", cfg.grpc.tcp):
        raise bad("must be host:port (e.g. 127.0.0.1:50051 or [::1]:50051)", "grpc.tcp")
    if cfg.export.jsonl.max_bytes < 4096:
        raise bad("must be at least 4096 bytes", "export.jsonl.max_bytes")
    if cfg.export.jsonl.backups < 0:
        raise bad("must be 0 or more", "export.jsonl.backups")
    for name, section in cfg.collectors.items():
        if section.interval_s < 0 or 0 < section.interval_s < 0.05:
            raise bad(
                "must be 0 (daemon default) or at least 0.05", f"collectors.{name}.interval_s"
            )
