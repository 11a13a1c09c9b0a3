"""`run_demo`: the published experiment in miniature on the bundled human sample, on CPU, in minutes.

Stages (each skipped when already done, so a re-run resumes): prepare windows (train = the chr2 piece,
held out = the chr22 piece), write a fresh model of the demo's shape, train it at a short context (dense
attention), continue it at the full window with sparse attention, then evaluate the base at its own
context, the continued model at the full window, and the continued model cut to the base context (the
control). The demo proves the machinery; at this scale it cannot show the long-context finding.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcft.checkpoint.layout import MODEL_CONFIG
from lcft.config import ConfigError, Size, check_seed, format_size
from lcft.config_toml import save_resolved, to_dict
from lcft.disk import write_faults
from lcft.errors import LcftError, reason
from lcft.evaluate.report import JSON_NAME, PNG_NAME
from lcft.files import atomic_write, expect_folder, read_json
from lcft.genomics.shards import is_window_length
from lcft.recipes.summary import demo_note, summary_lines
from lcft.signals import Ended, Stopped
from lcft.units import counted

if TYPE_CHECKING:
    from lcft.model import LlamaConfig


@dataclass
class DemoConfig:
    """Options of `lcft demo`; the defaults fit in under 10 minutes on 2 CPU cores."""

    out: str = "demo-out"
    """Folder for everything the demo writes: data/, init/, runs/base, runs/long, report/, the positive control's
    chr2copies-N.fa, copies/ and runs/copy, demo.toml and demo.json."""
    length: Size = 32768
    """Window length in tokens: the long context of the continued model and of the evaluation."""
    base_context: Size = 1024
    """Context of the base model's training (and of the control: the continued model cut to it)."""
    steps: int = 64
    """Training steps of the base model at base_context."""
    long_steps: int = 12
    """Steps of the continued training at the full window with sparse attention."""
    base_batch: int = 8
    """Sequences of base_context tokens per base training step."""
    long_batch: int = 1
    """Windows per continued training step."""
    lr: float = 1e-3
    """Peak learning rate of the base training."""
    long_lr: float = 3e-4
    """Peak learning rate of the continued training."""
    preset: str = ""
    """Model preset (tiny, small, ...) instead of the shape below; empty = the shape below."""
    hidden_size: int = 128
    """Model width (ignored with --preset). The demo's own shape is smaller than the tiny preset so that
    every stage fits the time budget on 2 CPU cores."""
    num_hidden_layers: int = 2
    """Decoder blocks (ignored with --preset)."""
    num_attention_heads: int = 2
    """Attention heads (ignored with --preset)."""
    intermediate_size: int = 352
    """MLP width (ignored with --preset)."""
    eval_windows: int = 0
    """Evaluate only the first N held-out windows (0 = all of them)."""
    eval_batch: int = 1
    """Windows per forward pass in the evaluation."""
    bins: int = 16
    """Position bins of the report."""
    control_steps: int = 120
    """Steps of the positive control: the base trained on chr2 windows whose second half copies their first,
    evaluated cut to control_context; what the copy probe must detect (0 = no positive control)."""
    control_context: Size = 2048
    """Window of the positive control's training (copies control_context / 2 back) and its evaluation context."""
    probe_windows: int = 9
    """Held-out windows of the copy probe (how far back each model reads; 0 = no probe). Each costs two
    forward passes per distance (distances 256, 1K, 4K, ... up to the window: 5 at 32K). The effective context
    is a sign-flip test over these windows: with 5 distances a claim needs p < 2.5% / 5, which 8 windows reach
    only when every one drops (1/256); 9 leave a margin (2/512: the smallest drop may go the other way), and
    fewer than 8 cannot tell."""
    seed: int = 0
    """Seed of the model initialisation and of the data order."""

    def __post_init__(self) -> None:
        for name in ("length", "base_context", "steps", "long_steps", "base_batch", "long_batch", "bins"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.base_context > self.length:
            raise ConfigError(f"base_context {self.base_context} is longer than the window ({self.length})")
        if self.length % self.base_context:
            raise ConfigError(f"length {self.length} is not a multiple of base_context {self.base_context}")
        if self.control_steps < 0:
            raise ConfigError(f"control_steps must be 0 (no positive control) or positive (got {self.control_steps})")
        # the control's windows are prepared at control_context, after the base training: checked now (the demo's
        # own window length is prepare's to check, in the first stage)
        if self.control_steps and not (is_window_length(self.control_context) and self.control_context <= self.length):
            raise ConfigError(f"control_context must be a multiple of 8 and at most the window {self.length} "
                              f"(got {self.control_context})")
        if self.eval_windows < 0:
            raise ConfigError(f"eval_windows must be 0 (all) or positive (got {self.eval_windows})")
        if self.probe_windows < 0:
            raise ConfigError(f"probe_windows must be 0 (no probe) or positive (got {self.probe_windows})")
        check_seed(self)


def _model_config(cfg: DemoConfig) -> LlamaConfig:
    from lcft.model import LlamaConfig, preset

    if cfg.preset:
        return preset(cfg.preset)
    return LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                       num_key_value_heads=cfg.num_attention_heads, rope_theta=1e6)


def _write_init(cfg: DemoConfig, folder: Path) -> bool:
    """A freshly initialised model of the demo's shape, the starting point of the base run."""
    if (folder / MODEL_CONFIG).is_file():
        return False
    import torch

    from lcft.checkpoint.hf_folder import save_pretrained
    from lcft.model import Llama

    torch.manual_seed(cfg.seed)
    save_pretrained(Llama(_model_config(cfg)), folder)
    return True


def train_stage(tcfg: Any) -> tuple[Path, str]:
    """Run (or finish, or skip) one training run; returns its final checkpoint and what happened."""
    from lcft.checkpoint.state import checkpoint_step
    from lcft.config_toml import absolute_paths
    from lcft.train import latest_checkpoint, train
    from lcft.train.run_dir import changed_options

    run = Path(tcfg.out)
    if changed := changed_options(absolute_paths(tcfg), run):  # (with checkpoints or not: a demo never resumes it)
        raise LcftError(f"{run} holds a demo run made with other options ({'; '.join(changed[:3])}); "
                        "choose another --out, or delete that folder to start over")
    latest = latest_checkpoint(run)
    if latest is not None and checkpoint_step(latest) >= tcfg.steps:
        return latest.absolute(), "done before, skipped"  # as a run's own summary names it: the report's options match
    how = "resumed" if latest is not None else "trained"
    if latest is not None:
        tcfg = dataclasses.replace(tcfg, resume="auto")
    summary = train(tcfg)
    # The user asked the whole demo to stop, not just this stage: also when the signal came as the run finished
    # (its "stopped" then says done, its "signal" still names it).
    if summary["signal"] is not None:
        raise Stopped(f"stopped by {summary['signal']} at step {summary['step']} of {run} (checkpoint "
                      f"{summary['checkpoint']}); run the same `lcft demo` again to continue", summary["signal_number"])
    return Path(summary["checkpoint"]), how


def _eval_is_current(report_dir: Path, ecfg: Any, control_steps: int) -> tuple[dict | None, str]:
    """(the existing report, "") when it was made with the same options from the same weights and reads as the
    demo prints it (a re-run skips); else (None, why it is not kept), ("" when there is none)."""
    from lcft.checkpoint.layout import resolve_checkpoint
    from lcft.checkpoint.weights import weights_sha256
    from lcft.evaluate.report import read_back_problem
    from lcft.genomics.window_set import open_windows

    p = report_dir / JSON_NAME
    if not p.is_file():
        return None, ""
    try:  # damaged (cut, garbled, nested too deep, not an object): evaluated again
        report = read_json(p)
    except LcftError as e:
        return None, reason(e)
    if problem := read_back_problem(report, ecfg, ecfg.windows_of(len(open_windows(ecfg.data, ecfg.split)))):
        return None, problem
    hashes = [weights_sha256(resolve_checkpoint(c)) for c in ecfg.checkpoints]
    if hashes != [c.get("weights_sha256") for c in report["checkpoints"]]:
        return None, "made from other weights"
    return (report, "") if _prints(report, control_steps) else (None, "a figure the demo prints is missing or not a number")


def _prints(report: dict, control_steps: int) -> bool:
    """Whether the table, summary lines and note the demo prints can all be made from `report`, read back from a
    file (a figure deleted or of another type there; a report just evaluated is shown without this net, so a
    fault in that code still shows its traceback)."""
    import io

    from lcft.console import make_console
    from lcft.evaluate.terminal import print_table

    try:
        print_table(report, make_console(width=120, file=io.StringIO()))
        summary_lines(report, control_steps)
        demo_note(report)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        return False
    return True


@dataclass(frozen=True)
class DemoPaths:
    """Where each stage writes, under the demo's --out folder."""

    out: Path

    @property
    def data(self) -> Path:
        return self.out / "data"

    @property
    def init(self) -> Path:
        return self.out / "init"

    @property
    def runs(self) -> Path:
        return self.out / "runs"

    @property
    def copies(self) -> Path:
        return self.out / "copies"

    @property
    def report(self) -> Path:
        return self.out / "report"


def open_out(out: Path) -> None:
    """The demo's --out: a new folder, or one an earlier demo made (its demo.toml there, written first); a file,
    or a folder holding anything else, is refused (nothing of the user's is written over)."""
    expect_folder(out, "--out")
    if out.is_dir() and not (out / "demo.toml").is_file() and any(out.iterdir()):
        raise LcftError(f"--out {out} holds files but no demo.toml (not an earlier demo's folder); choose "
                        "another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LcftError(f"--out {out}: cannot create the folder ({reason(e)})") from None


def prepare_stage(cfg: DemoConfig, data: Path, progress: bool) -> str:
    """Windows of cfg.length tokens from the bundled sample: chr2 to train on, chr22 held out."""
    from lcft.evaluate.config import more_than_held
    from lcft.genomics import sample_fasta
    from lcft.recipes import prepare_demo_windows

    m = prepare_demo_windows(fasta=str(sample_fasta()), out=str(data), length=cfg.length, train=("chr2",),
                             eval=("chr22",), progress=progress)
    n = {s: v.get("windows", "?") for s, v in m["splits"].items()}
    if isinstance(held := n.get("eval"), int) and cfg.eval_windows > held:  # said before training, in the demo's flag
        print(more_than_held("--eval-windows", cfg.eval_windows, "eval", held), file=sys.stderr)
    return f"{n.get('train')} train windows (chr2), {n.get('eval')} held-out windows (chr22) of {format_size(cfg.length)}"


def init_stage(cfg: DemoConfig, folder: Path) -> str:
    return "written" if _write_init(cfg, folder) else "there before, kept"


def base_train_config(cfg: DemoConfig, paths: DemoPaths, progress: bool) -> Any:
    """The base run: dense attention at base_context, from the fresh model."""
    from lcft.train import TrainConfig

    return TrainConfig(**_train_common(cfg, paths, progress, cfg.steps), out=str(paths.runs / "base"),
                       init=str(paths.init), attention="dense", seq_len=cfg.base_context, steps=cfg.steps,
                       global_batch=cfg.base_batch, micro_batch=cfg.base_batch, lr=cfg.lr)


def long_train_config(cfg: DemoConfig, paths: DemoPaths, base_checkpoint: Path, progress: bool) -> Any:
    """The continued run: sparse attention at the full window, from the base run's final checkpoint."""
    from lcft.train import TrainConfig

    return TrainConfig(**_train_common(cfg, paths, progress, cfg.long_steps), out=str(paths.runs / "long"),
                       init=str(base_checkpoint), attention="sparse", seq_len=cfg.length, steps=cfg.long_steps,
                       global_batch=cfg.long_batch, micro_batch=cfg.long_batch, lr=cfg.long_lr)


def _train_common(cfg: DemoConfig, paths: DemoPaths, progress: bool, steps: int) -> dict[str, Any]:
    return dict(data=str(paths.data), seed=cfg.seed, save_every=0, keep_last=1, progress=progress,
                precision="fp32", warmup=max(1, steps // 10))


def eval_config(cfg: DemoConfig, paths: DemoPaths, base_checkpoint: Path, long_checkpoint: Path,
                control_checkpoint: Path | None = None) -> Any:
    """Base at its own context, the continued model at the full window, the continued model cut to the
    base context (the control), and the positive control cut to its own context."""
    from lcft.evaluate.config import EvalConfig

    short = format_size(cfg.base_context)
    segment = min(256, cfg.length // 4)
    top, distances = cfg.length - segment, [segment]
    while distances[-1] * 4 < top:  # a coarser grid than eval's default (x4, not x2): the probe is costly
        distances.append(distances[-1] * 4)
    extra = () if control_checkpoint is None else (
        (str(control_checkpoint), f"copy@{format_size(cfg.control_context)} (positive control)", cfg.control_context),)
    return EvalConfig(
        data=str(paths.data),
        checkpoints=(str(base_checkpoint), str(long_checkpoint), str(long_checkpoint), *(e[0] for e in extra)),
        labels=(f"base@{short}", f"long@{format_size(cfg.length)}", f"long@{short} (control)", *(e[1] for e in extra)),
        max_context=(cfg.base_context, 0, cfg.base_context, *(e[2] for e in extra)), bins=cfg.bins,
        max_windows=cfg.eval_windows,
        batch_size=cfg.eval_batch, device="cpu", out=str(paths.report),
        probe="copy" if cfg.probe_windows else "none", probe_segment=segment,
        probe_distances=(*distances, top), probe_mutation=0.0, probe_windows=cfg.probe_windows)


def eval_stage(ecfg: Any, report_dir: Path, progress: bool, control_steps: int) -> tuple[dict[str, Any], str]:
    """The report (made now, or the current one kept) and what happened."""
    from lcft.evaluate.runner import evaluate
    from lcft.genomics.window_set import open_windows

    if ecfg.max_windows > len(open_windows(ecfg.data, ecfg.split)):  # said by the prepare stage, as --eval-windows
        ecfg = dataclasses.replace(ecfg, max_windows=0)
    report, stale = _eval_is_current(report_dir, ecfg, control_steps)
    if report is not None:
        return report, "done before with the same options and weights, skipped"
    report = evaluate(ecfg, progress=progress, reuse=not stale)  # a report the demo does not keep is made again
    if report.get("stopped") == Ended.SIGNAL:  # the user asked the whole demo to stop, not just this stage
        raise Stopped(f"stopped by {report['signal']} in the evaluation (the losses computed so far are kept in "
                      f"{report['out']}); run the same `lcft demo` again to continue", report["signal_number"])
    probe = f", copy probe on {report['probe']['windows']}" if report.get("probe") else ""
    again = f"the report there is not kept ({stale}), evaluated again: " if stale else ""
    return report, f"{again}{report['data']['windows']} held-out windows x {len(report['checkpoints'])}{probe}"


def timed(number: int, title: str, fn: Callable[[], tuple[Any, str]], log: Callable[[str], None]
          ) -> tuple[Any, dict[str, Any]]:
    """Run one stage under its heading: (its result, {"seconds", "cpu_seconds", "result": what happened})."""
    log(f"{number}/6 {title}")
    t0, c0 = time.perf_counter(), time.process_time()
    value, how = fn()
    # CPU seconds (all threads) next to wall seconds: on a shared machine the wall time says little.
    timing = {"seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1),
              "result": how}
    log(f"    {how} in {timing['seconds']:.0f} s")
    return value, timing


def run_demo(cfg: DemoConfig, *, progress: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every stage (skipping finished ones) and return {"report": eval report, "stages": timings, ...}."""
    paths = DemoPaths(Path(cfg.out))
    open_out(paths.out)
    with write_faults(paths.out):  # a full disk or a file-size limit in a stage without its own message: one line
        return _run_stages(cfg, paths, progress, log)


def _run_stages(cfg: DemoConfig, paths: DemoPaths, progress: bool, log: Callable[[str], None]) -> dict[str, Any]:
    save_resolved(paths.out / "demo.toml", to_dict(cfg))
    t_all = time.perf_counter()
    stages: dict[str, dict[str, Any]] = {}
    length, short = format_size(cfg.length), format_size(cfg.base_context)

    _, stages["prepare"] = timed(1, f"prepare {length}-token windows from the bundled human sample",
                                 lambda: (None, prepare_stage(cfg, paths.data, progress)), log)
    _, stages["init"] = timed(2, "write a fresh model", lambda: (None, init_stage(cfg, paths.init)), log)
    base, stages["base"] = timed(3, f"train the base model at {short} tokens", lambda: _described(
        train_stage(base_train_config(cfg, paths, progress)),
        f"{counted(cfg.steps, 'step')} x {cfg.base_batch} x {short} tokens, dense"), log)
    long, stages["long"] = timed(4, f"continue it at {length} tokens with sparse attention", lambda: _described(
        train_stage(long_train_config(cfg, paths, base, progress)),
        f"{counted(cfg.long_steps, 'step')} x {cfg.long_batch} x {length} tokens, sparse attention"), log)
    control, stages["control"] = timed(5, "positive control: train the base on windows holding a copy",
                                       lambda: control_stage(cfg, paths, base, progress), log)
    report, stages["eval"] = timed(6, "evaluate on the held-out chr22 windows", lambda: eval_stage(
        eval_config(cfg, paths, base, long, control), paths.report, progress, cfg.control_steps), log)

    summary = {"total_seconds": round(time.perf_counter() - t_all, 1),
               "total_cpu_seconds": round(sum(v["cpu_seconds"] for v in stages.values()), 1),
               "stages": stages, "report_dir": str(paths.report),
               "plot": str(paths.report / PNG_NAME), "summary": summary_lines(report, cfg.control_steps),
               "note": demo_note(report)}
    atomic_write(paths.out / "demo.json", json.dumps(summary, indent=1) + "\n")
    return {**summary, "report": report}


def control_stage(cfg: DemoConfig, paths: DemoPaths, base: Path, progress: bool) -> tuple[Path | None, str]:
    """The positive control (skipped with control_steps 0): planted windows from chr2, then the base trained on
    them at control_context with dense attention."""
    from lcft.recipes.copies import control_train_config, copies_stage

    if not cfg.control_steps:
        return None, "none (--control-steps 0)"
    data = copies_stage(cfg, paths.copies)
    tcfg = control_train_config(cfg, _train_common(cfg, paths, progress, cfg.control_steps), paths.copies,
                                paths.runs / "copy", base)
    checkpoint, how = train_stage(tcfg)
    return checkpoint, (f"{data}; {how}: {counted(cfg.control_steps, 'step')} x {tcfg.global_batch} x "
                        f"{format_size(cfg.control_context)} tokens, dense")


def _described(result: tuple[Path, str], what: str) -> tuple[Path, str]:
    """(checkpoint, "trained: <what>") from a training stage's (checkpoint, how)."""
    checkpoint, how = result
    return checkpoint, f"{how}: {what}"
