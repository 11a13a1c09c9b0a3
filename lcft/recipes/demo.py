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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lcft.config import ConfigError, Size, format_size, save_resolved, to_dict


@dataclass
class DemoConfig:
    """Options of `lcft demo`; the defaults fit in under 10 minutes on 2 CPU cores."""

    out: str = "demo-out"
    """Folder for everything the demo writes (data/, init/, runs/base, runs/long, report/)."""
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
    probe_windows: int = 4
    """Held-out windows of the copy probe (how far back each model reads; 0 = no probe). Each costs two
    forward passes per distance (distances 256, 1K, 4K, ... up to the window)."""
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
        if self.probe_windows < 0:
            raise ConfigError(f"probe_windows must be 0 (no probe) or positive (got {self.probe_windows})")


def _model_config(cfg: DemoConfig):
    from lcft.model import LlamaConfig, preset

    if cfg.preset:
        return preset(cfg.preset)
    return LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                       num_key_value_heads=cfg.num_attention_heads, rope_theta=1e6)


def _write_init(cfg: DemoConfig, folder: Path) -> bool:
    """A freshly initialised model of the demo's shape, the starting point of the base run."""
    if (folder / "config.json").is_file():
        return False
    import torch

    from lcft.model import Llama, save_pretrained

    torch.manual_seed(cfg.seed)
    save_pretrained(Llama(_model_config(cfg)), folder)
    return True


def train_stage(tcfg: Any) -> tuple[Path, str]:
    """Run (or finish, or skip) one training run; returns its final checkpoint and what happened."""
    from lcft.errors import LcftError
    from lcft.train import latest_checkpoint, train
    from lcft.train.checkpoint import checkpoint_step
    from lcft.train.config import absolute_paths, diff, load_run_config

    run = Path(tcfg.out)
    if (run / "config.toml").is_file():
        changed = diff(load_run_config(run / "config.toml").run_defining(), absolute_paths(tcfg).run_defining())
        if changed:
            raise LcftError(f"{run} holds a demo run made with other options ({'; '.join(changed[:3])}); "
                            "choose another --out, or delete that folder to start over")
    latest = latest_checkpoint(run)
    if latest is not None and checkpoint_step(latest) >= tcfg.steps:
        return latest, "done before, skipped"
    how = "resumed" if latest is not None else "trained"
    if latest is not None:
        tcfg = dataclasses.replace(tcfg, resume="auto")
    summary = train(tcfg)
    return Path(summary["checkpoint"]), how


def _eval_is_current(report_dir: Path, ecfg: Any) -> dict | None:
    """The existing report when it was made with the same options from the same weights (a re-run skips)."""
    from lcft.evaluate.checkpoints import weights_sha256
    from lcft.runs import resolve_checkpoint

    p = report_dir / "eval.json"
    if not p.is_file():
        return None
    try:
        report = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if report.get("options") != to_dict(ecfg):
        return None
    hashes = [weights_sha256(resolve_checkpoint(c)) for c in ecfg.checkpoints]
    return report if hashes == [c["weights_sha256"] for c in report["checkpoints"]] else None


def _pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.2f}%"


def _per_window(ck: dict, subset: str) -> tuple[Any, Any]:
    """Per-window loss sums and token counts `(n,)` of one checkpoint: all tokens, the recurring ones, or the
    non-recurring ones (all minus recurring)."""
    import numpy as np

    def figures(tokens: str, loss: str) -> tuple[np.ndarray, np.ndarray]:
        tok = np.array([w.get(tokens, 0) for w in ck["windows"]], dtype=np.float64)  # (n,)
        nats = np.array([w.get(loss) or 0.0 for w in ck["windows"]], dtype=np.float64)  # null: no tokens
        return nats * tok, tok

    if subset == "all":
        return figures("tokens", "loss")
    rec = figures("recurring_tokens", "recurring_loss")
    if subset == "recurring":
        return rec
    total = figures("tokens", "loss")
    return total[0] - rec[0], total[1] - rec[1]


def control_interval(report: dict, subset: str = "all") -> tuple[float, float, float]:
    """The continued model's change against its control over `subset` (all, recurring, nonrecurring) with
    its 95% interval: the paired window bootstrap of the report (its replicates and seed) over the two
    checkpoints' per-window figures. Returns (change, low, high)."""
    from lcft.evaluate.stats import mean_difference, resample_counts

    _, long, ctrl = report["checkpoints"]
    boot = report["bootstrap"]
    weights = resample_counts(len(long["windows"]), boot["replicates"], boot["seed"])
    c = mean_difference(*_per_window(long, subset), *_per_window(ctrl, subset), weights, relative=True,
                        level=boot["level"])
    return float(c.value), float(c.low), float(c.high)


def _ci(low: float, high: float) -> str:
    return f"[{100 * low:+.2f}%, {100 * high:+.2f}%]{' (includes 0)' if low <= 0 <= high else ''}"


def recurrence_line(report: dict) -> str | None:
    """The continued model against its control on recurring tokens (their k-mer occurred earlier in the
    window: where a copy lies to read back) and on the others, each with its interval; None before the split."""
    rec = report.get("recurrence")
    if not rec:
        return None
    long = report["checkpoints"][1]
    if not long["recurring"]["tokens"]:
        return f"no {rec['k']}-mer occurs twice in these windows: no split into recurring and non-recurring tokens"
    share = long["recurring"]["tokens"] / long["tokens"]
    (r, rl, rh), (u, ul, uh) = (control_interval(report, s) for s in ("recurring", "nonrecurring"))
    return (f"continued vs its control on recurring tokens (the {rec['k']}-mer ending at the token occurred "
            f"earlier in its window; {share:.1%} of tokens): {100 * r:+.2f}% {_ci(rl, rh)}; on the others: "
            f"{100 * u:+.2f}% {_ci(ul, uh)}")


def probe_line(report: dict) -> str | None:
    """How far back each model reads (the copy probe's effective context), when the probe ran."""
    if not report.get("probe"):
        return None
    parts = [f"{ck['label']} {format_size(ck['effective_context']) if ck['effective_context'] else 'none detected'}"
             for ck in report["checkpoints"]]
    return (f"effective context (copy probe, {report['probe']['windows']} windows: farthest copy distance whose "
            f"loss drop is above zero by its 95% interval): {'; '.join(parts)}")


def summary_lines(report: dict) -> list[str]:
    """Plain statements of what the report measured: continued vs base, and continued vs its control overall
    (with its 95% interval) and in the first and last tenth of the window (the published finding is a gain
    growing toward the end), the same on recurring and non-recurring tokens, and the copy probe's effective
    context of each model."""
    base, long, ctrl = report["checkpoints"]
    _, low, high = control_interval(report)
    lines = [
        "(+ = higher held-out loss than the reference, i.e. worse; - = lower, better)",
        f"continued vs base: {_pct(long['loss'], base['loss'])} overall "
        f"({long['loss']:.4f} vs {base['loss']:.4f} nats; uniform guess {report['uniform']['loss']:.4f})",
        f"continued at the full window vs the same model cut to {format_size(ctrl['max_context'])}: "
        f"{_pct(long['loss'], ctrl['loss'])} overall, {_pct(long['first_tenth_loss'], ctrl['first_tenth_loss'])} "
        f"in the first tenth of the window, {_pct(long['last_tenth_loss'], ctrl['last_tenth_loss'])} in the last",
        f"95% interval of that overall change (paired bootstrap over {len(long['windows'])} held-out windows): "
        f"[{100 * low:+.2f}%, {100 * high:+.2f}%]{' (includes 0: no difference detectable)' if low <= 0 <= high else ''}",
    ]
    extra = [line for line in (recurrence_line(report), probe_line(report)) if line is not None]
    return [*lines, *extra]


def demo_note(report: dict) -> str:
    """What the demo shows and what it cannot, with this run's own figures from its report."""
    _, long, ctrl = report["checkpoints"]
    uniform = report["uniform"]["loss"]
    return (
        "What this demo shows: the whole pipeline runs (prepare -> train at a short context -> continue at a long "
        "context with sparse attention -> held-out loss by position). What it cannot show: a long-context gain. "
        f"A model this small trained for minutes learns little: this run's continued model scores "
        f"{long['loss']:.3f} nats per base, {_pct(long['loss'], uniform)} against a uniform guess "
        f"({uniform:.3f}), and {_pct(long['loss'], ctrl['loss'])} against its short-context control "
        f"({_pct(long['first_tenth_loss'], ctrl['first_tenth_loss'])} in the first tenth of the window, "
        f"{_pct(long['last_tenth_loss'], ctrl['last_tenth_loss'])} in the last). "
        "'continued vs base' mixes more training with longer context; only 'vs control' (the same weights cut to "
        "the base context) isolates the context, and at this scale expect no gain from it, least of all one "
        "growing toward the window end. The settings were chosen to fit the time budget, not tuned for a gain; "
        "the finding needs the full-scale run (see README)."
    )


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
    def report(self) -> Path:
        return self.out / "report"


def prepare_stage(cfg: DemoConfig, data: Path, progress: bool) -> str:
    """Windows of cfg.length tokens from the bundled sample: chr2 to train on, chr22 held out."""
    from lcft.genomics import prepare_windows, sample_fasta

    m = prepare_windows(fasta=str(sample_fasta()), out=str(data), length=cfg.length, train=("chr2",),
                        eval=("chr22",), progress=progress)
    n = {s: v.get("windows", "?") for s, v in m["splits"].items()}
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


def eval_config(cfg: DemoConfig, paths: DemoPaths, base_checkpoint: Path, long_checkpoint: Path) -> Any:
    """Base at its own context, the continued model at the full window, and the continued model cut to the
    base context (the control)."""
    from lcft.evaluate.config import EvalConfig

    short = format_size(cfg.base_context)
    segment = min(256, cfg.length // 4)
    top, distances = cfg.length - segment, [segment]
    while distances[-1] * 4 < top:  # a coarser grid than eval's default (x4, not x2): the probe is costly
        distances.append(distances[-1] * 4)
    return EvalConfig(
        data=str(paths.data), checkpoints=(str(base_checkpoint), str(long_checkpoint), str(long_checkpoint)),
        labels=(f"base@{short}", f"long@{format_size(cfg.length)}", f"long@{short} (control)"),
        max_context=(cfg.base_context, 0, cfg.base_context), bins=cfg.bins, max_windows=cfg.eval_windows,
        batch_size=cfg.eval_batch, device="cpu", out=str(paths.report),
        probe="copy" if cfg.probe_windows else "none", probe_segment=segment,
        probe_distances=(*distances, top), probe_mutation=0.0, probe_windows=cfg.probe_windows)


def eval_stage(ecfg: Any, report_dir: Path, progress: bool) -> tuple[dict[str, Any], str]:
    """The report (made now, or the current one kept) and what happened."""
    from lcft.evaluate.runner import evaluate

    report = _eval_is_current(report_dir, ecfg)
    if report is not None:
        return report, "done before with the same options and weights, skipped"
    report = evaluate(ecfg, progress=progress)
    probe = f", copy probe on {report['probe']['windows']}" if report.get("probe") else ""
    return report, f"{report['data']['windows']} held-out windows x 3{probe}"


def timed(number: int, title: str, fn: Callable[[], tuple[Any, str]], log: Callable[[str], None]
          ) -> tuple[Any, dict[str, Any]]:
    """Run one stage under its heading: (its result, {"seconds", "cpu_seconds", "result": what happened})."""
    log(f"[bold]{number}/5 {title}[/]")
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
    paths.out.mkdir(parents=True, exist_ok=True)
    save_resolved(paths.out / "demo.toml", to_dict(cfg))
    t_all = time.perf_counter()
    stages: dict[str, dict[str, Any]] = {}
    length, short = format_size(cfg.length), format_size(cfg.base_context)

    _, stages["prepare"] = timed(1, f"prepare {length}-token windows from the bundled human sample",
                                 lambda: (None, prepare_stage(cfg, paths.data, progress)), log)
    _, stages["init"] = timed(2, "write a fresh model", lambda: (None, init_stage(cfg, paths.init)), log)
    base, stages["base"] = timed(3, f"train the base model at {short} tokens", lambda: _described(
        train_stage(base_train_config(cfg, paths, progress)),
        f"{cfg.steps} steps x {cfg.base_batch} x {short} tokens, dense"), log)
    long, stages["long"] = timed(4, f"continue it at {length} tokens with sparse attention", lambda: _described(
        train_stage(long_train_config(cfg, paths, base, progress)),
        f"{cfg.long_steps} steps x {cfg.long_batch} x {length} tokens, sparse attention"), log)
    report, stages["eval"] = timed(5, "evaluate on the held-out chr22 windows", lambda: eval_stage(
        eval_config(cfg, paths, base, long), paths.report, progress), log)

    summary = {"total_seconds": round(time.perf_counter() - t_all, 1),
               "total_cpu_seconds": round(sum(v["cpu_seconds"] for v in stages.values()), 1),
               "stages": stages, "report_dir": str(paths.report),
               "plot": str(paths.report / "loss_by_position.png"), "summary": summary_lines(report),
               "note": demo_note(report)}
    (paths.out / "demo.json").write_text(json.dumps(summary, indent=1) + "\n")
    return {**summary, "report": report}


def _described(result: tuple[Path, str], what: str) -> tuple[Path, str]:
    """(checkpoint, "trained: <what>") from a training stage's (checkpoint, how)."""
    checkpoint, how = result
    return checkpoint, f"{how}: {what}"
