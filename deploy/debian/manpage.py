"""Write bpfdyno(1) from the command's own parser, so the manual lists every command as it is.

Usage: python manpage.py VERSION > bpfdyno.1 (with bpfdyno importable). Run by debian/rules
with the package's virtualenv; the manual points to the full docs in /usr/share/doc/bpfdyno.
"""

from __future__ import annotations

import argparse
import sys

from bpfdyno.cli.main import build_parser


def _roff(text: str) -> str:
    """Text safe in roff: backslashes and hyphens escaped, no line starting with a dot."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + ln if ln.startswith((".", "'")) else ln for ln in text.splitlines())


def _options(sub: argparse.ArgumentParser) -> list[str]:
    """A command's arguments and options, each with its value's name and its help."""
    out = []
    for action in sub._actions:  # argparse has no public accessor for a parser's arguments
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            value = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            name = ", ".join(f"\\fB{_roff(o)}\\fR" for o in action.option_strings)
            name += f"\\fI{_roff(str(value))}\\fR" if value else ""
        else:
            name = f"\\fI{_roff(str(action.metavar or action.dest).upper())}\\fR"
        out += [".RS", ".TP", name, _roff(action.help or ""), ".RE"]
    return out


def manpage(version: str) -> str:
    """The manual page, in roff."""
    parser = build_parser()
    commands = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )  # argparse has no public accessor for its sub-commands
    lines = [
        f'.TH BPFDYNO 1 "" "bpfdyno {version}" "bpfdyno"',
        ".SH NAME",
        "bpfdyno \\- " + _roff(parser.description or ""),
        ".SH SYNOPSIS",
        ".B bpfdyno",
        ".I COMMAND",
        "[\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        "One agent per machine runs as \\fBbpfdyno serve\\fR (the systemd unit "
        "\\fBbpfdyno.service\\fR); the other commands talk to it over its API socket, "
        "\\fI/run/bpfdyno/bpfdyno.sock\\fR. \\fBbpfdyno\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR "
        "lists a command's options.",
        ".SH COMMANDS",
    ]
    for choice in commands._choices_actions:
        lines += [".TP", f"\\fB{_roff(choice.dest)}\\fR", _roff(choice.help or "")]
        lines += _options(commands.choices[choice.dest])
    lines += [
        ".SH FILES",
        ".TP",
        "\\fI/etc/bpfdyno/bpfdyno.toml\\fR",
        "The configuration: every key at its default, with what it means.",
        ".SH SEE ALSO",
        "\\fI/usr/share/doc/bpfdyno/README.md\\fR, "
        "\\fI/usr/share/doc/bpfdyno/deployment.md\\fR and the other documents there.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(manpage(sys.argv[1]))
