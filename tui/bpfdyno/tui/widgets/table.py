"""`FastTable`: a read-only table that renders only the rows on screen.

Textual's DataTable rebuilds its rows on every update: replacing 500 rows once a second
costs about 170 ms of CPU here, most of the UI's budget. This widget keeps the items as given
and formats a row only when it is drawn (the 20-50 visible ones), so a refresh costs the
same with 50 or 5,000 processes. It has a fixed header with a sort marker, a cursor that
follows its item's key across updates, and mouse support (click a header to sort, click a
row to select it, double-click to open it).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip


@dataclass(frozen=True, slots=True)
class Column:
    """One column: a key (for sorting), a title and a width in cells.

    The ``flex`` column (at most one, usually the last) takes the width left over.
    """

    key: str
    title: str
    width: int
    align: Literal["left", "right"] = "right"
    flex: bool = False


def _fit(text: str, width: int, align: str) -> str:
    if len(text) > width:
        return text[: max(0, width - 1)] + "…" if width > 1 else text[:width]
    return text.rjust(width) if align == "right" else text.ljust(width)


class FastTable(ScrollView, can_focus=True):
    """A table of items formatted lazily by ``format_row``.

    Args:
        columns: the columns in display order.
        format_row: an item's cells, one string per column.
        row_key: a stable identity of an item (the cursor follows it across updates).
        row_style: optional Rich style of an item's row (e.g. dim kernel threads).
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "fast-table--header",
        "fast-table--header-sorted",
        "fast-table--cursor",
        "fast-table--empty",
    }
    DEFAULT_CSS = """
    FastTable { height: 1fr; scrollbar-size-vertical: 1; }
    FastTable > .fast-table--header { text-style: bold; background: $panel; }
    FastTable > .fast-table--header-sorted { text-style: bold reverse; }
    FastTable > .fast-table--cursor { background: $accent 40%; }
    FastTable:focus > .fast-table--cursor { background: $accent; color: $text; }
    FastTable > .fast-table--empty { color: $text-muted; text-style: italic; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    class Highlighted(Message):
        """The cursor moved to another item (by the user)."""

        def __init__(self, table: FastTable, key: Hashable | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

    class Selected(Message):
        """An item was opened (enter or double click)."""

        def __init__(self, table: FastTable, key: Hashable) -> None:
            super().__init__()
            self.table = table
            self.key = key

    class HeaderClicked(Message):
        """A column title was clicked."""

        def __init__(self, table: FastTable, column: str) -> None:
            super().__init__()
            self.table = table
            self.column = column

    def __init__(
        self,
        columns: Sequence[Column],
        format_row: Callable[[Any], Sequence[str]],
        row_key: Callable[[Any], Hashable],
        row_style: Callable[[Any], str] | None = None,
        *,
        empty_text: str = "nothing to show",
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.columns = tuple(columns)
        self._format_row = format_row
        self._row_key = row_key
        self._row_style = row_style
        self.items: Sequence[Any] = ()
        self._keys: list[Hashable] = []
        self.cursor = 0
        self._cursor_key: Hashable | None = None
        self.sort_column: str | None = None
        self.sort_descending = True
        self.empty_text = empty_text
        self._widths: tuple[int, ...] = ()
        self._layout_width = -1
        self._style_cache: dict[str, Style] = {}

    # -- data --------------------------------------------------------------------------

    def set_items(self, items: Sequence[Any]) -> None:
        """Show ``items`` (already sorted and filtered); the cursor stays on its item."""
        self.items = items
        self._keys = [self._row_key(it) for it in items]
        if self._cursor_key is not None:
            try:
                self.cursor = self._keys.index(self._cursor_key)
            except ValueError:
                self.cursor = min(self.cursor, max(0, len(items) - 1))
        else:
            self.cursor = 0
        self._cursor_key = self._keys[self.cursor] if self._keys else None
        self.virtual_size = Size(self._content_width(), len(items) + 1)
        self._scroll_cursor_visible()
        self.refresh()

    def set_columns(self, columns: Sequence[Column]) -> None:
        """Show other columns (e.g. fewer on a narrow terminal)."""
        self.columns = tuple(columns)
        self._layout_width = -1
        self.virtual_size = Size(self._content_width(), len(self.items) + 1)
        self.refresh()

    def set_sort(self, column: str | None, descending: bool) -> None:
        """Mark the sorted column in the header (sorting itself is the caller's job)."""
        self.sort_column, self.sort_descending = column, descending
        self.refresh()

    @property
    def cursor_key(self) -> Hashable | None:
        """The key of the item under the cursor, None if the table is empty."""
        return self._cursor_key

    @property
    def cursor_item(self) -> Any:
        """The item under the cursor, None if the table is empty."""
        return self.items[self.cursor] if self.items else None

    def move_cursor_to_key(self, key: Hashable) -> bool:
        """Put the cursor on the item with ``key``; False if it is not shown."""
        try:
            index = self._keys.index(key)
        except ValueError:
            return False
        self._move(index)
        return True

    # -- layout ------------------------------------------------------------------------

    def _layout(self) -> tuple[int, ...]:
        width = self.size.width
        if width != self._layout_width:
            fixed = sum(c.width for c in self.columns if not c.flex) + len(self.columns) - 1
            self._widths = tuple(
                max(c.width, width - fixed) if c.flex else c.width for c in self.columns
            )
            self._layout_width = width
        return self._widths

    def _content_width(self) -> int:
        # The narrowest the columns can be: a horizontal scrollbar only when even that does
        # not fit (the flex column takes whatever is left over).
        return sum(c.width for c in self.columns) + len(self.columns) - 1

    def on_resize(self, event: events.Resize) -> None:
        """Re-lay out the columns for the new width."""
        self.virtual_size = Size(self._content_width(), len(self.items) + 1)

    # -- rendering -----------------------------------------------------------------------

    def _style(self, component: str) -> Style:
        style = self._style_cache.get(component)
        if style is None:
            style = self._style_cache[component] = self.get_component_rich_style(component)
        return style

    def notify_style_update(self) -> None:
        """Forget cached component styles when the theme or CSS changes."""
        self._style_cache.clear()
        super().notify_style_update()

    def _header_strip(self) -> Strip:
        widths = self._layout()
        header = self._style("fast-table--header")
        sorted_style = header + self._style("fast-table--header-sorted")
        segments: list[Segment] = []
        for i, (col, w) in enumerate(zip(self.columns, widths, strict=True)):
            title = col.title
            if col.key == self.sort_column:
                title += "▼" if self.sort_descending else "▲"
            style = sorted_style if col.key == self.sort_column else header
            segments.append(Segment(_fit(title, w, col.align), style))
            if i < len(self.columns) - 1:
                segments.append(Segment(" ", header))
        return Strip(segments)

    def _row_text(self, item: Any) -> str:
        cells = self._format_row(item)
        widths = self._layout()
        return " ".join(
            _fit(text, w, col.align)
            for text, w, col in zip(cells, widths, self.columns, strict=True)
        )

    def render_line(self, y: int) -> Strip:
        """Line ``y`` of the view: the header, then the scrolled rows."""
        width = self.size.width
        scroll_x, scroll_y = self.scroll_offset
        base = self.rich_style
        if y == 0:
            strip = self._header_strip()
        else:
            index = y - 1 + scroll_y
            if not self.items:
                lines = textwrap.wrap(self.empty_text, max(10, width - 1)) or [""]
                text = lines[y - 1] if y - 1 < len(lines) else ""
                return Strip([Segment(text.ljust(width), self._style("fast-table--empty"))])
            if index >= len(self.items):
                return Strip.blank(width, base)
            item = self.items[index]
            style = base
            if self._row_style is not None:
                extra = self._row_style(item)
                if extra:
                    style = base + Style.parse(extra)
            if index == self.cursor:
                style = style + self._style("fast-table--cursor")
            strip = Strip([Segment(self._row_text(item), style)])
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    # -- cursor and keys -------------------------------------------------------------------

    def _move(self, index: int) -> None:
        if not self.items:
            return
        index = max(0, min(index, len(self.items) - 1))
        if index != self.cursor or self._cursor_key != self._keys[index]:
            self.cursor = index
            self._cursor_key = self._keys[index]
            self.post_message(self.Highlighted(self, self._cursor_key))
        self._scroll_cursor_visible()
        self.refresh()

    def _scroll_cursor_visible(self) -> None:
        rows_visible = max(1, self.size.height - 1)
        top = round(self.scroll_offset.y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, force=True)
        elif self.cursor >= top + rows_visible:
            self.scroll_to(y=self.cursor - rows_visible + 1, animate=False, force=True)

    def action_cursor(self, delta: int) -> None:
        """Move the cursor by ``delta`` rows."""
        self._move(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        """Move the cursor by a screenful."""
        self._move(self.cursor + direction * max(1, self.size.height - 2))

    def action_edge(self, end: int) -> None:
        """Move the cursor to the first (0) or last (1) row."""
        self._move(len(self.items) - 1 if end else 0)

    def action_select(self) -> None:
        """Open the item under the cursor."""
        if self._cursor_key is not None:
            self.post_message(self.Selected(self, self._cursor_key))

    def on_click(self, event: events.Click) -> None:
        """Header click sorts; row click moves the cursor; a double click opens."""
        if event.y == 0:
            x = event.x + round(self.scroll_offset.x)
            edge = 0
            for col, w in zip(self.columns, self._layout(), strict=True):
                edge += w + 1
                if x < edge:
                    self.post_message(self.HeaderClicked(self, col.key))
                    break
            return
        index = event.y - 1 + round(self.scroll_offset.y)
        if 0 <= index < len(self.items):
            self._move(index)
            if event.chain >= 2:
                self.action_select()
