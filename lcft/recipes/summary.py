"""What the demo's report measured, in plain lines: the continued model against the base and its control (with
intervals), on recurring tokens, the copy probe's effective context, the positive control, and the closing note."""

from __future__ import annotations

import math
from typing import Any

from lcft.config import format_size
from lcft.evaluate.stats import context_text
from lcft.units import counted


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

    _, long, ctrl = report["checkpoints"][:3]
    boot = report["bootstrap"]
    weights = resample_counts(len(long["windows"]), boot["replicates"], boot["seed"])
    c = mean_difference(*_per_window(long, subset), *_per_window(ctrl, subset), weights, relative=True,
                        level=boot["level"])
    return float(c.value), float(c.low), float(c.high)


NO_INTERVAL = "(no interval: fewer than 2 windows)"


def _ci(low: float, high: float) -> str:
    if math.isnan(low):
        return NO_INTERVAL
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


def _context(report: dict, ck: dict) -> str:
    """Checkpoint `ck`'s effective context as the summary names it, cannot tell and no probe kept apart."""
    return context_text(ck["effective_context"], report["probe"]["windows"] if report.get("probe") else None)


def probe_line(report: dict) -> str | None:
    """How far back each model reads (the copy probe's effective context), when the probe ran."""
    if not report.get("probe"):
        return None
    parts = [f"{ck['label']} {_context(report, ck)}" for ck in report["checkpoints"]]
    return (f"effective context (copy probe, {counted(report['probe']['windows'], 'window')}: farthest copy distance whose "
            f"loss drop is above zero, at most 2.5% error over the distances together): {'; '.join(parts)}")


def summary_lines(report: dict, control_steps: int = 0) -> list[str]:
    """Plain statements of what the report measured: continued vs base, and continued vs its control overall
    (with its 95% interval) and in the first and last tenth of the window (the published finding is a gain
    growing toward the end), the same on recurring and non-recurring tokens, and the copy probe's effective
    context of each model."""
    base, long, ctrl = report["checkpoints"][:3]
    _, low, high = control_interval(report)
    lines = [
        "(+ = higher held-out loss than the reference, i.e. worse; - = lower, better)",
        f"continued vs base: {_pct(long['loss'], base['loss'])} overall "
        f"({long['loss']:.4f} vs {base['loss']:.4f} nats; uniform guess {report['uniform']['loss']:.4f})",
        f"continued at the full window vs the same model cut to {format_size(ctrl['max_context'])}: "
        f"{_pct(long['loss'], ctrl['loss'])} overall, {_pct(long['first_tenth_loss'], ctrl['first_tenth_loss'])} "
        f"in the first tenth of the window, {_pct(long['last_tenth_loss'], ctrl['last_tenth_loss'])} in the last",
        f"95% interval of that overall change (paired bootstrap over {len(long['windows'])} held-out windows): "
        + (NO_INTERVAL if math.isnan(low) else f"[{100 * low:+.2f}%, {100 * high:+.2f}%]"
           f"{' (includes 0: no difference detectable)' if low <= 0 <= high else ''}"),
    ]
    extra = [line for line in (recurrence_line(report), probe_line(report), control_line(report, control_steps))
             if line is not None]
    return [*lines, *extra]


def demo_note(report: dict) -> str:
    """What the demo shows and what it cannot, with this run's own figures from its report."""
    _, long, ctrl = report["checkpoints"][:3]
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
        "the finding needs the full-scale run (see README)." + _control_note(report)
    )


def _control_note(report: dict) -> str:
    """What the positive control shows and what it does not, with this run's figures (empty without one)."""
    cks = report["checkpoints"]
    if len(cks) < 4:
        return ""
    base, ctl = cks[0], cks[3]
    if not report.get("probe"):
        return (f" The positive control ({ctl['label']}) is the base trained on chr2 windows whose second half "
                "copies their first; the copy probe did not run (--probe-windows 0), so this run does not show "
                "whether it reads back.")
    if ctl["effective_context"] is None:
        return (f" The positive control ({ctl['label']}) is the base trained on chr2 windows whose second half "
                f"copies their first; too few copy-probe windows with tokens ({report['probe']['windows']} probed) for its "
                f"{len(report['probe']['distances'])} distances tested together (even a drop in every window "
                "would not pass the test), so this run cannot tell whether it reads back (use more "
                "--probe-windows).")
    found = (f"in this run the copy probe finds it reading back {_context(report, ctl)} tokens (the "
             f"farthest copy whose loss drop is above zero, the distances tested together) against "
             f"{_context(report, base)} for the base" if ctl["effective_context"] else
             "in this run the copy probe did not detect it reading back (effective context: none detected)")
    shows = ("It shows that the probe and its interval detect a model that uses its context when one does"
             if ctl["effective_context"] else "So this run does not show that the probe detects a model that uses "
             "its context (train the control longer: --control-steps)")
    return (f" The positive control ({ctl['label']}) is the base trained on chr2 windows whose second half copies "
            f"their first; {found}. {shows}; it does not show that hg38 context helps a model at scale.")



def control_line(report: dict[str, Any], steps: int) -> str | None:
    """What the positive control measured: its effective context against the base's, the copy probe's drop
    at the farthest distance it reaches with its interval, and its change against the base on recurring
    held-out tokens; None without one."""
    cks = report["checkpoints"]
    if len(cks) < 4:
        return None
    base, ctl = cks[0], cks[3]
    line = (f"{ctl['label']}, the base trained {steps} more steps on chr2 windows whose second half copies their "
            f"first: effective context {_context(report, ctl)}"
            + (f" against the base's {_context(report, base)}" if report.get("probe") else ""))
    pr = ctl.get("probe")
    if pr and any(v is not None for v in pr["drop"]):
        # the farthest distance it reads back, or else where its drop is largest
        k = (pr["distances"].index(ctl["effective_context"]) if ctl["effective_context"] else
             max((j for j, v in enumerate(pr["drop"]) if v is not None), key=lambda j: pr["drop"][j]))
        line += f"; copy-probe loss drop {format_size(pr['distances'][k])} back: {pr['drop'][k]:+.3f} nats/token"
        if pr["ci_low"][k] is not None:  # no interval from fewer than 2 probe windows
            line += f" [95% interval {pr['ci_low'][k]:+.3f}, {pr['ci_high'][k]:+.3f}]"
    rec = ctl.get("recurring", {})
    if rec.get("tokens") and rec.get("ci_low") is not None:
        line += (f"; on recurring held-out tokens {100 * rec['relative_change']:+.2f}% "
                 f"[{100 * rec['ci_low']:+.2f}%, {100 * rec['ci_high']:+.2f}%] against the base")
    return line
