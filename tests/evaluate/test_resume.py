"""A killed `lcft eval` resumes from the losses it kept in `<out>/.partial`: the report equals an uninterrupted
run's, only the missing windows are computed, and a damaged or foreign pass is computed again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import lcft.evaluate.losses as losses
from lcft.errors import RESUME, LcftError
from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.store import DIGEST_BYTES, INDEX_BYTES, PARTIAL, LossStore
from tests.cli.preloaded import Preloaded, preloaded  # noqa: F401  (a fixture, by name)
from tests.one_line import one_line

ROOT = Path(__file__).resolve().parents[2]

# The eval of argv[1] (a JSON EvalConfig; "cli": the command line `lcft eval ARGV[4:]`) sending itself signal argv[3]
# inside its forward pass of call argv[2]: SIGKILL ends it there; SIGSTOP stops it there, and a signal sent to it
# then (with SIGCONT) lands inside that batch, however fast the machine or the eval is.
KILLER = textwrap.dedent("""
    import json, os, runpy, signal, sys
    import lcft.evaluate.losses as L
    from lcft.evaluate import EvalConfig, evaluate
    stop, sig, seen, real = int(sys.argv[2]), int(sys.argv[3]), [0], L.token_losses
    def hook(*a, **kw):
        seen[0] += 1
        if seen[0] == stop:
            os.kill(os.getpid(), sig)
        return real(*a, **kw)
    L.token_losses = hook
    if sys.argv[1] != "cli":
        evaluate(EvalConfig(**json.loads(sys.argv[1])))
    else:
        sys.argv = ["lcft", "eval", *sys.argv[4:]]
        runpy.run_module("lcft", run_name="__main__")
""")


def _cfg(data_dir, out, *ckpts, **kw) -> dict:
    return dict(data=str(data_dir), checkpoints=[str(c) for c in ckpts], out=str(out), max_windows=6,
                bootstrap=50, **kw)


def _killed(cfg: dict, at_call: int, before: str = "", server: Preloaded | None = None) -> None:
    """KILLER run with SIGKILL (forked from `server`, its imports done once, or as a process of its own)."""
    argv = ["-c", before + KILLER, json.dumps(cfg), str(at_call), str(signal.SIGKILL.value)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = server.run(argv, env) if server else subprocess.run([sys.executable, *argv], env=env, capture_output=True,
                                                              text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]


@pytest.fixture(scope="module")
def model_link(tmp_path_factory, ckpt_a) -> Path:
    """A link to model a: the path of the shared killed and clean runs, which a test may point elsewhere."""
    link = tmp_path_factory.mktemp("resume") / "model"
    link.symlink_to(ckpt_a)
    return link


@pytest.fixture(scope="module")
def killed_a(data_dir, model_link, preloaded) -> dict:  # noqa: F811
    """The options of an eval of model a (through `model_link`) over 6 windows killed in its sixth forward pass
    (windows 0-4 kept in its output folder). Tests resume copies of that folder (`_copy_killed`), never it."""
    cfg = _cfg(data_dir, model_link.parent / "killed", model_link)
    _killed(cfg, 6, server=preloaded)
    return cfg


@pytest.fixture(scope="module")
def clean_a(data_dir, model_link) -> Path:
    """The output folder of the same eval uninterrupted."""
    out = model_link.parent / "clean"
    evaluate(EvalConfig(**_cfg(data_dir, out, model_link)))
    return out


def _copy_killed(killed: dict, out: Path) -> dict:
    """The killed run's output folder (its lock and kept losses) copied into `out`, merged with what is there;
    its options with that out."""
    shutil.copytree(killed["out"], out, symlinks=True, dirs_exist_ok=True)
    return {**killed, "out": str(out)}


def _counting(monkeypatch) -> list[int]:
    """Forward passes of the next evaluations, as window counts per call."""
    calls: list[int] = []
    real = losses.token_losses

    def count(model, ids, **kw):
        calls.append(ids.shape[0])
        return real(model, ids, **kw)

    monkeypatch.setattr(losses, "token_losses", count)
    return calls


def _figures(out: Path) -> dict:
    report = json.loads((out / "eval.json").read_text())
    report.pop("created")
    report["options"].pop("out")
    return report


def _same_report(a: Path, b: Path) -> None:
    assert _figures(a) == _figures(b)
    assert (a / "loss_by_position.csv").read_bytes() == (b / "loss_by_position.csv").read_bytes()


@pytest.mark.parametrize("batch_size", [1, 2])
def test_killed_eval_resumes_to_the_uninterrupted_report(data_dir, ckpt_a, ckpt_b, tmp_path, monkeypatch,
                                                         preloaded, batch_size):  # noqa: F811
    """Killed in a forward pass of the second checkpoint: the first checkpoint's windows and the second's first
    ones are read back, the rest computed; the report equals an uninterrupted run's, bit for bit."""
    cfg = _cfg(data_dir, tmp_path / "killed", ckpt_a, ckpt_b, batch_size=batch_size)
    k = 4 // batch_size  # the second checkpoint's batch the kill falls in
    _killed(cfg, 6 // batch_size + k, server=preloaded)
    assert len(list((tmp_path / "killed" / PARTIAL).glob("*.losses"))) == 2
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**cfg))
    assert sum(calls) == 6 - (k - 1) * batch_size  # the second checkpoint's batches from the killed one on
    assert not (tmp_path / "killed" / PARTIAL).exists()  # the report is written: nothing left to resume
    evaluate(EvalConfig(**{**cfg, "out": str(tmp_path / "clean")}))
    _same_report(tmp_path / "killed", tmp_path / "clean")


def test_killed_copy_probe_resumes(data_dir, ckpt_a, tmp_path, monkeypatch, preloaded):  # noqa: F811
    """Killed inside the copy probe: the windows and the planted windows already run are read back."""
    cfg = _cfg(data_dir, tmp_path / "killed", ckpt_a, probe="copy", probe_segment=256, probe_distances=[256, 1024],
               probe_windows=2)
    _killed(cfg, 6 + 5, server=preloaded)  # the probe's fifth of 2 windows x 2 distances x 3 variants
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**cfg))
    assert len(calls) == 12 - 4
    evaluate(EvalConfig(**{**cfg, "out": str(tmp_path / "clean")}))
    _same_report(tmp_path / "killed", tmp_path / "clean")


@pytest.mark.parametrize("damage", ["torn", "flipped", "swapped", "nan", "inf"])
def test_a_damaged_record_and_those_after_it_are_computed_again(killed_a, clean_a, tmp_path, monkeypatch, damage):
    """A record that does not check is computed again with those after it; so is one whose digest checks but
    whose loss is not finite (signed again with the unkeyed digest: had been read back, and the model blamed)."""
    cfg = _copy_killed(killed_a, tmp_path / "killed")  # windows 0-4 kept
    (path,) = (tmp_path / "killed" / PARTIAL).glob("*.losses")
    data = bytearray(path.read_bytes())
    record = len(data) // 5
    if damage == "torn":  # window 4's record cut short: a kill while it was written
        data = data[:-7]
    elif damage == "flipped":  # one bit of window 2's losses
        data[2 * record + 100] ^= 4
    elif damage == "swapped":  # windows 1 and 2 in each other's place
        data[record:3 * record] = data[2 * record:3 * record] + data[record:2 * record]
    else:  # window 2's last loss (a counted token's) made non-finite, its record signed again
        keep = next(k for k in range(record) if k * 4 + (k + 7) // 8 + INDEX_BYTES + DIGEST_BYTES == record)
        body = data[2 * record:3 * record - DIGEST_BYTES]
        body[keep * 4 - 4:keep * 4] = np.float32(damage).tobytes()
        data[2 * record:3 * record] = body + hashlib.blake2b(bytes(body), digest_size=DIGEST_BYTES).digest()
    path.write_bytes(bytes(data))
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**cfg))
    assert len(calls) == {"torn": 2, "flipped": 4, "swapped": 5, "nan": 4, "inf": 4}[damage]
    _same_report(tmp_path / "killed", clean_a)


@pytest.mark.parametrize("change", [{"precision": "bf16"}, {"max_context": ["1K"]}, {"batch_size": 2},
                                    {"checkpoint": "b"}])
def test_a_pass_of_other_options_or_weights_is_not_read(killed_a, model_link, ckpt_a, ckpt_b, tmp_path, monkeypatch,
                                                       change):
    """Kept losses of the same output folder under another option that changes a loss, or of other weights at
    the same path (the killed run's link, pointed at model b for this evaluation), are not taken: every window is
    computed."""
    cfg = _copy_killed(killed_a, tmp_path / "killed")
    assert _rerun(cfg, change, monkeypatch, model_link, (ckpt_a, ckpt_b)) == 6


def _rerun(cfg: dict, change: dict, monkeypatch, link: Path, models: tuple[Path, Path]) -> int:
    """The windows computed by evaluating `cfg` with `change`; its "checkpoint": other weights at the same path
    (`link`, pointed at models[1] meanwhile, then back at models[0])."""
    change = dict(change)
    other = change.pop("checkpoint", None)
    calls = _counting(monkeypatch)
    if other:
        _repoint(link, models[1])
    try:
        evaluate(EvalConfig(**{**cfg, **change}))
    finally:
        _repoint(link, models[0])
    return sum(calls)


def _repoint(link: Path, target: Path) -> None:
    """Point `link` at `target` in one step (a new link renamed over it)."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(target)
    new.replace(link)


def test_more_windows_than_kept_and_fewer(killed_a, tmp_path, monkeypatch):
    """The kept windows are a prefix: a resumed run with a larger --max-windows computes only the new ones; with
    a smaller one, none."""
    cfg = _copy_killed(killed_a, tmp_path / "killed")
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**{**cfg, "max_windows": 3}))
    assert calls == []
    _copy_killed(killed_a, tmp_path / "killed")  # the same kept windows again, into the folder holding that report
    evaluate(EvalConfig(**{**cfg, "max_windows": 8}))
    assert len(calls) == 3  # windows 5, 6, 7


def test_store_reads_back_what_was_added(tmp_path):
    """The record format alone: float32 losses and counted flags of the last `keep` tokens, bit for bit, and
    items added out of order are a bug."""
    store = LossStore(tmp_path, {"pass": "x"}, keep=13)
    assert store.resume_at(4, 1) == 0
    rng = np.random.default_rng(0)
    items = [(i, rng.standard_normal(20).astype(np.float32), rng.random(20) < 0.5) for i in range(3)]
    for item in items:
        store.add(*item)
    with pytest.raises(ValueError):
        store.add(5, items[0][1], items[0][2])
    again = LossStore(tmp_path, {"pass": "x"}, keep=13)
    assert again.resume_at(4, 2) == 2  # three whole, rounded down to whole batches of 2
    for (i, loss, counted), (j, got_loss, got_counted) in zip(items, again.items(2), strict=False):
        assert i == j and got_loss.tobytes() == loss[-13:].tobytes()
        assert np.array_equal(got_counted, counted[-13:])
    assert LossStore(tmp_path, {"pass": "y"}, keep=13).resume_at(4, 1) == 0  # another pass, another file


def test_a_record_cut_short_by_a_file_size_limit_is_an_error(tmp_path):
    """Under a file-size limit that ends inside the second record, the kernel writes part of it and says so only
    by the count: that add is one line (it had returned as if kept, the record torn), and the first record
    still reads back."""
    script = textwrap.dedent(f"""
        import resource
        import numpy as np
        from lcft.errors import LcftError
        from lcft.evaluate.store import LossStore
        store = LossStore({str(tmp_path)!r}, {{"pass": "x"}}, keep=64)
        store.resume_at(2, 1)
        store.add(0, np.zeros(64, np.float32), np.ones(64, bool))  # makes the file (and its .json) under no limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (store.record + 100, resource.RLIM_INFINITY))
        try:
            store.add(1, np.ones(64, np.float32), np.ones(64, bool))
        except LcftError as e:
            print("error:", e)
    """)
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert got.returncode == 0 and got.stdout.startswith("error: cannot keep losses in "), (got.stdout, got.stderr)
    assert "File too large" in got.stdout and "the file-size limit (ulimit -f) is " in got.stdout
    again = LossStore(tmp_path, {"pass": "x"}, keep=64)
    assert again.resume_at(2, 1) == 1 and (tmp_path / PARTIAL).is_dir()


@pytest.mark.parametrize("thing", ["folder", "fifo", "link"])
def test_what_is_not_a_record_file_is_refused_and_left(tmp_path, thing):
    """A folder under the pass's file name, a FIFO (which would block the read), a link (which the records would be
    appended through): the pass stops with one line naming it; the thing, and what a link points at, stay as they
    were (they used to be removed, a folder with what it held)."""
    store = LossStore(tmp_path, {"pass": "x"}, keep=4)
    store.path.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"keep")
    if thing == "folder":
        store.path.mkdir()
        (store.path / "f").write_text("x")
    elif thing == "fifo":
        os.mkfifo(store.path)
    else:
        store.path.symlink_to(elsewhere)
    one_line(lambda: store.resume_at(2, 1), str(store.path), "is not a file eval wrote")
    with pytest.raises(ValueError, match="added where"):  # not resumed: nothing may be appended
        store.add(0, np.zeros(8, np.float32), np.ones(8, bool))
    kind = {"folder": stat.S_ISDIR, "fifo": stat.S_ISFIFO, "link": stat.S_ISLNK}[thing]
    assert kind(store.path.lstat().st_mode) and elsewhere.read_bytes() == b"keep"
    assert thing != "folder" or (store.path / "f").read_text() == "x"
    assert thing != "link" or store.path.readlink() == elsewhere
    assert sorted(p.name for p in store.path.parent.iterdir()) == [store.path.name]


def test_an_eval_failing_before_its_first_window_leaves_nothing(data_dir, ckpt_a, tmp_path, monkeypatch):
    """The kept losses are made with the first window: an evaluation that fails before it leaves no folder."""
    def fail(*a, **kw):
        raise LcftError("the device ran out of memory")

    monkeypatch.setattr(losses, "token_losses", fail)
    with pytest.raises(LcftError, match="out of memory"):
        evaluate(EvalConfig(**_cfg(data_dir, tmp_path / "out", ckpt_a)))
    assert not (tmp_path / "out").exists()


def test_a_diverged_checkpoint_leaves_the_others_losses_for_a_rerun(data_dir, ckpt_a, tmp_path, monkeypatch):
    """The second checkpoint's loss is non-finite: the eval fails in one line, and a rerun without it reads the
    first checkpoint's windows back."""
    real = losses.token_losses

    def second_diverges(model, ids, **kw):
        loss, counted = real(model, ids, **kw)
        return (loss * float("nan"), counted) if kw.get("max_context") else (loss, counted)

    monkeypatch.setattr(losses, "token_losses", second_diverges)
    cfg = _cfg(data_dir, tmp_path / "out", ckpt_a, ckpt_a, max_context=[0, 1024])
    with pytest.raises(LcftError, match="non-finite loss in 6 window"):
        evaluate(EvalConfig(**cfg))
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**{**cfg, "checkpoints": cfg["checkpoints"][:1], "max_context": [0]}))
    assert calls == []


def test_a_full_disk_is_one_line_and_the_rerun_resumes(data_dir, model_link, clean_a, tmp_path, monkeypatch):
    """ENOSPC keeping the third window's losses, then writing the report: each a one-line error; each rerun
    computes only what was not kept, and the report equals a clean run's."""
    import errno

    import lcft.evaluate.report as report
    import lcft.evaluate.store as store

    def no_space(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    appends = []

    def third_append_fails(path, mode="r", *a, **kw):
        if mode == "ab":
            appends.append(path)
            if len(appends) == 3:
                no_space()
        return open(path, mode, *a, **kw)

    cfg = _cfg(data_dir, tmp_path / "out", model_link)
    monkeypatch.setattr(store, "open", third_append_fails, raising=False)  # the module's `open`, not the builtin
    with pytest.raises(LcftError, match=r"cannot keep losses in .*No space left on device.*; fix the cause and " + RESUME) as e:
        evaluate(EvalConfig(**cfg))
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    calls = _counting(monkeypatch)
    monkeypatch.setattr(report.json, "dump", no_space)
    with pytest.raises(LcftError, match="cannot write the report into .*No space left on device.*and " + RESUME):
        evaluate(EvalConfig(**cfg))
    assert len(calls) == 4  # windows 2-5
    monkeypatch.undo()
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**cfg))
    assert calls == []
    _same_report(tmp_path / "out", clean_a)
