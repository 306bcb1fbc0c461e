"""Render the example configuration from the config schema, so it lists every key.

Every key of every section, with its default and the ``#:`` comment written above its
field in `bpfdyno.core.config`, in the order of the dataclasses. The result loads to
exactly the defaults (a test checks it), so it is a safe starting point for
``/etc/bpfdyno/bpfdyno.toml``; a field without a comment is a programming error.

Usage: python -m bpfdyno.core.config_example [--check] [PATH]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bpfdyno.core import config

DEFAULT_PATH = Path("deploy/systemd/bpfdyno.toml")

HEADER = """\
# bpfdyno configuration: every key, set to its default, with what it means.
#
# Generated from the config schema by `python -m bpfdyno.core.config_example`; a test fails
# when this file and the code disagree. Install it as /etc/bpfdyno/bpfdyno.toml and change
# what you need (or delete the keys you keep at their defaults). Any key can also be set on
# the command line: bpfdyno serve --set section.key=value.
"""

#: Keys whose value reads best in octal.
_OCTAL = {"socket_mode"}


def field_comments() -> dict[tuple[str, str], list[str]]:
    """(dataclass name, field name) -> the lines of the ``#:`` comment above that field."""
    source = inspect.getsource(config)
    lines = source.splitlines()
    out: dict[tuple[str, str], list[str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                comment: list[str] = []
                i = item.lineno - 2
                while i >= 0 and lines[i].strip().startswith("#:"):
                    comment.insert(0, lines[i].strip()[2:].strip())
                    i -= 1
                out[(node.name, item.target.id)] = comment
    return out


def toml_value(key: str, value: Any) -> str:
    """One value in TOML syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and key in _OCTAL:
        return oct(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for everything the defaults hold
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(key, v) for v in value) + "]"
    raise TypeError(f"no TOML rendering for {key} = {value!r}")


def _defaults() -> config.Config:
    """The defaults, without what the environment of the generating process says."""
    saved = os.environ.pop("KINETO_IPC_SOCKET_DIR", None)
    try:
        return config.Config()
    finally:
        if saved is not None:
            os.environ["KINETO_IPC_SOCKET_DIR"] = saved


def _sections(obj: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every table that holds plain keys, depth first, in field order."""
    if any(not _is_table(getattr(obj, f.name)) for f in _fields(obj)):
        yield path, obj
    for f in _fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _sections(value, (*path, f.name))
        elif isinstance(value, dict):
            for name, sub in value.items():
                yield from _sections(sub, (*path, f.name, name))


def _fields(obj: Any) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(obj) if f.name != "source"]


def _is_table(value: Any) -> bool:
    return dataclasses.is_dataclass(value) or isinstance(value, dict)


def render() -> str:
    """The whole example file.

    Raises:
        ValueError: a field has no ``#:`` comment in `bpfdyno.core.config`.
    """
    comments = field_comments()
    out = [HEADER]
    for path, section in _sections(_defaults(), ()):
        out.append(f"\n[{'.'.join(path)}]")
        doc = inspect.getdoc(type(section))
        if doc and not doc.startswith(type(section).__name__ + "("):
            out += ["# " + line if line else "#" for line in doc.splitlines()]
        for f in _fields(section):
            value = getattr(section, f.name)
            if _is_table(value):
                continue
            comment = comments.get((type(section).__name__, f.name))
            if not comment:
                raise ValueError(
                    f"{type(section).__name__}.{f.name} has no '#:' comment in "
                    "bpfdyno/core/config.py; document the key there"
                )
            for line in comment:
                out += ["# " + w for w in textwrap.wrap(line, 96)] if line else ["#"]
            out.append(f"{f.name} = {toml_value(f.name, value)}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text() if args.path.exists() else ""
        if current != text:
            print(
                f"{args.path} is stale: run python -m bpfdyno.core.config_example {args.path}",
                file=sys.stderr,
            )
            return 1
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
