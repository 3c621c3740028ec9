"""Tables that fit an 80-column terminal: a rule under the header, one space between columns, no edges.

Text cells (ids, names, regions) fold when a column must narrow, so they are never cut with an
ellipsis; a column is never narrower than its longest word (up to WORD_MAX characters: "trainer" never
folds into "traine" / "r"), the width coming from the columns that fold anyway (ids). Numbers never
break; when the table is too wide their headers wrap instead."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

# a text cell's words of up to this many characters stay whole; longer ones (ids, paths) may fold
WORD_MAX = 16


def _words(cell: object) -> list[str]:
    return (cell.plain if isinstance(cell, Text) else str(cell)).split()


class NarrowTable(Table):
    def _calculate_column_widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        """rich's widths, then each text column widened to its longest short word, taken from the text
        columns with the most room over their own (never from numbers, which do not break)."""
        widths = super()._calculate_column_widths(console, options)
        need = []
        for col, w in zip(self.columns, widths):
            if col.no_wrap:
                need.append(w)
                continue
            words = [cell_len(x) for c in (col.header, *col._cells) for x in _words(c) if cell_len(x) <= WORD_MAX]
            need.append(max(words, default=1) + self._get_padding_width(col._index))
        for i in range(len(widths)):
            while widths[i] < need[i]:
                spare = [j for j in range(len(widths)) if j != i and widths[j] > need[j]]
                if not spare:
                    break
                j = max(spare, key=lambda k: widths[k] - need[k])
                give = min(need[i] - widths[i], widths[j] - need[j])
                widths[i] += give
                widths[j] -= give
        return widths

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # the title is a line of its own, wrapped at the console's width rather than the table's
        # (a narrow table would fold a long title, e.g. a trace's path, into a column of words)
        title, self.title = self.title, None
        try:
            if title:
                yield Text(str(title), overflow="fold")
            if self.__rich_measure__(console, options).maximum > options.max_width:
                # number columns as wide as their widest value (or the header's longest word), so that
                # rich folds the text columns and wraps these headers rather than cutting anything
                for col in self.columns:
                    if col.no_wrap:
                        words = str(col.header).split() or [""]
                        cells = [cell_len(str(c)) for c in col._cells]
                        col.max_width = max([*map(cell_len, words), *cells])
            yield from super().__rich_console__(console, options)
        finally:
            self.title = title


def narrow_table(title: str | None = None, **kw: Any) -> Table:
    return NarrowTable(
        title=title,
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=0,
        show_edge=False,
        **kw,
    )


def add_columns(table: Table, *headers: str, numbers: tuple[str, ...] = (), **kw: Any) -> None:
    """Headers in `numbers` are right-aligned numbers; the others are text that folds."""
    for h in headers:
        if h in numbers:
            table.add_column(Text(h, justify="right", no_wrap=False), justify="right", no_wrap=True, **kw)
        else:
            table.add_column(h, overflow="fold", **kw)
