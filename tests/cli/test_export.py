"""`lcft export`'s own output: the line naming what it wrote keeps its paths whole at any width."""

from __future__ import annotations

from typer.testing import CliRunner

from lcft.cli.app import app
from tests.evaluate.conftest import save_model


def test_the_wrote_line_keeps_long_paths_whole(tmp_path):
    """Into a log (no terminal: 80 columns) a path was cut into lines wherever the width fell."""
    source = save_model(tmp_path / ("model-" + "m" * 60), seed=0)
    out = tmp_path / ("export-" + "x" * 60)
    r = CliRunner().invoke(app, ["export", str(source), "--out", str(out)])
    assert r.exit_code == 0 and f"wrote {out} (from {source})\n" in r.output, r.output
