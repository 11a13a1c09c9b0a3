"""`lcft plan`'s options (lcft.plan.config): what a plan asks of a layout it never launches."""

from __future__ import annotations

from typer.testing import CliRunner

from lcft.cli.app import app

runner = CliRunner()


def test_a_plan_of_several_nodes_needs_no_rendezvous() -> None:
    """A plan starts no node, yet one of 2 nodes was refused without --rdzv-endpoint ('give node 0's HOST:PORT'):
    it is the plan of the same layout with an endpoint given, and a malformed one given is still refused."""
    args = ["plan", "--preset", "1b", "--seq-len", "1M", "--gpus-per-node", "8", "--nnodes", "2", "--cp", "8",
            "--checkpointing", "block"]
    bare, given = runner.invoke(app, args), runner.invoke(app, [*args, "--rdzv-endpoint", "h:1"])
    assert bare.exit_code == 0 and bare.output == given.output, bare.output
    assert "16 cuda rank(s) = dp 2 x cp 8" in bare.output
    bad = runner.invoke(app, [*args, "--rdzv-endpoint", "h"])
    assert bad.exit_code == 1 and "--rdzv-endpoint must be HOST:PORT" in " ".join(bad.output.split()), bad.output


def _option_help(command: str, flag: str) -> str:
    """The help text `lcft COMMAND --help` shows for `flag`, joined across its wrapped lines."""
    text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400"}).output
    line = next(ln for ln in text.splitlines() if ln.lstrip("│ ").startswith(f"{flag} "))
    return " ".join(line.split())


def test_plans_help_says_a_plan_needs_no_rendezvous() -> None:
    """`lcft plan --help` showed train's "needed with --nnodes > 1" for --rdzv-endpoint, which a plan of several
    nodes does not need; train's help still says a run needs it."""
    plan = _option_help("plan", "--rdzv-endpoint")
    assert "needed with --nnodes > 1" not in plan and "not needed" in plan and "only checks its form" in plan, plan
    assert "needed with --nnodes > 1" in _option_help("train", "--rdzv-endpoint")
