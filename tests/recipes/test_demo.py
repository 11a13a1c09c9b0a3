"""The demo recipe's own logic: option checks at construction, and a note that quotes this run's figures."""

from __future__ import annotations

import math
import re

import pytest

from lcft.config import ConfigError
from lcft.recipes.demo import DemoConfig, demo_note, summary_lines


def _report(base: float, long: tuple[float, float, float], ctrl: tuple[float, float, float]) -> dict:
    def ck(loss: float, first: float, last: float, ctx: int) -> dict:
        return {"loss": loss, "first_tenth_loss": first, "last_tenth_loss": last, "max_context": ctx}

    return {"checkpoints": [ck(base, base, base, 256), ck(*long, 0), ck(*ctrl, 256)],
            "uniform": {"loss": math.log(4.0)}}


def test_note_states_the_figures_of_the_report_it_is_given():
    rep = _report(1.37, (1.2, 1.3, 1.1), (1.25, 1.25, 1.25))
    note = demo_note(rep)
    # Expected figures computed here, from the definitions: relative change of the continued model's loss
    # against its control, in percent with a sign.
    assert f"1.200 nats per base, {100 * (1.2 / math.log(4.0) - 1):+.2f}% against a uniform guess (1.386)" in note
    assert f"{100 * (1.2 / 1.25 - 1):+.2f}% against its short-context control" in note  # -4.00%
    assert "(+4.00% in the first tenth of the window, -12.00% in the last)" in note
    assert "cannot show: a long-context gain" in note
    worse = demo_note(_report(2.7, (2.6, 2.6, 2.6), (2.6, 2.6, 2.6)))  # worse than a uniform guess
    assert "2.600 nats per base, +87.55% against a uniform guess" in worse
    assert "+0.00% against its short-context control" in worse
    assert "1.34" not in note + worse


def test_summary_lines_compare_continued_with_base_and_control():
    lines = summary_lines(_report(1.25, (1.2, 1.3, 1.1), (1.25, 1.25, 1.25)))
    assert "continued vs base: -4.00% overall (1.2000 vs 1.2500 nats; uniform guess 1.3863)" in lines[1]
    assert "cut to 256: -4.00% overall, +4.00% in the first tenth of the window, -12.00% in the last" in lines[2]


@pytest.mark.parametrize(("changes", "message"), [
    ({"length": 2048, "base_context": 768}, "length 2048 is not a multiple of base_context 768"),
    ({"length": 1024, "base_context": 2048}, "base_context 2048 is longer than the window (1024)"),
    ({"steps": 0}, "steps must be at least 1 (got 0)"),
])
def test_bad_options_fail_when_the_config_is_made(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        DemoConfig(**changes)
