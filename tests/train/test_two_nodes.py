"""Two nodes on one machine: two `lcft train --nnodes 2 --node-rank 0|1` launchers meeting at a c10d rendezvous
on 127.0.0.1, one process each, cp=2 across them. Killing node 1 ends node 0 within the collective timeout and
the diagnosis, with a message naming node 1; a rerun of both with --resume auto finishes the run with the losses
of one process. Under --max-restarts the group restarts by itself, its ranks agreeing that it was restarted
whichever way each node's agent counted it. A node without rank 0 exits with the run's code, from its own workers
(no shared run folder needed); the other node of one that gives up (its restarts spent) exits 75 in one line. A
node that never joins ends the one waiting in one line after the collective timeout, and a Ctrl-C ends it at once;
node 0 ending first leaves no C++ stack trace, and no torch log line, on the other node's screen."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from lcft.config_toml import save_resolved, to_dict
from lcft.launch.jobs import JOBS
from lcft.liveness import DIAGNOSE_S
from lcft.train import TrainConfig, latest_checkpoint, train
from lcft.train.config import resolve_folders
from tests.launch.test_taken_port import TAKE_MASTER_PORT
from tests.train.launching import (
    RUN,
    error_lines,
    free_port,
    kill_tree,
    losses,
    rank_process,
    start_train,
    start_worker,
    torch_logs,
    wait_for_step,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT = 60  # --collective-timeout of the two-node runs
RESUME = JOBS["train"].resume


def _nodes(data_dir, init_dir, run, port, *extra, steps: int = 6, own: Path | None = None):
    """Node 0 and node 1 of one run; `own`: node 1 sees that folder at the run folder's path (a mount namespace of
    its own, its launcher, agent and worker in it), sharing nothing written there with node 0."""
    apart = ("unshare", "--user", "--map-root-user", "--mount", "sh", "-c", 'mount --bind "$0" "$1" && shift && '
             'exec "$@"', str(own), str(run)) if own is not None else ()
    return [_node(data_dir, init_dir, run, port, node, *extra, steps=steps, wrap=apart if node == 1 else ())
            for node in (0, 1)]


def _node(data_dir, init_dir, run, port, node, *extra, steps: int = 6, wrap=(), env=None, options=RUN):
    return start_train(data_dir, init_dir, run, "--nproc", 1, "--nnodes", 2, "--node-rank", node, "--rdzv-endpoint",
                       f"127.0.0.1:{port}", "--cp", 2, "--steps", steps, "--save-every", 2, "--collective-timeout",
                       TIMEOUT, *extra, wrap=wrap, env=env, run=options)


def _rank0_node(nodes: list[subprocess.Popen], timeout: float = 240) -> int:
    """Which node's launcher runs the worker of rank 0 (the rendezvous places it), once it has started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node, p in enumerate(nodes):
            with contextlib.suppress(AssertionError):
                rank_process(p, 0)
                return node
            assert p.poll() is None, p.communicate()[1][-3000:]
        time.sleep(0.1)
    raise AssertionError(f"no worker of rank 0 after {timeout} s")


@pytest.mark.parametrize(("option", "value", "named"), [("--lr", "3e-4", "lr 0.0003 vs 0.001"),
                                                        ("--seq-len", "1024", "seq_len 1024 vs 512")])
def test_a_node_given_other_options_stops_both_nodes_in_the_same_line(tmp_path, data_dir, init_dir, option, value,
                                                                      named):
    """Node 1's command gives another --lr (or --seq-len) than node 0's: both nodes exit 1 with the same line naming
    node 1 and both values, before the run folder is made. Another --lr trained to the end, exit 0, each replica
    stepping at its own rate; another --seq-len died in a gloo collective ('Received data size doesn't match
    expected size', SIGABRT), exit 75 on both nodes, saying to start it again with --resume auto."""
    run, port = tmp_path / "two-nodes", free_port()
    changed = list(RUN)
    changed[changed.index(option) + 1] = value
    nodes = [_node(data_dir, init_dir, run, port, node, options=changed if node else RUN) for node in (0, 1)]
    ended = [p.communicate(timeout=TIMEOUT + 120) for p in nodes]
    assert [p.returncode for p in nodes] == [1, 1], ended[0][1][-3000:] + ended[1][1][-3000:]
    line = f"error: node 1 runs another run than node 0: {named} (give every node the same options)"
    for _, err in ended:
        assert [x for x in err.splitlines() if x.strip()] == [line], err[-3000:]
    assert not run.exists()


def test_two_nodes_lose_one_then_resume_to_the_one_process_losses(tmp_path, data_dir, init_dir, one_process_run):
    run = tmp_path / "two-nodes"
    node0, node1 = _nodes(data_dir, init_dir, run, free_port())
    wait_for_step(run, 3, [node0, node1])
    kill_tree(node1)
    t0 = time.monotonic()
    _, err = node0.communicate(timeout=TIMEOUT + 60)
    node1.communicate()
    assert node0.returncode == 75, err[-3000:]
    # Mostly at once (the dead node's connections close); at worst the collective timeout and the diagnosis (seen
    # once under a full test run: 61.1 s, the cause not isolated)
    took = time.monotonic() - t0
    assert took < TIMEOUT + DIAGNOSE_S, f"node 0 ended {took:.1f} s after node 1 was killed: {err[-3000:]}"
    errors = error_lines(err)
    assert len(errors) == 1 and "(node 1 lost)" in errors[0] and "stopped answering" in errors[0], err[-3000:]
    assert torch_logs(err) == [], err[-3000:]  # (torch's agent logged its worker's exit code, 75)
    saved = latest_checkpoint(run)
    assert saved is not None and saved.name in ("step-00000002", "step-00000004")

    node0, node1 = _nodes(data_dir, init_dir, run, free_port(), "--resume", "auto")
    (out0, err0), (out1, err1) = node0.communicate(timeout=300), node1.communicate(timeout=300)
    assert node0.returncode == 0 and node1.returncode == 0, err0[-2000:] + err1[-2000:]
    assert f"resumed from {saved}" in out0 + err0 + out1 + err1  # rank 0 may run on either node
    # Rank 0's node prints its summary, the other node how its own ranks ended with it.
    assert "done at step 6/6" in out0 and "done at step 6/6" in out1
    assert latest_checkpoint(run).name == "step-00000006"
    # cp=2 splits each sequence over the two nodes: the same losses as one process, up to rounding.
    torch.testing.assert_close(losses(run), losses(one_process_run), rtol=1e-5, atol=1e-5)


def test_two_nodes_under_max_restarts_restart_a_killed_worker_and_continue_exactly(tmp_path, data_dir, init_dir,
                                                                                  one_process_run):
    """--max-restarts 1 on both nodes: node 1's worker SIGKILLed once step 3 is logged; both agents restart their
    workers at a new rendezvous round, which resume from the latest checkpoint by themselves and end (exit 0) with
    the losses of one process."""
    run = tmp_path / "two-nodes"
    node0, node1 = _nodes(data_dir, init_dir, run, free_port(), "--max-restarts", 1)
    wait_for_step(run, 3, [node0, node1])
    workers = [p for p in psutil.Process(node1.pid).children(recursive=True) if "lcft.launch" in " ".join(p.cmdline())
               and p.environ().get("RANK") is not None]
    assert len(workers) == 1
    workers[0].kill()
    (out0, err0), (out1, err1) = node0.communicate(timeout=300), node1.communicate(timeout=300)
    assert node0.returncode == 0 and node1.returncode == 0, err0[-3000:] + err1[-3000:]
    assert "restarting:" in err0 + err1 and "resumed from" in out0 + err0 + out1 + err1
    assert latest_checkpoint(run).name == "step-00000006"
    torch.testing.assert_close(losses(run), losses(one_process_run), rtol=1e-5, atol=1e-5)


def test_a_taken_store_port_does_not_fail_a_two_node_launch(tmp_path, data_dir, init_dir):
    """Another program binds MASTER_PORT as rank 0 starts, on whichever node it runs: the port was already bound
    and held by an agent (the one the rendezvous ranked 0), so no other program can have it, and both nodes end
    (exit 0). Rank 0 bound the port itself, after an agent had picked it free and let go: its group failed
    to form ("address already in use")."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(TAKE_MASTER_PORT)
    root = str(Path(__file__).resolve().parents[2])
    taken = tmp_path / "taken"
    env = {"PYTHONPATH": os.pathsep.join([str(hook), root, os.environ.get("PYTHONPATH", "")]),
           "LCFT_TEST_TAKEN": str(taken)}
    nodes = [_node(data_dir, init_dir, tmp_path / "run", port, node, steps=2, env=env)
             for port in [free_port()] for node in (0, 1)]
    ended = [p.communicate(timeout=240) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], ended[0][1][-3000:] + ended[1][1][-3000:]
    assert taken.read_text() == "held"


def test_a_group_whose_nodes_counted_its_restart_apart_resumes_together(tmp_path, data_dir, init_dir, one_process_run):
    """The group's ranks as the agents start them after node 1's worker died: node 1's agent counted the restart
    (TORCHELASTIC_RESTART_COUNT 1), node 0's restarted its worker for the membership change, which torch does not
    count (0). Every rank resumes from the latest checkpoint and the run ends (exit 0) with the losses of one
    process; rank 0 had refused the folder as another run's, after a 60 s wait for the heartbeats."""
    base = dict(data=str(data_dir), init=str(init_dir), seq_len=512, steps=6, global_batch=2, warmup=2, lr=1e-3,
                precision="fp32", progress=False)
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), save_every=2, stop_after=2, **base))  # the first round: saved step 2, then died
    spec = save_resolved(tmp_path / "spec.toml", to_dict(resolve_folders(
        TrainConfig(out=str(run), save_every=2, nproc=2, cp=2, collective_timeout=TIMEOUT, **base))))
    port = free_port()
    ranks = [start_worker(spec, rank, 2, port, restarts=rank) for rank in (0, 1)]
    try:
        (_, err0), (_, err1) = ranks[0].communicate(timeout=240), ranks[1].communicate(timeout=240)
    finally:
        for p in ranks:
            p.kill()
    assert ranks[0].returncode == 0 and ranks[1].returncode == 0, err0[-3000:] + err1[-3000:]
    assert f"resumed from {run / 'checkpoints' / 'step-00000002'} (step 2, 2 process(es))" in err0, err0[-3000:]
    assert latest_checkpoint(run).name == "step-00000006"
    torch.testing.assert_close(losses(run), losses(one_process_run), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("restarts", [0, 1])
def test_sigterm_to_every_process_of_both_nodes_saves_and_both_exit_143(tmp_path, data_dir, init_dir, restarts):
    """SIGTERM to both launchers, their agents and workers (a scheduler's scancel of the job): the ranks save
    together and both nodes exit 143, each printing the step saved (the node without rank 0 as its own workers
    handed it back). The node without rank 0 said 'stopped by SIGTERM ... before the workers saved', and both
    printed the agents' tracebacks; under --max-restarts 1 it still said so, exit 143 for what was saved."""
    from lcft.checkpoint.state import read_state

    run = tmp_path / "two-nodes"
    nodes = _nodes(data_dir, init_dir, run, free_port(), "--max-restarts", restarts, steps=100000)
    wait_for_step(run, 3, nodes)
    everyone = [q for p in nodes for q in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]]
    assert len(everyone) == 6  # a launcher, its agent and its worker per node
    for p in everyone:
        p.terminate()
    ended = [p.communicate(timeout=300) for p in nodes]
    step = read_state(latest_checkpoint(run)).step
    assert step >= 3
    for p, (out, err) in zip(nodes, ended, strict=True):
        assert p.returncode == 143, err[-3000:]
        assert "Traceback" not in err and error_lines(err) == [] and torch_logs(err) == [], err[-3000:]
        assert f"stopped by SIGTERM at step {step}/100000" in out, out + err[-3000:]


def test_sigterm_to_the_node_without_rank_0_and_no_shared_folder_exits_143(tmp_path, data_dir, init_dir):
    """Node 1 sees a folder of its own at the run folder's path: no summary.json of rank 0's reaches it. SIGTERM
    to the launcher of the node without rank 0 only (a preempted node): the ranks stop together, saved, and that
    node exits 143 naming the step, from what its own workers handed back. It printed 'node N: done' and exited 0,
    a preempted node taken for a finished one."""
    from lcft.checkpoint.state import read_state

    if subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("no user and mount namespaces here (unshare --user --mount) to give node 1 a folder of its own")
    run, own = tmp_path / "two-nodes", tmp_path / "node-1-own"
    run.mkdir()
    own.mkdir()
    nodes = _nodes(data_dir, init_dir, run, free_port(), steps=100000, own=own)
    holder = _rank0_node(nodes)
    views = [run, own]  # each node's view of the run folder
    wait_for_step(views[holder], 3, nodes)
    other = 1 - holder
    nodes[other].send_signal(signal.SIGTERM)
    (out0, err0), (out1, err1) = (p.communicate(timeout=300) for p in nodes)
    outs, errs = [out0, out1], [err0, err1]
    assert not (views[other] / "summary.json").exists() and not (views[other] / "checkpoints").exists()
    step = read_state(latest_checkpoint(views[holder])).step
    assert step >= 3
    assert [p.returncode for p in nodes] == [143, 143], err0[-3000:] + err1[-3000:]
    assert error_lines(err0) == error_lines(err1) == [], err0[-3000:] + err1[-3000:]
    assert f"stopped by SIGTERM at step {step}/100000 loss" in outs[holder], outs[holder] + errs[holder][-3000:]
    assert outs[other].strip() == (f"node {other}: stopped by SIGTERM at step {step}/100000; rank 0 wrote the "
                                   "checkpoint and the summary"), outs[other] + errs[other][-3000:]


@pytest.mark.parametrize("gives_up", [1, 0])
def test_the_other_node_of_one_that_gives_up_exits_75_in_one_line(tmp_path, data_dir, init_dir, gives_up):
    """One node under --max-restarts 0, the other under 1; the first's worker is SIGKILLed: its agent gives up on
    the run and closes the rendezvous (node 0's also takes it down: it hosts it), and the other's agent, restarting
    its worker, finds nothing to rejoin. Both exit 75 (requeue, --resume auto), each in one line. The other node
    ended with torchrun's RendezvousClosedError (node 0 gave up: RendezvousConnectionError) traceback, exit 1, and
    said 'restarting: ...' for a restart that never came."""
    run, port = tmp_path / "two-nodes", free_port()
    nodes = [_node(data_dir, init_dir, run, port, node, "--max-restarts", int(node != gives_up), steps=100000)
             for node in (0, 1)]
    wait_for_step(run, 3, nodes)
    (victim,) = [p for p in psutil.Process(nodes[gives_up].pid).children(recursive=True)
                 if "lcft.launch" in " ".join(p.cmdline()) and p.environ().get("RANK") is not None]
    rank = victim.environ()["RANK"]
    victim.kill()
    ended = [p.communicate(timeout=TIMEOUT + 60) for p in nodes]
    errors = [error_lines(err) for _, err in ended]
    assert [p.returncode for p in nodes] == [75, 75], ended[0][1][-3000:] + ended[1][1][-3000:]
    assert errors[gives_up] == [f"error: rank {rank} on node {gives_up} (pid {victim.pid}) was killed by SIGKILL; "
                                f"{RESUME}"], ended[gives_up][1][-3000:]
    other = 1 - gives_up
    assert "restarting:" not in ended[other][1], ended[other][1][-3000:]  # its agent did not restart: it gave up
    assert "Traceback" not in ended[other][1] and errors[other] == [
        f"error: the run's rendezvous at 127.0.0.1:{port} is closed or gone: another node gave up on the run (its "
        f"--max-restarts spent), or node 0, which hosts it, ended; node {other}'s workers have no group to rejoin; "
        f"{RESUME}"], ended[other][1][-3000:]
    # torch's agents logged each worker's exit code (one SIGKILLed, one that named the lost rank itself: 75)
    assert torch_logs(ended[0][1]) == torch_logs(ended[1][1]) == [], ended[0][1][-3000:] + ended[1][1][-3000:]
    assert latest_checkpoint(run) is not None  # (--resume auto continues from it)


def test_a_rendezvous_port_held_by_another_program_is_a_user_error_not_a_lost_run(tmp_path, data_dir, init_dir):
    """Node 0 cannot host the rendezvous (its port is another program's): torchrun's agent raises the same
    RendezvousConnectionError as for a rendezvous lost mid-run, which exited 75, 'requeue', so a scheduler would
    retry a mistyped --rdzv-endpoint for ever. Before any worker started it is one line and exit 1."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        node0 = start_train(data_dir, init_dir, tmp_path / "run", "--nproc", 1, "--nnodes", 2, "--node-rank", 0,
                            "--rdzv-endpoint", f"127.0.0.1:{port}", "--steps", 2)
        _, err = node0.communicate(timeout=120)
    assert node0.returncode == 1, err[-3000:]
    errors = error_lines(err)
    assert len(errors) == 1 and f"cannot host or reach the run's rendezvous at 127.0.0.1:{port}" in errors[0], err[-3000:]


def test_a_node_that_never_joins_is_one_line_after_the_collective_timeout(tmp_path, data_dir, init_dir):
    """Node 0 started alone (node 1 never is, or with another --nnodes, --rdzv-endpoint or --out): it waits at the
    rendezvous for --collective-timeout (3 s), then one line, exit 1 (the nodes never met: a requeue would wait the
    same way). It waited torch's 600 s and ended with torchrun's RendezvousTimeoutError traceback, exit 1."""
    port = free_port()
    t0 = time.monotonic()
    node0 = start_train(data_dir, init_dir, tmp_path / "run", "--nproc", 1, "--nnodes", 2, "--node-rank", 0,
                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--steps", 2, "--collective-timeout", 3)
    try:
        _, err = node0.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_tree(node0)
        raise
    assert node0.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert error_lines(err) == [
        f"error: the run's rendezvous at 127.0.0.1:{port} did not gather its 2 nodes within 3 s (--collective-timeout; "
        "node 0 waited): start every node, with the same --nnodes, --rdzv-endpoint and --out (its rendezvous is "
        "named after it)"], err[-3000:]
    assert time.monotonic() - t0 < 60


def test_the_node_left_when_node_0_ends_prints_only_its_error_line(tmp_path, data_dir, init_dir):
    """Node 0, which hosts the rendezvous, SIGKILLed with its worker after step 3: node 1 exits 75 with one line
    naming what it lost, and nothing else on stderr. Its worker's heartbeat and its agent's store calls each
    printed torch's TCPStore warning with some twenty frames (c10::DistNetworkError ...), and its agent logged the
    worker's exit code ('failed (exitcode: 75) ...'), its keep-alive heartbeat and its rendezvous shutdown failing
    to connect ('... due to an error of type RendezvousConnectionError.')."""
    run = tmp_path / "two-nodes"
    node0, node1 = _nodes(data_dir, init_dir, run, free_port(), steps=100000)
    wait_for_step(run, 3, [node0, node1])
    kill_tree(node0)
    node0.communicate()
    _, err = node1.communicate(timeout=TIMEOUT + 60)
    assert node1.returncode == 75, err[-3000:]
    errors = error_lines(err)
    assert len(errors) == 1 and "node 0" in errors[0] and RESUME in errors[0], err[-3000:]
    assert [line for line in err.splitlines() if line.strip()] == errors, err[-3000:]


def test_ctrl_c_while_node_0_waits_for_the_other_stops_it_at_once(tmp_path, data_dir, init_dir):
    """Node 0 started alone, Ctrl-C (SIGINT to its launcher) once its agent waits at the rendezvous: exit 130 at
    once, one line, nothing left running. The signal was only noted: the agent waited out the collective timeout
    and the launch said the rendezvous did not gather its nodes, exit 1."""
    node0 = start_train(data_dir, init_dir, tmp_path / "run", "--nproc", 1, "--nnodes", 2, "--node-rank", 0,
                        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--steps", 2, "--collective-timeout", TIMEOUT)
    try:
        deadline = time.monotonic() + 120
        while not psutil.Process(node0.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2)  # (its agent at the rendezvous)
        agent = psutil.Process(node0.pid).children()
        t0 = time.monotonic()
        node0.send_signal(signal.SIGINT)
        _, err = node0.communicate(timeout=TIMEOUT + 60)
    except BaseException:
        kill_tree(node0)
        raise
    assert node0.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert error_lines(err) == [f"error: stopped by SIGINT before the nodes gathered (no worker had started); {RESUME}"]
    assert time.monotonic() - t0 < 10 and agent and not any(p.is_running() for p in agent)
