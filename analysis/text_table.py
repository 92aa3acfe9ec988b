"""Plain-text tables as the CLI prints them: rich, no colour, so they also go to files and pipes.

``table(columns, rows)`` is a rich Table (a column named ``<name`` is left-aligned, the others
right-aligned: numbers); ``render_plain`` renders lines, tables or both to text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], show_header: bool = True):
    from rich.table import Table

    t = Table(show_header=show_header)
    for name in columns:
        left = name.startswith("<")
        t.add_column(name.removeprefix("<"), justify="left" if left else "right")
    for row in rows:
        t.add_row(*(str(c) for c in row))
    return t


def render_plain(*items: Any, width: int = 100) -> str:
    """Each item (a str printed as is, or a rich renderable) on its own lines."""
    from rich.console import Console

    console = Console(width=width, record=True, force_terminal=False, color_system=None, file=_Null())
    for item in items:
        if isinstance(item, str):
            console.print(item, markup=False, highlight=False, soft_wrap=True)
        else:
            console.print(item)
    return console.export_text()


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass
