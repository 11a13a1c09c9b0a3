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


def test_a_cpu_plan_is_checked_against_the_hosts_memory_not_a_gpus() -> None:
    """A CPU plan said its total was "of 80.00 GiB", --gpu-memory's default, and --host-memory was refused: it
    compares the node's ranks, all each holds, with --host-memory, says nothing is checked without it, and refuses
    --gpu-memory (one line)."""
    args = ["plan", "--preset", "tiny", "--seq-len", "16K", "--device", "cpu", "--precision", "fp32", "--nproc", "2"]
    bare = runner.invoke(app, args)
    assert bare.exit_code == 0 and "GiB   of" not in bare.output and "80.00" not in bare.output, bare.output
    total = float(next(ln for ln in bare.output.splitlines() if ln.strip().startswith("total")).split()[1])
    host = next(ln for ln in bare.output.splitlines() if ln.startswith("host, one node: 2 rank(s) x "))
    need = float(host.split("= ")[1].removesuffix(" GiB"))
    assert abs(need - 2 * total) <= 0.01, bare.output  # each rank's total, twice (both rounded to 0.01)
    assert "verdict: not checked" in bare.output and "--host-memory" in bare.output, bare.output
    ok = runner.invoke(app, [*args, "--host-memory", f"{need + 0.5:.2f}GiB"])
    assert ok.exit_code == 0 and f"= {need:.2f} GiB   of {need + 0.5:.2f} GiB\n" in ok.output, ok.output
    assert "verdict: fits (0." in ok.output and " GiB of host memory to spare)" in ok.output, ok.output
    short = runner.invoke(app, [*args, "--host-memory", f"{need - 0.5:.2f}GiB"])
    assert short.exit_code == 1 and "verdict: does not fit (host memory 0." in short.output, short.output
    gpu = runner.invoke(app, [*args, "--gpu-memory", "80GiB"])
    assert gpu.exit_code == 1 and "--gpu-memory is for CUDA plans" in gpu.output, gpu.output
    assert len(gpu.output.strip().splitlines()) == 1, gpu.output
