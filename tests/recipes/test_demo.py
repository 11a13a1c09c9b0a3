"""The demo recipe's own logic: option checks at construction, and a note that quotes this run's figures."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from lcft.config import ConfigError
from lcft.recipes.demo import DemoConfig, demo_note, summary_lines


def _report(base: float, long: tuple[float, float, float], ctrl: tuple[float, float, float],
            spread: float = 0.0) -> dict:
    def ck(loss: float, first: float, last: float, ctx: int, k: int) -> dict:
        # Six windows of 100 tokens whose losses average to `loss` (spread apart by window for k > 0).
        wins = [{"tokens": 100, "loss": loss + k * spread * (i - 2.5)} for i in range(6)]
        return {"loss": loss, "first_tenth_loss": first, "last_tenth_loss": last, "max_context": ctx,
                "label": f"ck{k}", "windows": wins, "effective_context": 0}

    return {"checkpoints": [ck(base, base, base, 256, 0), ck(*long, 0, 1), ck(*ctrl, 256, 2)],
            "uniform": {"loss": math.log(4.0)}, "bootstrap": {"replicates": 500, "seed": 3, "level": 0.95}}


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


def test_summary_states_the_interval_of_the_change_against_the_control():
    import numpy as np

    rep = _report(1.25, (1.2, 1.3, 1.1), (1.25, 1.25, 1.25), spread=0.01)
    line = summary_lines(rep)[3]
    long, ctrl = (np.array([w["loss"] for w in rep["checkpoints"][k]["windows"]]) for k in (1, 2))
    draws = np.random.default_rng(3).integers(0, 6, size=(500, 6))  # the report's seed and replicates
    rel = np.array([long[d].mean() / ctrl[d].mean() - 1 for d in draws])  # equal tokens per window
    lo, hi = np.percentile(rel, [2.5, 97.5])
    assert f"paired bootstrap over 6 held-out windows): [{100 * lo:+.2f}%, {100 * hi:+.2f}%]" in line
    same = summary_lines(_report(1.25, (1.25, 1.25, 1.25), (1.25, 1.25, 1.25)))[3]
    assert "[+0.00%, +0.00%] (includes 0: no difference detectable)" in same


@pytest.mark.parametrize(("changes", "message"), [
    ({"length": 2048, "base_context": 768}, "length 2048 is not a multiple of base_context 768"),
    ({"length": 1024, "base_context": 2048}, "base_context 2048 is longer than the window (1024)"),
    ({"steps": 0}, "steps must be at least 1 (got 0)"),
    ({"control_context": 2052}, "control_context must be a multiple of 8 and at most the window 32768 (got 2052)"),
    ({"length": 1024, "base_context": 1024}, "control_context must be a multiple of 8 and at most the window 1024"),
    ({"control_steps": -1}, "control_steps must be 0 (no positive control) or positive (got -1)"),
    ({"eval_windows": -1}, "eval_windows must be 0 (all) or positive (got -1)"),  # not at the eval stage, as --max-windows
])
def test_bad_options_fail_when_the_config_is_made(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        DemoConfig(**changes)


def test_without_a_positive_control_its_window_is_not_checked():
    """control_steps 0 trains and evaluates no control: its window may then exceed the demo's."""
    assert DemoConfig(length=1024, base_context=1024, control_steps=0).control_context == 2048


def test_a_skipped_positive_control_names_the_flag_that_skipped_it(tmp_path):
    from lcft.recipes.demo import DemoPaths, control_stage

    assert control_stage(DemoConfig(control_steps=0), DemoPaths(tmp_path), tmp_path, False) == (
        None, "none (--control-steps 0)")


def test_a_probe_of_one_window_is_counted_in_the_singular():
    from lcft.recipes.summary import probe_line

    line = probe_line({"probe": {"windows": 1}, "checkpoints": [{"label": "long", "effective_context": None}]})
    assert line.startswith("effective context (copy probe, 1 window: farthest"), line


def test_recurrence_line_states_the_change_on_recurring_tokens_with_its_interval():
    import numpy as np

    from lcft.recipes.summary import recurrence_line

    rep = _report(1.25, (1.2, 1.3, 1.1), (1.25, 1.25, 1.25), spread=0.01)
    for k, ck in enumerate(rep["checkpoints"]):
        for i, w in enumerate(ck["windows"]):  # 30 of each window's 100 tokens recur, at a loss of its own
            w["recurring_tokens"], w["recurring_loss"] = 30, 0.5 + 0.1 * k + 0.01 * i * k
        ck["tokens"], ck["recurring"] = 600, {"tokens": 180}
    rep["recurrence"] = {"k": 20}
    long, ctrl = (np.array([w["recurring_loss"] for w in rep["checkpoints"][k]["windows"]]) for k in (1, 2))
    draws = np.random.default_rng(3).integers(0, 6, size=(500, 6))  # the report's seed and replicates
    lo, hi = np.percentile([long[d].mean() / ctrl[d].mean() - 1 for d in draws], [2.5, 97.5])
    line = recurrence_line(rep)
    assert f"30.0% of tokens): {100 * (long.mean() / ctrl.mean() - 1):+.2f}% [{100 * lo:+.2f}%, {100 * hi:+.2f}%]" in line
    rep["checkpoints"][1]["recurring"]["tokens"] = 0
    assert recurrence_line(rep).startswith("no 20-mer occurs twice")


@pytest.mark.slow  # the whole demo in miniature: ~15 s on 2 idle cores
def test_the_demo_reports_a_non_empty_recurrence_split(tmp_path):
    from lcft.genomics import open_windows
    from lcft.recipes.demo import run_demo

    out = run_demo(DemoConfig(out=str(tmp_path / "demo"), length=2048, base_context=512, steps=2, long_steps=1,
                              base_batch=2, eval_windows=3, probe_windows=0, bins=4, control_steps=1,
                              control_context=1024), log=lambda s: None)
    rep = out["report"]
    ws = open_windows(tmp_path / "demo" / "data", "eval")
    recurring = 0
    for i in range(3):  # counted tokens (A/C/G/T, not position 0) whose 20-mer is in the set of earlier ones
        s, seen = ws.sequence(i).upper(), set()
        for p in range(19, len(s)):
            kmer = s[p - 19:p + 1]
            recurring += kmer in seen and not set(kmer) - set("ACGT")
            seen.add(kmer)
    for ck in rep["checkpoints"]:
        assert ck["recurring"]["tokens"] == recurring > 0
        assert ck["nonrecurring"]["tokens"] == ck["tokens"] - recurring > 0
    assert sum(rep["recurrence"]["tokens"]) == recurring
    assert any(line.startswith("continued vs its control on recurring tokens") for line in out["summary"])
    # each stage says what it trained, one step in the singular
    assert out["stages"]["base"]["result"] == "trained: 2 steps x 2 x 512 tokens, dense"
    assert out["stages"]["long"]["result"] == "trained: 1 step x 1 x 2K tokens, sparse attention"
    assert out["stages"]["control"]["result"].endswith("trained: 1 step x 1 x 1K tokens, dense")
    # The positive control's training windows: the second half of each is its first half, base for base.
    copies = open_windows(tmp_path / "demo" / "copies", "train")
    for i in (0, len(copies) // 2, len(copies) - 1):
        s = copies.sequence(i)
        assert s[512:] == s[:512] and len(s) == 1024
    assert rep["checkpoints"][3]["label"] == "copy@1K (positive control)"
    assert "the copy probe did not run (--probe-windows 0)" in out["note"], out["note"]
    assert rep["checkpoints"][3]["max_context"] == 1024


def test_plant_copies_overwrites_the_second_half_of_every_whole_chunk():
    from lcft.recipes.copies import plant_copies

    seq = bytes(range(65, 91)) * 3  # 78 letters: 9 whole chunks of 8, a tail of 6
    out = plant_copies(seq, 8)
    want = b"".join(seq[c:c + 4] * 2 for c in range(0, 72, 8)) + seq[72:]
    assert out == want and len(out) == len(seq)
    with pytest.raises(ValueError):
        plant_copies(seq, 7)


def _with_control(effective: int) -> dict:
    rep = _report(1.25, (1.2, 1.3, 1.1), (1.25, 1.25, 1.25))
    ctl = {"label": "copy@2K (positive control)", "effective_context": effective, "loss": 1.5,
           "probe": {"distances": [256, 1024], "drop": [0.01, 3.5], "ci_low": [-0.02, 3.1], "ci_high": [0.03, 3.9]},
           "recurring": {"tokens": 5, "relative_change": -0.1, "ci_low": -0.2, "ci_high": -0.05}}
    rep["checkpoints"].append(ctl)
    rep["probe"] = {"windows": 9, "distances": [256, 1024]}
    return rep


def test_the_positive_control_line_and_note_state_its_figures():
    from lcft.recipes.summary import control_line

    line = control_line(_with_control(1024), 120)
    assert line.startswith("copy@2K (positive control), the base trained 120 more steps on chr2 windows")
    assert "effective context 1K against the base's none detected" in line
    assert "copy-probe loss drop 1K back: +3.500 nats/token [95% interval +3.100, +3.900]" in line
    assert "on recurring held-out tokens -10.00% [-20.00%, -5.00%] against the base" in line
    note = demo_note(_with_control(1024))
    assert "finds it reading back 1K tokens" in note and "does not show that hg38 context helps" in note
    assert "It shows that the probe and its interval detect a model that uses its context" in note
    missed = demo_note(_with_control(0))
    assert "did not detect it reading back" in missed and "this run does not show that the probe detects" in missed
    assert control_line(_report(1.25, (1.2, 1.3, 1.1), (1.25, 1.25, 1.25)), 120) is None


def test_the_control_line_without_probe_intervals_states_the_drop_alone():
    """One probe window: no interval (undefined), no effective context; the line keeps the drop."""
    from lcft.recipes.summary import control_line

    rep = _with_control(0)
    rep["checkpoints"][-1].update(effective_context=None)
    rep["checkpoints"][-1]["probe"].update(ci_low=[None, None], ci_high=[None, None])
    line = control_line(rep, 120)
    assert "copy-probe loss drop 1K back: +3.500 nats/token;" in line and "95% interval" not in line


def test_one_window_and_one_probe_window_give_no_interval_and_a_context_it_cannot_tell():
    """The summary, the probe line and the note say so rather than print nan or 'none detected'."""
    rep = _with_control(0)
    for ck in rep["checkpoints"]:
        ck["windows"] = ck.get("windows", [])[:1]
        ck["effective_context"] = None
    rep["probe"] = {"windows": 1, "distances": [256, 1024]}
    lines = summary_lines(rep)
    assert lines[3].endswith("over 1 held-out windows): (no interval: fewer than 2 windows)")
    assert "nan" not in " ".join(lines)
    assert "ck0 cannot tell (too few with tokens of 1 probe window)" in " ".join(lines)
    note = demo_note(rep)
    assert "too few copy-probe windows with tokens (1 probed) for its 2 distances tested together" in note
    assert "cannot tell whether it reads back (use more --probe-windows)" in note and "none detected" not in note


def test_a_run_without_the_probe_says_not_measured_where_one_that_cannot_tell_says_so():
    """A null effective context is two things: no probe ran (--probe-windows 0), or too few windows to tell."""
    from lcft.recipes.summary import control_line, probe_line

    rep = _with_control(0)
    for ck in rep["checkpoints"]:
        ck["effective_context"] = None
    rep["probe"] = {"windows": 5, "distances": [256, 1024]}
    line = control_line(rep, 120)
    assert ("effective context cannot tell (too few with tokens of 5 probe windows) against the base's cannot tell "
            "(too few with tokens of 5 probe windows)") in line
    assert "ck1 cannot tell (too few with tokens of 5 probe windows)" in probe_line(rep)
    rep["probe"] = None  # no probe: eval.json's probe and each checkpoint's are null
    for ck in rep["checkpoints"]:
        ck["probe"] = None
    line = control_line(rep, 120)
    assert "first: effective context not measured (no copy probe)" in line, line
    assert "cannot tell" not in line and "against the base's" not in line
    assert probe_line(rep) is None and "cannot tell" not in " ".join(summary_lines(rep))
    assert "the copy probe did not run (--probe-windows 0)" in demo_note(rep)


def test_the_default_probe_windows_are_the_fewest_that_pass_the_test_with_a_window_to_spare(tmp_path):
    """Holm's first step over the demo's distances needs p < 2.5% / distances; the most extreme of 2^n sign
    patterns is 2^-n, the next 2 * 2^-n: the default is the smallest n where that next one passes too."""
    from lcft.recipes.demo import DemoPaths, eval_config

    cfg = DemoConfig()
    ecfg = eval_config(cfg, DemoPaths(tmp_path), tmp_path / "base", tmp_path / "long", tmp_path / "ctl")
    step = 0.025 / len(ecfg.probe_distances)
    n = cfg.probe_windows
    assert len(ecfg.probe_distances) == 5 and ecfg.probe_windows == n
    assert 2 * 2.0 ** -n < step <= 2 * 2.0 ** -(n - 1), (n, step)


def test_the_copies_stage_plants_copies_for_its_own_window_length(tmp_path):
    """A demo rerun with another --control-context: the FASTA planted for the old length was reused, so its
    windows held no copy (the second half of a 2K window matched its first at chance, 0.28). Each length has
    its own FASTA now; the windows prepared before are refused with the advice that works in the demo."""
    import shutil
    from types import SimpleNamespace

    from lcft.errors import LcftError
    from lcft.genomics import open_windows
    from lcft.recipes.copies import copies_stage

    folder = tmp_path / "copies"
    copies_stage(SimpleNamespace(control_context=1024), folder)
    with pytest.raises(LcftError, match=r"copies already holds windows prepared with a different .*, by an "
                                        r"earlier demo; choose another --out, or delete .*copies \(and the runs"):
        copies_stage(SimpleNamespace(control_context=2048), folder)
    shutil.rmtree(folder)
    copies_stage(SimpleNamespace(control_context=2048), folder)
    ws = open_windows(folder, "train")
    assert ws.length == 2048 and len(ws) > 0
    for i in range(len(ws)):
        assert np.array_equal(ws[i][:1024], ws[i][1024:])  # the copy sits half a window back
