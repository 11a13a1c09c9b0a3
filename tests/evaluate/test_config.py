"""EvalConfig: the options of `lcft eval` that change nothing are named in a warning."""

from __future__ import annotations

import pytest

from lcft.evaluate.config import EvalConfig


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
