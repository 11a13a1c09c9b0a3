"""Terminal output that prints text as it is: every rich Console and progress-bar text column of lcft is made
here, with markup off and unprintable characters escaped. Names from handed files (FASTA records, chromosome
names, tokenizer and checkpoint names, paths) reach tables, titles and progress bars; read as markup, '[/]' in
one is a MarkupError traceback and '[bold]' restyles the output, and a terminal escape in one would drive the
terminal. lcft's own styling is given as styles (`styled`), never as markup."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import Task, TextColumn
from rich.text import Text

from lcft.errors import printable

LINES = "\n\t"  # what a printed text may hold besides printable characters


class PlainConsole(Console):
    """A Console that never reads markup and escapes unprintable characters of every string it renders
    (tables, titles, prints of plain strings show them as written)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text, LINES), **kwargs)


class PlainTextColumn(TextColumn):
    """A progress column of text (`{task.description}`...: a chromosome's or a checkpoint's name) without markup,
    unprintable characters escaped."""

    def render(self, task: Task) -> Text:
        text = super().render(task)
        return Text(printable(text.plain), style=text.style, justify=text.justify)


def make_console(stderr: bool = False, width: int | None = None) -> Console:
    return PlainConsole(stderr=stderr, width=width, markup=False)


def text_column(template: str, style: str = "") -> TextColumn:
    return PlainTextColumn(template, style=style, markup=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """One line from plain and (text, style) parts: lcft's own emphasis around names it prints as written."""
    return Text.assemble(*((printable(p[0], LINES), p[1]) if isinstance(p, tuple) else printable(p, LINES)
                           for p in parts))
