"""Writing a benchmark's results into its section of a markdown file (docs/performance.md).

Each benchmark owns one or more results blocks, delimited by HTML comments
``<!-- NAME:begin -->`` / ``<!-- NAME:end -->``, inside a section it names by its heading. A
rerun replaces its block in place and leaves the prose around it alone.
"""

from __future__ import annotations

from pathlib import Path


def write_results(doc: Path, section: str, name: str, results: str) -> None:
    """Replace block ``name`` in ``doc`` with ``results``.

    A block not yet in the file goes after the section's last block (so blocks keep the order
    they were first written in); a section not yet in the file is appended with its heading.
    """
    start, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{start}\n{results}\n{end}"
    text = doc.read_text() if doc.exists() else "# Performance\n"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    elif section in text:
        tail = text[text.index(section) :]
        nxt = tail.find("\n## ", 1)
        at = text.index(section) + (nxt if nxt >= 0 else len(tail))
        text = text[:at].rstrip("\n") + "\n\n" + block + "\n" + text[at:]
    else:
        text = text.rstrip("\n") + f"\n\n{section}\n\n{block}\n"
    doc.write_text(text)
