"""The eval report: figures as a dict (eval.json), a CSV by position bin, a matplotlib plot, and a rich table."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lcft import __version__
from lcft.config_toml import absolute_paths, dumps_toml, to_dict
from lcft.disk import write_failure
from lcft.evaluate.binning import SUBSETS, THIN, UNIFORM_BITS, UNIFORM_LOSS, relative_change, tenths
from lcft.evaluate.config import NOT_FIGURES
from lcft.evaluate.plot import plot
from lcft.evaluate.recurrence import K
from lcft.evaluate.stats import (
    LEVEL,
    MIN_WINDOWS,
    Change,
    bin_positions,
    mean_difference,
    resample_counts,
    trend,
)
from lcft.files import replacing_together
from lcft.units import LN2, counted

FORMAT_VERSION = 1
CSV_NAME, JSON_NAME, PNG_NAME, TOML_NAME = "loss_by_position.csv", "eval.json", "loss_by_position.png", "eval.toml"
# each figure's unit in its header, as the terminal tables give it (eval.json's "loss" is nats per token too); a
# bin's start and end count tokens or bases (--position), said on every row: the two read alike otherwise; so is
# the unit of the change and its interval (a fraction, which the tables print in percent), and the checkpoint a
# label stands for (as given): a CSV opened alone says what its figures are. Columns are only ever added at the end
CSV_COLUMNS = ("label", "subset", "bin", "start", "end", "position_unit", "tokens", "loss_nats_per_token",
               "bits_per_base", "relative_change", "ci_low", "ci_high", "change_unit", "checkpoint")
NATS = "nats per token"
BOUNDS = ("the unit of the figure it bounds: relative_change's beside it, slope_per_doubling's in trend, drop's in "
          "probe")
SPLITS = SUBSETS[1:]  # the soft-mask and the recurrence split reported next to every figure over all tokens


def change_unit(reference: str, per: str = "") -> str:
    """The unit of a change against the checkpoint labelled `reference` (`per`: of a slope) as eval.json and the
    CSV store it: a fraction, which the tables print in percent."""
    return f"fraction{per}: (loss - {reference}'s loss) / {reference}'s loss; 0.01 = 1%"


def units(reference: str, positions: str) -> dict[str, str]:
    """eval.json's `units`: each figure's unit, by its name wherever it stands (`positions`: what a position
    counts, tokens or bases)."""
    return {"loss": NATS, "first_tenth_loss": NATS, "last_tenth_loss": NATS, "bits_per_base": "bits per base",
            "relative_change": change_unit(reference),
            "slope_per_doubling": change_unit(reference, " per doubling of position"), "ci_low": BOUNDS,
            "ci_high": BOUNDS, "drop": NATS, "loss_with": NATS, "loss_without": NATS, "edges": positions,
            "first_tenth": positions, "last_tenth": positions, "distances": "tokens", "effective_context": "tokens"}


def _num(x: float) -> float | None:
    """JSON has no NaN: an undefined figure (a bin without tokens) is null."""
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def _nums(x: np.ndarray) -> list[float | None]:
    return [_num(v) for v in np.asarray(x).ravel()]


def _split(loss: np.ndarray, count: np.ndarray, bases: np.ndarray, per_bin: Change, overall: Change, s: int
           ) -> dict[str, Any]:
    """Figures of one subset `s` from per-window bin sums `loss`, `count` and `bases` `(n, subsets, k)`: bits
    per base are over the bases of the subset's tokens (in either position unit; a k-mer token covers k)."""
    tok = count[:, s].sum(0)  # (k,)
    per = bases[:, s].sum(0)  # (k,) what bits are counted per
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(tok > 0, loss[:, s].sum(0) / np.maximum(tok, 1), np.nan)  # (k,)
        bits = np.where(per > 0, loss[:, s].sum(0) / np.maximum(per, 1) / LN2, np.nan)  # (k,)
    total = float(loss[:, s].sum()) / int(tok.sum()) if tok.sum() else math.nan
    bpb = float(loss[:, s].sum()) / int(per.sum()) / LN2 if per.sum() else math.nan
    return {"tokens": int(tok.sum()), "loss": _num(total), "bits_per_base": _num(bpb),
            "relative_change": _num(overall.value[s]), "ci_low": _num(overall.low[s]), "ci_high": _num(overall.high[s]),
            "bins": {"loss": _nums(means), "bits_per_base": _nums(bits), "tokens": [int(c) for c in tok],
                     "relative_change": _nums(per_bin.value[s]), "ci_low": _nums(per_bin.low[s]),
                     "ci_high": _nums(per_bin.high[s])}}


def _intervals(res: Any, ref: Any, weights: np.ndarray, positions: np.ndarray, is_ref: bool) -> dict[str, Any]:
    """Bootstrap intervals of one checkpoint's change against the reference (overall, per bin, per subset) and
    the trend of its per-bin change with log position."""
    loss, count = res.bins.loss, res.bins.count  # (n, subsets, k)
    ref_loss, ref_count = ref.bins.loss, ref.bins.count
    per_bin = mean_difference(loss, count, ref_loss, ref_count, weights, relative=True)  # (subsets, k)
    overall = mean_difference(loss.sum(2), count.sum(2), ref_loss.sum(2), ref_count.sum(2), weights,
                              relative=True)  # (subsets,)
    if is_ref:  # the reference against itself: a change of 0 by construction, with no interval to give (null)
        per_bin, overall = (dataclasses.replace(c, low=np.full_like(c.low, np.nan), high=np.full_like(c.high, np.nan))
                            for c in (per_bin, overall))
    out: dict[str, Any] = {"ci_low": _num(overall.low[0]), "ci_high": _num(overall.high[0]),
                           "bins": {"ci_low": _nums(per_bin.low[0]), "ci_high": _nums(per_bin.high[0])}, "trend": None}
    if not is_ref:
        all_bins = Change(per_bin.value[0], per_bin.low[0], per_bin.high[0], per_bin.samples[:, 0],
                          per_bin.support[:, 0])
        t = trend(all_bins, count[:, 0], weights, positions)
        out["trend"] = {"slope_per_doubling": _num(t.slope), "ci_low": _num(t.low), "ci_high": _num(t.high),
                        "verdict": t.verdict}
    for s, name in enumerate(SPLITS, start=1):
        out[name] = _split(loss, count, res.bins.bases, per_bin, overall, s)
    return out


def _recurrence(res: Any) -> dict[str, Any] | None:
    """The distance histogram of the recurring tokens (the same windows for every checkpoint)."""
    if res.recurrence is None:
        return None
    edges, tokens = res.recurrence
    return {"k": K, "distance_edges": [int(e) for e in edges], "tokens": [int(t) for t in tokens],
            "note": "counted tokens whose k-mer last occurred d bases earlier in the window, "
                    "distance_edges[c] <= d < distance_edges[c + 1] (the last class takes anything farther)"}


def _probe_options(cfg: Any, results: list) -> dict[str, Any] | None:
    probe = results[0].probe
    if probe is None:
        return None
    return {"kind": "copy", "segment": probe.segment, "distances": list(probe.distances),
            "mutation": probe.mutation, "windows": probe.n_windows,
            "target": [probe.length - probe.segment, probe.length],
            "note": "the window's last `segment` tokens are overwritten by the segment `distance` tokens earlier; "
                    "drop = loss on them with that source shuffled minus with it intact (nats/token; > 0 = read back); "
                    "mutated: the source with round(mutation x its bases) positions given another base by "
                    "exchanging bases among them (the base counts kept, as in the shuffled control; fewer where "
                    "too few distinct bases allow it); "
                    "rebuild a planted window with lcft.evaluate.probe.plant(ids, window, segment, distance, "
                    "mutation, seed); a checkpoint's effective_context: the farthest distance whose drop is above "
                    "zero, the distances tested together; 0 = none detected; null = cannot tell (too few windows "
                    "with tokens for the distances tested together; without the probe, this object and each "
                    "checkpoint's probe are null instead)"}


def _probe_figures(probe: Any, cfg: Any) -> dict[str, Any]:
    """A checkpoint's copy-probe figures (drop by distance with intervals) and its effective context."""
    if probe is None:
        return {"effective_context": None, "probe": None}
    summary = probe.summary(resample_counts(probe.n_windows, cfg.bootstrap, cfg.seed))
    return {"effective_context": summary["effective_context"], "probe": summary}


def _bases(windows: list[dict[str, Any]]) -> int:
    """Bases of the counted tokens (= tokens for char; a model tokenizer's tokens cover several)."""
    return sum(w.get("bases", w["tokens"]) for w in windows)


def _bits_per_base(loss_sum: float, windows: list[dict[str, Any]]) -> float:
    """Total nats over the bases the counted tokens cover, in bits (per token for char, as before)."""
    bases = _bases(windows)
    return loss_sum / bases / LN2 if bases else math.nan


def _uniform(ref: dict[str, Any]) -> dict[str, Any]:
    """A uniform guess over A, C, G, T: 2 bits per base, so per token ln 4 times the bases a token covers on
    average (1 for char; about k for a k-mer tokenizer)."""
    per_token = ref["bases"] / ref["tokens"] if ref["tokens"] else 1.0
    return {"loss": UNIFORM_LOSS * per_token, "bits_per_base": UNIFORM_BITS}


def _checkpoint_record(cfg: Any, info: Any, res: Any, ref: Any, is_ref: bool, edges: np.ndarray,
                       weights: np.ndarray, by_bases: bool) -> dict[str, Any]:
    """One checkpoint's figures: overall, per bin, per window, intervals against the reference, probe."""
    (f0, f1), (l0, l1) = tenths(int(edges[-1]))
    ref_bins, _ = ref.sums.binned(edges)
    ref_loss = ref.sums.mean()
    positions = bin_positions(edges)
    means, counts = res.sums.binned(edges)
    bits, bases = res.sums.binned_bits_per_base(edges)  # over each bin's bases (= its tokens for char)
    loss_sum, tokens = res.sums.total()
    loss = loss_sum / tokens if tokens else math.nan
    rec = info.describe()
    rec.update({
        "tokens": tokens,
        "loss": _num(loss),
        "bases": _bases(res.windows), "bits_per_base": _num(_bits_per_base(loss_sum, res.windows)),
        "first_tenth_loss": _num(res.sums.range_mean(f0, f1)),
        "last_tenth_loss": _num(res.sums.range_mean(l0, l1)),
        "relative_change": _num(relative_change(loss, ref_loss)),
        "bins": {"loss": _nums(means), "bits_per_base": _nums(bits), "tokens": [int(c) for c in counts],
                 **({"bases": [int(c) for c in bases]} if by_bases else {}),
                 "relative_change": _nums(relative_change(means, ref_bins))},
        "windows": [{k: _num(v) if isinstance(v, float) else v for k, v in w.items()} for w in res.windows],
    })
    extra = _intervals(res, ref, weights, positions, is_ref)
    rec["bins"].update(extra.pop("bins"))
    rec.update(extra, **_probe_figures(res.probe, cfg))
    return rec


def build_report(cfg: Any, ws: Any, n_windows: int, infos: list, results: list, edges: np.ndarray) -> dict[str, Any]:
    """Every figure of the evaluation as plain JSON-able data (see README: eval.json)."""
    length, by_bases = int(edges[-1]), getattr(cfg, "position", "tokens") == "bases"  # positions the bins span
    (f0, f1), (l0, l1) = tenths(length)
    weights = resample_counts(len(results[0].bins), cfg.bootstrap, cfg.seed)  # (reps, n) shared by all
    checkpoints = [_checkpoint_record(cfg, info, res, results[0], i == 0, edges, weights, by_bases)
                   for i, (info, res) in enumerate(zip(infos, results, strict=True))]
    return {
        "format_version": FORMAT_VERSION,
        "lcft_version": __version__,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "options": to_dict(cfg),
        "data": {
            "folder": str(cfg.data),
            "split": cfg.split,
            "window_length": ws.length,
            "windows": n_windows,
            "windows_in_split": len(ws),
            "tokenizer": ws.manifest.get("tokenizer"),
        },
        "positions": {
            "unit": "bases" if by_bases else "tokens",
            "note": "position p = offset in bases of the predicted token's first base in the window" if by_bases else
                    "position p = index in the window of the predicted token (it sees the p tokens before it)",
            "bin_scale": cfg.bin_scale,
            "edges": [int(e) for e in edges],
            "windows": [int(w) for w in results[0].bins.windows],  # the same counted tokens in every checkpoint
            "windows_note": f"windows with counted tokens in each bin; a bin with fewer than {THIN:.0%} of them "
                            "averages those windows only (shaded in the plot)",
            "first_tenth": [f0, f1],
            "last_tenth": [l0, l1],
        },
        "units": units(checkpoints[0]["label"], "bases" if by_bases else "tokens"),
        "uniform": _uniform(checkpoints[0]),
        "bootstrap": {"replicates": cfg.bootstrap, "seed": cfg.seed, "level": LEVEL, "resampled": "windows",
                      "note": "paired percentile intervals of each change against the first checkpoint; null where "
                              f"fewer than {MIN_WINDOWS} windows have tokens in both (the trend verdict then says "
                              "undefined)"},
        "subsets": {"repeat": "predicted token soft-masked (lower case in the FASTA; a token of several bases: at "
                              "least half of them)", "unique": "the others",
                    "recurring": f"the {K}-mer ending at the predicted token's last base occurs earlier in the window",
                    "nonrecurring": f"its {K}-mer does not (or holds a base other than A/C/G/T)"},
        "recurrence": _recurrence(results[0]),
        "probe": _probe_options(cfg, results),
        "checkpoints": checkpoints,
    }


def read_back_problem(report: dict[str, Any], cfg: Any, n_windows: int) -> str | None:
    """Why `report`, read back from an eval.json, is not one that `cfg` writes over `n_windows` windows (None when
    it is): its format, options (but those no figure depends on: `figure_options`), bootstrap (the intervals allocate replicates x windows again from it), checkpoint
    and window counts, or a number that is not finite (JSON reads NaN, Infinity, 1e999 and integers past 64 bits)."""
    options = report.get("options")
    if report.get("format_version") != FORMAT_VERSION or not isinstance(options, dict) or \
            figure_options(options) != figure_options(to_dict(cfg)):
        return "written by another version or with other options"
    boot, data, cks = report.get("bootstrap"), report.get("data"), report.get("checkpoints")
    if not isinstance(boot, dict) or [boot.get(k) for k in ("replicates", "seed", "level")] != [
            cfg.bootstrap, cfg.seed, LEVEL]:
        return f"its bootstrap is not {cfg.bootstrap:,} replicates with seed {cfg.seed}"
    if not isinstance(data, dict) or data.get("windows") != n_windows:
        return f"it does not count {counted(n_windows, 'window')}"
    if not (isinstance(cks, list) and len(cks) == len(cfg.checkpoints) and all(
            isinstance(c, dict) and isinstance(c.get("windows"), list) and len(c["windows"]) == n_windows for c in cks)):
        return f"it does not hold {len(cfg.checkpoints)} checkpoints of {counted(n_windows, 'window')} each"
    return None if _finite(report) else "it holds a number that is not finite"


def figure_options(options: dict[str, Any]) -> dict[str, Any]:
    """A report's options (as `to_dict` writes them) without those no figure depends on (`NOT_FIGURES`)."""
    return {k: v for k, v in options.items() if k not in NOT_FIGURES}


def _finite(x: Any) -> bool:
    """Whether every float in the JSON value `x` is finite and every integer fits 64 bits (float() of a larger
    one overflows)."""
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_finite(v) for v in x)
    if isinstance(x, float):
        return math.isfinite(x)
    return not isinstance(x, int) or -(1 << 63) <= x < 1 << 63


def csv_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (checkpoint, bin), the same figures as the JSON (empty cells for undefined figures, and for the
    reference's intervals), each with the unit of its change and the checkpoint its label stands for."""
    edges, unit = report["positions"]["edges"], report["positions"]["unit"]
    change = change_unit(report["checkpoints"][0]["label"])
    rows = []
    for ck in report["checkpoints"]:
        for subset in SUBSETS:
            b = ck["bins"] if subset == "all" else ck[subset]["bins"]
            for i in range(len(edges) - 1):
                rows.append({
                    "label": ck["label"], "subset": subset, "bin": i, "start": edges[i], "end": edges[i + 1],
                    "position_unit": unit, "tokens": b["tokens"][i], "loss_nats_per_token": b["loss"][i], "bits_per_base": b["bits_per_base"][i],
                    "relative_change": b["relative_change"][i], "ci_low": b["ci_low"][i], "ci_high": b["ci_high"][i],
                    "change_unit": change, "checkpoint": ck["checkpoint"],
                })
    return rows


def write_outputs(report: dict[str, Any], out: Path, cfg: Any) -> dict[str, Path]:
    """Write loss_by_position.csv, loss_by_position.png, the resolved eval.toml and eval.json as one set: all are
    written under temp names before any replaces an earlier report's, eval.json last (its presence means the
    report is complete)."""
    from lcft.errors import RESUME, LcftError

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LcftError(f"cannot create output folder {out}: {e.strerror or e}") from None
    paths = {k: out / n for k, n in (("json", JSON_NAME), ("csv", CSV_NAME), ("png", PNG_NAME), ("toml", TOML_NAME))}

    def write_csv(fh: io.TextIOBase) -> None:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        for row in csv_rows(report):
            w.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in row.items()})

    png = plot(report)
    try:
        with replacing_together([paths[k] for k in ("csv", "png", "toml", "json")]) as (csv_tmp, png_tmp, toml, js):
            with open(csv_tmp, "w", newline="") as fh:
                write_csv(fh)
            png_tmp.write_bytes(png)
            toml.write_text(dumps_toml(to_dict(absolute_paths(cfg))))
            with open(js, "w") as fh:
                json.dump(report, fh, indent=1, allow_nan=False)
    except OSError as e:  # the losses stay in .partial (lcft.evaluate.store): a rerun only writes the report
        raise LcftError(f"cannot write the report into {out}: {write_failure(e)}; fix the cause "
                        f"and {RESUME} (the evaluated losses are kept)") from None
    return paths
