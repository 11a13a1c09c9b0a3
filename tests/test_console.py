"""Terminal output prints text as it is: lcft/console.py makes every Console and progress text column, markup
off, unprintable characters escaped; no other library module makes one or writes markup (checked over the sources), and names that read as
markup render as written (end to end through the CLI: tests/cli/test_prepare_cli.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rich.progress import Progress
from rich.table import Table

from lcft.console import make_console, styled, text_column

LIB = Path(__file__).resolve().parents[1] / "lcft"
MADE_HERE = ("Console", "TextColumn")
MARKUP = re.compile(r"\[/\]|\[/?(bold|dim|italic|underline|red|green|yellow|blue|magenta|cyan|white)\b[^\]]*\]")


def makers_and_markup(source: str) -> list[str]:
    """Calls of Console(...) or TextColumn(...), and string literals holding rich markup, in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in MADE_HERE:
                found.append(f"{name}() at line {node.lineno}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MARKUP.search(node.value):
            found.append(f"markup {MARKUP.search(node.value).group()!r} at line {node.lineno}")
    return found


def test_only_the_console_module_makes_consoles_or_writes_markup():
    found = {str(p.relative_to(LIB.parent)): got for p in sorted(LIB.rglob("*.py"))
             if p.name != "console.py" or p.parent != LIB if (got := makers_and_markup(p.read_text()))}
    assert not found, found


def test_the_check_can_fail():
    assert makers_and_markup('c = Console(stderr=True)\nt = rich.progress.TextColumn("x")\n') == [
        "Console() at line 1", "TextColumn() at line 2"]
    assert makers_and_markup('print(f"[green]ok:[/] {n}")\n')[0].startswith("markup '[green]'")
    assert makers_and_markup('x = "a [1, 2] list"\n') == []


def test_tables_titles_and_progress_text_show_markup_as_written():
    console = make_console(width=200)
    table = Table("chromosome name", title="g[bold]\x1b[1m")
    table.add_row("chr[/]\x1b[2J")
    with console.capture() as cap:
        console.print(table)
        console.print(styled(("ok:", "green"), " x[red]y\x07"))
        console.print("two\nlines\x1b]0;title\x07")
        with Progress(text_column("{task.description}", "bold"), console=console) as progress:
            progress.add_task("scanning z[/]\x1b[2J", total=1)
    text = cap.get()
    assert "g[bold]\\x1b[1m" in text and "chr[/]\\x1b[2J" in text and "ok: x[red]y\\x07" in text
    assert "two\nlines\\x1b]0;title\\x07" in text and "scanning z[/]\\x1b[2J" in text
    assert "\x1b" not in text and "\x07" not in text  # a terminal escape from a name is shown, never sent
