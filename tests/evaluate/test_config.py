"""EvalConfig: the options of `lcft eval` that change nothing, or count more windows than there are, are named in
a warning."""

from __future__ import annotations

import pytest

from lcft.config import doc
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.probe import default_distances


def _cfg(**kw) -> EvalConfig:
    return EvalConfig(data="data", checkpoints=("a",), **kw)


@pytest.mark.parametrize(("given", "named"), [
    (dict(probe_segment=64), "--probe-segment 64 has"),
    (dict(probe_distances=("1K", 2048)), "--probe-distances 1024,2048 has"),
    (dict(probe_mutation=0.0, probe_windows=9), "--probe-mutation 0.0 and --probe-windows 9 have"),
])
def test_probe_options_without_the_probe_are_named(given, named):
    """The copy probe's options change nothing without --probe copy: said in one line naming them, as given."""
    assert _cfg(**given).idle_probe() == [
        f"warning: {named} no effect without --probe copy: no copy probe runs"]


def test_probe_options_with_the_probe_or_at_their_defaults_say_nothing():
    assert _cfg(probe="copy", probe_segment=64, probe_windows=9).idle_probe() == []
    assert _cfg().idle_probe() == [] and _cfg(probe_segment=256, probe_mutation=0.1).idle_probe() == []


@pytest.mark.parametrize(("given", "available", "said"), [
    (dict(max_windows=10), 4, ["--max-windows 10 is more than split 'eval' holds (4 windows): all of them"]),
    (dict(max_windows=2, split="test"), 1, ["--max-windows 2 is more than split 'test' holds (1 window): all"]),
    (dict(max_windows=4), 4, []),
    (dict(), 4, []),
    (dict(probe="copy", probe_windows=9, max_windows=3), 10, ["--probe-windows 9 is more than the windows evaluated "
                                                              "(3): the copy probe runs on all of them"]),
    (dict(probe="copy", probe_windows=9), 5, ["--probe-windows 9 is more than the windows evaluated (5)"]),
    (dict(probe="copy", probe_windows=5, max_windows=7), 5, ["--max-windows 7"]),
    (dict(probe="copy", probe_windows=6, max_windows=7), 5, ["--max-windows 7", "--probe-windows 6"]),
    (dict(probe="copy", probe_windows=3), 3, []),
    (dict(probe_windows=9), 5, []),  # no probe runs: idle_probe says so
])
def test_window_counts_above_what_is_there_are_named(given, available, said):
    """--max-windows above the split's windows, --probe-windows above the windows evaluated: the run reads fewer,
    and says so in one line each."""
    lines = _cfg(**given).capped(available)
    assert len(lines) == len(said) and all(ln.startswith("warning: ") and s in ln for ln, s in zip(lines, said, strict=True))


def test_the_help_of_probe_distances_names_the_default_grid_as_it_is():
    """The default grid's last distance is the window less the segment (a copy must fit after its source), which
    --help says: a user reading 'up to the window length' would look for D = the window in the table."""
    assert default_distances(4096, 512) == (512, 1024, 2048, 4096 - 512)
    text = " ".join(doc(EvalConfig, "probe_distances").split())
    assert "segment, 2 segment, 4 segment, ... below the window length minus the segment, then that length" in text
