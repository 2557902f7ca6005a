"""Plain tables for the command-line tools: nccl-tests-style text, or Markdown.

Text tables look like nccl-tests' output: header lines start with ``#`` (a
line naming column groups, one of titles, one of units), rows are
right-aligned fields, so ``grep -v '^#'`` leaves only numbers. Markdown tables
are for pasting into documents.
"""

from __future__ import annotations

from dataclasses import dataclass

NOT_RUN = "n/a"


@dataclass(frozen=True)
class Column:
    """One column.

    Attributes:
        title: its name.
        unit: shown under the name in text tables, in brackets in Markdown.
        group: a heading over a run of columns ("in-place").
        width: the text field width.
    """

    title: str
    unit: str = ""
    group: str = ""
    width: int = 8


class Table:
    """Renders a header and rows for a fixed list of columns.

    Args:
        columns: the columns, left to right.
        markdown: Markdown instead of nccl-tests-style text.
    """

    def __init__(self, columns: list[Column], markdown: bool = False) -> None:
        self.columns = [
            Column(c.title, c.unit, c.group, max(c.width, len(c.title), len(c.unit) + (2 if c.unit else 0)))
            for c in columns
        ]
        self.markdown = markdown

    def header(self) -> list[str]:
        """The header lines."""
        if self.markdown:
            titles = []
            for c in self.columns:
                name = f"{c.group} {c.title}" if c.group else c.title
                titles.append(f"{name} ({c.unit})" if c.unit else name)
            return ["| " + " | ".join(titles) + " |", "|" + "|".join("---:" for _ in self.columns) + "|"]
        return [self._group_line(), self._text_line([c.title for c in self.columns], "#"),
                self._text_line([f"({c.unit})" if c.unit else "" for c in self.columns], "#")]

    def row(self, cells: list[str]) -> str:
        """One row; ``cells`` in column order."""
        if len(cells) != len(self.columns):
            raise ValueError(f"table: {len(cells)} cells for {len(self.columns)} columns")
        if self.markdown:
            return "| " + " | ".join(cells) + " |"
        return self._text_line(cells, " ")

    def _text_line(self, cells: list[str], lead: str) -> str:
        return lead + "".join(" " + cell.rjust(c.width) for cell, c in zip(cells, self.columns))

    def _group_line(self) -> str:
        line, index = "#", 0
        while index < len(self.columns):
            group = self.columns[index].group
            span = 0
            while index < len(self.columns) and self.columns[index].group == group:
                span += self.columns[index].width + 1
                index += 1
            line += group.center(span) if group else " " * span
        return line.rstrip()


def fmt_time_us(seconds: float | None) -> str:
    """Microseconds with about four significant digits."""
    if seconds is None:
        return NOT_RUN
    us = seconds * 1e6
    return f"{us:.2f}" if us < 100 else f"{us:.1f}" if us < 10000 else f"{us:.0f}"


def fmt_ratio(value: float | None) -> str:
    """A ratio with two or three significant digits."""
    if value is None:
        return NOT_RUN
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def fmt_bandwidth(value: float | None) -> str:
    """GB/s with two decimals."""
    return NOT_RUN if value is None else f"{value:.2f}"


def fmt_bytes(nbytes: int) -> str:
    """1024-based size with a unit: '4 B', '64 KiB', '1 MiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"
