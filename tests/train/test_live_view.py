"""The training progress view: every figure labelled, the line kept within the terminal's width, and an ETA from
the mean step time."""

from __future__ import annotations

import io
import re
import sys

import pytest

from lcft.console import make_console
from lcft.train.metrics import LiveView, figures_line

RECORD = {"loss": 2.60551, "bits_per_base": 3.7590, "lr": 6e-05, "grad_norm": 15.08, "tokens_per_s": 352.4,
          "peak_mem": int(0.60 * 2**30) + 1, "skipped": 0}
LABELLED = ["loss 2.6055 nats/token", "3.759 bits/base", "lr 6.00e-05", "grad norm 15.1", "352 tok/s",
            "peak 0.60 GiB", "skipped 0"]


def test_wide_terminal_shows_every_figure_labelled() -> None:
    assert figures_line(RECORD, 200) == " · ".join(LABELLED)


@pytest.mark.parametrize("width", [100, 80, 60, 40, 20, 5])
def test_line_fits_the_width(width: int) -> None:
    line = figures_line(RECORD, width)
    assert 0 < len(line) <= width
    assert line.startswith("loss 2.6"[:width - 1])


def test_80_columns_keeps_loss_speed_memory_and_grad_norm() -> None:
    assert figures_line(RECORD, 80) == "loss 2.6055 nats/token · grad norm 15.1 · 352 tok/s · peak 0.60 GiB"


def test_skipped_updates_stay_when_narrow() -> None:
    assert figures_line({**RECORD, "skipped": 3}, 80) == ("loss 2.6055 nats/token · grad norm 15.1 · 352 tok/s · "
                                                         "peak 0.60 GiB · skipped 3")
    assert figures_line({**RECORD, "skipped": 3}, 62) == "loss 2.6055 nats/token · 352 tok/s · peak 0.60 GiB · skipped 3"
    assert figures_line({**RECORD, "skipped": 3}, 40) == "loss 2.6055 nats/token · skipped 3"


def test_no_loss_yet_is_an_empty_line() -> None:
    assert figures_line({"loss": None}, 80) == ""


def test_live_view_on_an_80_column_terminal_does_not_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    out = io.StringIO()
    console = make_console(file=out, width=80)
    console._force_terminal = True
    view = LiveView(True, total=3, done=0, console=console)
    view.update(2, RECORD)
    view.close()
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in out.getvalue().replace("\r", "\n").split("\n")]
    figures = [line for line in lines if line.startswith("loss ")]
    assert figures and all(line.rstrip() == figures_line(RECORD, 80) for line in figures)
    assert all(line.startswith("loss ") for line in lines if "GiB" in line or "tok/s" in line)  # none wrapped


def _bar_after_one_slow_step(monkeypatch: pytest.MonkeyPatch, done: int) -> str:
    """The bar's text after one step of 154 s (the clock as the view reads it), of a run of `done` + 2 steps."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    now = [1000.0]
    out = io.StringIO()
    console = make_console(file=out, width=120)
    console._force_terminal = True
    view = LiveView(True, total=done + 2, done=done, console=console, clock=lambda: now[0])
    now[0] += 154
    view.update(done + 1, RECORD)
    view.close()  # (its last frame: a dumb terminal, TERM=dumb, shows no frame before)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue().replace("\r", "\n"))
    return [line for line in text.split("\n") if line.startswith("train")][-1]


@pytest.mark.parametrize("done", [0, 40])
def test_eta_appears_once_a_step_is_done(monkeypatch: pytest.MonkeyPatch, done: int) -> None:
    """One step of 154 s done, one left: 2:34 elapsed, 2:34 to go (a resumed run counts only its own steps).
    rich's estimate uses the updates of the last 30 s only, and showed -:--:-- for as long as steps took longer."""
    line = _bar_after_one_slow_step(monkeypatch, done)
    assert line.split()[-4:] == [f"{done + 1}/{done + 2}", "0:02:34", "ETA", "0:02:34"], line


def _lines(total: int, last: int, every_s: float, **kwargs: bool) -> list[str]:
    """The plain lines of a run of `total` steps stopped after `last`, a step every `every_s` s, stderr a file."""
    now = [0.0]
    stream = io.StringIO()
    view = LiveView(kwargs.get("enabled", True), total=total, done=0, stream=stream, clock=lambda: now[0])
    for step in range(1, last + 1):
        now[0] += every_s
        view.update(step, RECORD)
    view.close()
    return stream.getvalue().splitlines()


def test_a_log_gets_the_first_steps_then_a_line_a_minute_and_the_last() -> None:
    """Steps of 7 s: steps 1-5, then the first step 60 s or more after the last line written (14 at 98 s, 23 at
    161 s), and the last (30); each line with the figures, the time so far and the ETA at 7 s a step."""
    lines = _lines(30, 30, 7.0)
    assert [int(line.split()[2].split("/")[0]) for line in lines] == [1, 2, 3, 4, 5, 14, 23, 30], lines
    assert lines[5] == f"train step 14/30 · {' · '.join(LABELLED)} · elapsed 0:01:38 · ETA 0:01:52"
    assert lines[-1].endswith("elapsed 0:03:30 · ETA 0:00:00")


def test_a_stopped_run_ends_its_log_with_its_last_step() -> None:
    lines = _lines(30, 20, 7.0)
    assert [line.split()[2] for line in lines[-2:]] == ["14/30", "20/30"], lines


def test_no_lines_when_disabled_or_when_the_bar_is_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _lines(3, 3, 1.0, enabled=False) == []
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    stream = io.StringIO()
    monkeypatch.setattr(stream, "isatty", lambda: True, raising=False)
    view = LiveView(True, total=2, done=0, console=make_console(file=io.StringIO()), stream=stream)
    view.update(1, RECORD)
    view.close()
    assert stream.getvalue() == ""
