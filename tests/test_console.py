"""Terminal output prints text as it is: lcft/console.py makes every Console and progress text column, markup
off, unprintable characters escaped; no other library module makes one or writes markup (checked over the sources), and names that read as
markup render as written (end to end through the CLI: tests/cli/test_prepare_cli.py)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.progress import Progress
from rich.table import Table

from lcft.console import make_console, styled, text_column
from tests.evaluate.conftest import data_dir  # noqa: F401 (fixture)

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


def _lcft(args: list[str], shell_redirect: str = "", **env: str) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, its standard streams as `bash -c 'lcft ARGS REDIRECT'` leaves them."""
    cmd = ["bash", "-c", f'exec "$@" {shell_redirect}', "bash", sys.executable, "-m", "lcft", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(LIB.parent), **env})


def test_a_non_ascii_name_under_an_ascii_output_encoding_is_escaped(tmp_path):
    """PYTHONIOENCODING=ascii: a record name lcft cannot encode is written escaped, never an encoding traceback,
    and escaped before the table measures it, so its rows stay aligned."""
    fasta = tmp_path / "g.fa"
    fasta.write_text(">chr\u00c4\n" + "ACGT" * 16 + "\n>chrB\n" + "ACGT" * 16 + "\n", encoding="utf-8")
    r = _lcft(["prepare", "inspect", str(fasta)], PYTHONIOENCODING="ascii")
    assert r.returncode == 0 and "chr\\xc4" in r.stdout, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith(("|", "+"))]
    assert len(rows) > 3 and len({len(line) for line in rows}) == 1, r.stdout


def test_train_with_stdout_and_stdin_closed_runs(tmp_path, data_dir):  # noqa: F811
    """`lcft train ... <&- >&-` (a job started with its output closed) trains and saves, with no traceback; the
    closed descriptors are /dev/null, so no file lcft opens takes their numbers."""
    run = tmp_path / "run"
    r = _lcft(["train", "--data", str(data_dir), "--out", str(run), "--preset", "tiny", "--steps", "1",
               "--global-batch", "1", "--seq-len", "256", "--precision", "fp32"], "<&- >&-")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (run / "checkpoints" / "step-00000001" / "checksums.json").is_file()


def test_columns_zero_still_shows_errors_and_help():
    """COLUMNS=0 (a broken terminal setting, or a script's): rich gave every console a width of 0 and printed
    nothing, so a user error exited 1 with no message and --help was blank."""
    env = {**os.environ, "COLUMNS": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    err = subprocess.run([sys.executable, "-m", "lcft", "plan"], capture_output=True, text=True, env=env, timeout=120)
    assert err.returncode == 1 and err.stderr.startswith("error: give --seq-len"), err.stderr
    helped = subprocess.run([sys.executable, "-m", "lcft", "--help"], capture_output=True, text=True, env=env,
                            timeout=120)
    assert helped.returncode == 0 and "Usage:" in helped.stdout and "train" in helped.stdout, helped.stdout


def test_eval_bar_ends_with_the_time_taken(monkeypatch, capsys):
    """A finished checkpoint's bar ends with how long it took (each clock reading 5 s later), not 0:00:00 left."""
    import itertools

    from lcft.evaluate.runner import progress_bar

    ticks = itertools.count(0, 5)
    monkeypatch.setattr("rich.console.monotonic", lambda: float(next(ticks)))
    with progress_bar(True) as bar:
        task = bar.add_task("step-00000002", total=3)
        for _ in range(3):
            bar.advance(task)
        taken = bar.tasks[0].finished_time
    last = capsys.readouterr().err.splitlines()[-1]
    assert taken >= 5 and last.split()[-3:] == ["3/3", "windows", f"0:00:{int(taken):02d}"], last
