"""The plot where the home folder is read-only: matplotlib's config and cache go where they can be written."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.evaluate.test_report import _report
from tests.unprivileged import unprivileged

PLOT = ("import json, sys\nfrom lcft.evaluate.plot import plot\n"
        "open(sys.argv[2], 'wb').write(plot(json.load(open(sys.argv[1]))))\n")


@pytest.mark.parametrize("lcft_cache", [False, True])
def test_a_read_only_home_plots_without_matplotlib_warning(tmp_path, lcft_cache):
    """HOME read-only, no MPLCONFIGDIR nor XDG folders: the PNG is written and stderr is empty (matplotlib warned
    in two lines that it made a temporary folder); its folder is matplotlib/ in a usable lcft cache (kept), else a
    temporary one removed at exit."""
    _, report, _ = _report(tmp_path)
    (tmp_path / "eval.json").write_text(json.dumps(report))
    home, tmp, cache = tmp_path / "home", tmp_path / "tmp", tmp_path / "cache"
    for folder in (home, tmp):
        folder.mkdir()
    home.chmod(0o555)
    skip = ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "LCFT_CACHE", "MATPLOTLIBRC")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(Path(__file__).parents[2]))
    if lcft_cache:
        env["LCFT_CACHE"] = str(cache)
    try:
        r = unprivileged([sys.executable, "-c", PLOT, str(tmp_path / "eval.json"), str(tmp_path / "p.png")], env)
    finally:
        home.chmod(0o755)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(home) == [] and os.listdir(tmp) == []
    assert bool(list(cache.glob("matplotlib/fontlist-*.json"))) == lcft_cache  # the font list kept
