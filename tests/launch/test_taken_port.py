"""A one-node `--nproc` launch whose workers' store port is taken by another program the moment before rank 0 would
bind it (another launch on the machine given the same free port): the launch still forms its group and gives the
one-process report, since the port its workers are given is already bound and held by its own agent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.launch import run
from tests.parallel.conftest import cp_data_dir, cp_init_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.distributed

# Put first on the workers' PYTHONPATH: as rank 0 starts, before it joins the group, another program binds and listens
# on MASTER_PORT (kept open while the worker lives), and says in LCFT_TEST_TAKEN whether it could: "taken", or
# "held" when the port was already bound.
TAKE_MASTER_PORT = """
import errno, os, socket
if os.environ.get("RANK") == "0" and os.environ.get("MASTER_PORT"):
    _other = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET)
    try:
        _other.bind(("", int(os.environ["MASTER_PORT"])))
        _other.listen()
        _outcome = "taken"
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        _outcome = "held"
    with open(os.environ["LCFT_TEST_TAKEN"], "w") as f:
        f.write(_outcome)
"""


def _cfg(data: Path, model: Path, out: Path, **changes: object) -> EvalConfig:
    return EvalConfig(data=str(data), checkpoints=(str(model),), max_windows=4, out=str(out), **changes)


def test_a_taken_store_port_does_not_fail_a_one_node_launch(tmp_path, monkeypatch, cp_data_dir, cp_init_dir):  # noqa: F811
    """`lcft eval --nproc 2` with MASTER_PORT bound by another program as rank 0 starts: the port was already held
    by the launch (so no other program can have it), and the report is the one-process one. Rank 0 bound the port
    itself, after torch had picked it free and let it go: its group failed to form ("address already in use")."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(TAKE_MASTER_PORT)
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), root, os.environ.get("PYTHONPATH", "")]))
    taken = tmp_path / "taken"
    monkeypatch.setenv("LCFT_TEST_TAKEN", str(taken))
    two = run("eval", _cfg(cp_data_dir, cp_init_dir, tmp_path / "two", nproc=2))
    assert taken.read_text() == "held"
    monkeypatch.delenv("PYTHONPATH")
    one = evaluate(_cfg(cp_data_dir, cp_init_dir, tmp_path / "one"))
    (a,), (b,) = one["checkpoints"], two["checkpoints"]
    assert b["tokens"] == a["tokens"] > 0
    assert [w["index"] for w in b["windows"]] == [w["index"] for w in a["windows"]] == [0, 1, 2, 3]
    assert [w["loss"] for w in b["windows"]] == pytest.approx([w["loss"] for w in a["windows"]], rel=1e-6)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
