"""Tables that fit the terminal they are printed on without breaking a word inside a cell.

As `pip list` and `ruff` do: every cell stays on one line (`no_wrap`); columns the reader
can spare are dropped, least needed first, until the table fits; what still does not fit
is a long free-text column, cut with an ellipsis. A word is never split across lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

# Three cells between columns: the padding on each side and the (blank) divider.
GUTTER = 3


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    justify: str = "left"
    # 0: always kept; otherwise dropped when the table does not fit, highest first.
    drop: int = 0
    # Free text that may be cut with an ellipsis once nothing else can be dropped.
    shrink: bool = False


Cell = str | Text


def _len(value: Cell) -> int:
    return cell_len(value.plain if isinstance(value, Text) else value)


def fitted_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, *, title: str | None = None
) -> Table:
    """A table of `rows` no wider than `width`: droppable columns dropped highest first
    until it fits, then the shrinkable ones cut with an ellipsis. Every cell on one line."""
    natural = [max([cell_len(c.header), *(_len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    keep = list(range(len(columns)))

    def total(idx: list[int]) -> int:
        return sum(natural[i] for i in idx) + GUTTER * (len(idx) - 1)

    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop):
        if total(keep) <= width:
            break
        keep.remove(i)
    # Left over for the shrinkable columns, shared out in proportion to their natural width.
    fixed = sum(natural[i] for i in keep if not columns[i].shrink) + GUTTER * (len(keep) - 1)
    flexible = [i for i in keep if columns[i].shrink]
    room = max(width - fixed, 0)
    want = sum(natural[i] for i in flexible)
    widths = {i: natural[i] for i in keep}
    if flexible and want > room:
        for i in flexible:
            widths[i] = max(cell_len(columns[i].header), 6, room * natural[i] // max(want, 1))
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i in keep:
        c = columns[i]
        table.add_column(
            c.header,
            justify=c.justify,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="ellipsis",
            min_width=widths[i] if not c.shrink else min(widths[i], cell_len(c.header)),
            max_width=widths[i],
        )
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    return table
