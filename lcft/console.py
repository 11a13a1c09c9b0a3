"""Terminal output that prints text as it is: every rich Console and progress-bar text column of lcft is made
here, with markup off. Names from handed files (FASTA records, chromosome names, tokenizer and checkpoint
names, paths) reach tables, titles and progress bars; read as markup, '[/]' in one is a MarkupError traceback
and '[bold]' restyles the output. lcft's own styling is given as styles (`styled`), never as markup."""

from __future__ import annotations

from rich.console import Console
from rich.progress import TextColumn
from rich.text import Text


def make_console(stderr: bool = False, width: int | None = None) -> Console:
    """A Console that never reads markup (tables, titles and prints of plain strings show them as written)."""
    return Console(stderr=stderr, width=width, markup=False)


def text_column(template: str, style: str = "") -> TextColumn:
    """A progress column of text (`{task.description}`...: a chromosome's or a checkpoint's name) without markup."""
    return TextColumn(template, style=style, markup=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """One line from plain and (text, style) parts: lcft's own emphasis around names it prints as written."""
    return Text.assemble(*parts)
