"""`prepare_windows`: FASTA -> train/eval window shards + manifest, atomic (via <out>/.partial) and resumable."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text

from lcft import __version__
from lcft.config import Size, build, save_resolved, to_dict
from lcft.errors import LcftError
from lcft.genomics.fasta import FastaFile
from lcft.genomics.shards import (
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    SplitWriter,
    bin_name,
    read_manifest,
    softmask_name,
    write_json_atomic,
)
from lcft.genomics.tokenizer import tokenizer_spec
from lcft.genomics.windows import DEFAULT_CHUNK, iter_windows, window_starts

PARTIAL = ".partial"
STATE = "state.json"
RESOLVED = "prepare.toml"


@dataclass
class PrepareConfig:
    """Options of `lcft prepare windows`."""

    fasta: str | None = None
    """FASTA to read: plain, BGZF (bgzip) or plain gzip (decompressed once into $LCFT_CACHE, default ~/.cache/lcft)."""
    out: str | None = None
    """Output folder for train.bin, eval.bin, *.softmask.bin and manifest.json."""
    length: Size = 524288
    """Window length in tokens (65536, 512K, 1M). Must be a multiple of 8 (soft-mask bits are packed by byte); training also needs a multiple of 2 x cp x block size, which `lcft train` checks."""
    stride: Size | None = None
    """Distance between window starts in bases (default: the window length, no overlap)."""
    train: tuple[str, ...] = ("chr1", "chr2")
    """Chromosomes (FASTA record names) for the train split, comma separated."""
    eval: tuple[str, ...] = ("chr22",)
    """Held-out chromosomes for the eval split, comma separated (may be empty)."""
    max_n_frac: float = 0.1
    """Skip windows whose fraction of N (and other non-ACGT) bases is above this."""
    overwrite: bool = False
    """Replace windows already in --out that were prepared with different options."""

    def __post_init__(self) -> None:
        _validate(self)  # a PrepareConfig that exists is valid (files are checked when preparing)


def _console() -> Console:
    return Console(stderr=True)


class BasesPerSecond(ProgressColumn):
    """Throughput of one chromosome's task in bases per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed / 1e6:6.1f} Mbp/s" if speed else "   -- Mbp/s", style="cyan")


def _resolve(cfg: PrepareConfig | None, fields: dict[str, Any]) -> PrepareConfig:
    if cfg is None:
        return build(PrepareConfig, fields)
    if fields:
        return build(PrepareConfig, {**to_dict(cfg), **fields})
    return cfg


def _validate(cfg: PrepareConfig) -> tuple[int, int]:
    if not cfg.fasta:
        raise LcftError("no FASTA given (--fasta)")
    if not cfg.out:
        raise LcftError("no output folder given (--out)")
    length = cfg.length
    stride = cfg.length if cfg.stride is None else cfg.stride
    if length <= 0 or length % 8:
        raise LcftError(f"window length {length} must be a positive multiple of 8 (soft-mask bits are packed by byte)")
    if stride <= 0:
        raise LcftError(f"stride {stride} must be positive")
    if not 0.0 <= cfg.max_n_frac <= 1.0:
        raise LcftError(f"max_n_frac {cfg.max_n_frac} must be between 0 and 1")
    if not cfg.train:
        raise LcftError("no train chromosome given (--train)")
    for split, names in (("train", cfg.train), ("eval", cfg.eval)):
        dup = sorted({n for n in names if list(names).count(n) > 1})
        if dup:
            raise LcftError(f"chromosome {', '.join(dup)} is listed twice in --{split}")
    both = [n for n in cfg.train if n in cfg.eval]
    if both:
        raise LcftError(f"chromosome {', '.join(both)} is in both --train and --eval (held-out data must not be trained on)")
    return length, stride


def _options(cfg: PrepareConfig, fasta: FastaFile, length: int, stride: int) -> dict[str, Any]:
    """Everything that determines the output bytes; equal options = same output (the source path is not
    part of it: the same FASTA moved elsewhere gives the same windows)."""
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_spec(),
        "fasta": {"size": fasta.path.stat().st_size, "fai_md5": fasta.fai_md5()},
        "length": length,
        "stride": stride,
        "train": list(cfg.train),
        "eval": list(cfg.eval),
        "max_n_frac": cfg.max_n_frac,
    }


def _differing(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    for key in new:
        if old.get(key) != new[key]:
            return key
    return None


def _outputs(split_names: tuple[str, ...] = SPLITS) -> list[str]:
    return [f(s) for s in split_names for f in (bin_name, softmask_name)] + [RESOLVED, MANIFEST]


def _check_existing(out: Path, options: dict, overwrite: bool) -> dict | None:
    """The manifest when `out` already holds exactly this job (no-op); None when there is work to do."""
    if (out / MANIFEST).is_file() and not overwrite:
        old = read_manifest(out)
        key = _differing(old.get("options", {}), options)
        if key is None:
            return old
        was, now = old.get("options", {}).get(key), options[key]
        flag = {"fasta": "--fasta", "max_n_frac": "--max-n-frac"}.get(key, f"--{key}")
        raise LcftError(
            f"{out} already holds windows prepared with a different {key} ({flag}: was {was}, now {now}); "
            "pass --overwrite to replace them, or choose another --out"
        )
    if overwrite:
        for name in _outputs():
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / PARTIAL, ignore_errors=True)
    elif not (out / PARTIAL).is_dir():
        stray = [n for n in _outputs() if (out / n).exists()]
        if stray:
            raise LcftError(f"{out} already has {stray[0]} but no complete manifest; pass --overwrite to replace it")
    return None


def _load_state(partial: Path, options: dict) -> dict | None:
    try:
        state = json.loads((partial / STATE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return state if state.get("options") == options else None


def _resume_writers(partial: Path, state: dict) -> dict[str, SplitWriter] | None:
    """Writers reopened at the last checkpoint, or None when the kept bytes do not hash to what the
    checkpoint recorded (a torn write, or a machine crash before the data reached the disk)."""
    writers = {s: SplitWriter(partial, s, tuple(state["sizes"][s])) for s in SPLITS}
    digests = state.get("digests", {})
    ok = all(
        list(w.sizes()) == state["sizes"][s] and (state["sizes"][s] == [0, 0] or list(w.digests()) == digests.get(s))
        for s, w in writers.items()
    )
    if ok:
        return writers
    for w in writers.values():
        w.close()
    return None


def _finalize(out: Path, partial: Path) -> None:
    """Move outputs into place, the manifest last (its presence means the folder is complete)."""
    for name in _outputs():
        if (partial / name).exists():
            os.replace(partial / name, out / name)
    shutil.rmtree(partial, ignore_errors=True)


def prepare_windows(cfg: PrepareConfig | None = None, *, progress: bool = False, **fields: Any) -> dict:
    """Cut a FASTA into fixed-length token windows for training and held-out evaluation; return the manifest.

    Give a `PrepareConfig` or its fields as keywords (sizes like '512K' accepted). With `progress`, shows a
    bar per chromosome on stderr. Re-running with the same options is a no-op; a killed run resumes."""
    cfg = _resolve(cfg, fields)
    length, stride = cfg.length, cfg.length if cfg.stride is None else cfg.stride
    con = _console() if progress else None
    out = Path(cfg.out)  # type: ignore[arg-type]
    if out.exists() and not out.is_dir():
        raise LcftError(f"output {out} exists and is not a folder")
    with FastaFile(cfg.fasta) as fasta:  # type: ignore[arg-type]
        chosen = {"train": list(cfg.train), "eval": list(cfg.eval)}
        fasta.require(chosen["train"] + chosen["eval"])
        for split, names in chosen.items():
            if names and not any(window_starts(fasta.length(c), length, stride) for c in names):
                longest = max(names, key=fasta.length)
                raise LcftError(
                    f"window length {length} is longer than every {split} chromosome "
                    f"(longest: {longest}, {fasta.length(longest)} bp); use a smaller --length"
                )
        options = _options(cfg, fasta, length, stride)
        done = _check_existing(out, options, cfg.overwrite) if out.is_dir() else None
        if done is not None:
            if con:
                con.print(f"[green]{out} is already prepared with these options: nothing to do[/]")
            return done
        created = not out.exists()
        try:
            (out / PARTIAL).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LcftError(f"cannot write to output folder {out}: {e.strerror or e}") from None
        lock = _lock(out)
        try:
            manifest = _run(cfg, fasta, options, out, chosen, con)
        except LcftError:
            shutil.rmtree(out / PARTIAL, ignore_errors=True)
            if created and out.is_dir() and not any(out.iterdir()):
                out.rmdir()
            raise
        except OSError as e:
            raise LcftError(
                f"cannot write to {out / PARTIAL}: {e.strerror or e} (errno {e.errno}); the finished part is "
                "kept there: fix the cause and re-run the same command to resume"
            ) from None
        finally:
            os.close(lock)
    return manifest


def _lock(out: Path) -> int:
    """An exclusive lock on the output folder itself (no lock file to leave behind): two runs writing
    into one folder would interleave their windows."""
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LcftError(f"another `lcft prepare` is writing into {out}; wait for it or use another --out") from None
    return fd


def _run(cfg: PrepareConfig, fasta: FastaFile, options: dict, out: Path, chosen: dict, con: Console | None) -> dict:
    partial = out / PARTIAL
    state = _load_state(partial, options)
    if state and state.get("finished"):
        _finalize(out, partial)
        return read_manifest(out)
    writers = _resume_writers(partial, state) if state else None
    if writers is None:  # fresh start (leftovers of other options or of a torn run are not resumed)
        for child in partial.iterdir():
            child.unlink() if child.is_file() else shutil.rmtree(child)
        state = {"options": options, "chroms": [], "records": [], "sizes": {s: [0, 0] for s in SPLITS},
                 "digests": {}}
        writers = {s: SplitWriter(partial, s) for s in SPLITS}
    elif con:
        con.print(f"resuming: {len(state['chroms'])} chromosome(s) already done in {partial}")
    length, stride = options["length"], options["stride"]
    finished = {c["chrom"] for c in state["chroms"]}
    bar = (
        Progress(
            TextColumn("{task.description:>12}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
            BasesPerSecond(), TimeRemainingColumn(), console=con, transient=False,
        )
        if con else None
    )
    try:
        if bar:
            bar.start()
        for split in SPLITS:
            for chrom in chosen[split]:
                if chrom in finished:
                    continue
                n = fasta.length(chrom)
                task = bar.add_task(f"{split} {chrom}", total=n) if bar else None
                kept = skipped = 0
                for win, upto in iter_windows(fasta, chrom, length, stride, DEFAULT_CHUNK):
                    if win.n_frac > cfg.max_n_frac:
                        skipped += 1
                    else:
                        ids, soft = writers[split].buffers(length)
                        win.fill(ids, soft)
                        writers[split].add(ids, soft)
                        kept += 1
                        state["records"].append({
                            "split": split, "chrom": chrom, "start": win.start, "end": win.end,
                            "n_frac": round(win.n_frac, 6), "gc_frac": round(win.gc_frac, 6),
                        })
                    if bar:
                        bar.update(task, completed=upto)
                if bar:
                    bar.update(task, completed=n)
                # checkpoint: sizes and running digests after this chromosome. No fsync here (it would stall
                # on every chromosome); a resume re-hashes the kept prefix and starts over if it differs.
                writers[split].flush()
                state["sizes"][split] = list(writers[split].sizes())
                state["digests"][split] = list(writers[split].digests())
                state["chroms"].append({"split": split, "chrom": chrom, "length": n, "windows": kept, "skipped_n": skipped})
                write_json_atomic(partial / STATE, state, sync=False)
        for w in writers.values():
            w.sync()  # the finished data reaches the disk once, before the manifest declares it complete
    finally:
        if bar:
            bar.stop()
        for w in writers.values():
            w.close()
    manifest = _manifest(cfg, fasta, options, state, writers)
    for split in SPLITS:
        if chosen[split] and manifest["splits"][split]["windows"] == 0:
            raise LcftError(
                f"no {split} window left after the N filter: all {manifest['splits'][split]['skipped_n']} have "
                f"more than max_n_frac={cfg.max_n_frac} N bases (raise --max-n-frac or pick other chromosomes)"
            )
    resolved = {**to_dict(cfg), "stride": options["stride"]}
    save_resolved(partial / RESOLVED, {k: v for k, v in resolved.items() if k != "overwrite"})
    write_json_atomic(partial / MANIFEST, manifest)
    state["finished"] = True
    write_json_atomic(partial / STATE, state)
    _finalize(out, partial)
    return manifest


def _manifest(cfg: PrepareConfig, fasta: FastaFile, options: dict, state: dict, writers: dict) -> dict:
    splits = {}
    for split in SPLITS:
        chroms = [c for c in state["chroms"] if c["split"] == split]
        windows = sum(c["windows"] for c in chroms)
        splits[split] = {
            "chroms": [c["chrom"] for c in chroms],
            "windows": windows,
            "skipped_n": sum(c["skipped_n"] for c in chroms),
            "tokens": windows * options["length"],
            "files": writers[split].files(),
        }
    return {
        "format_version": FORMAT_VERSION,
        "created_by": f"lcft {__version__}",
        "tokenizer": tokenizer_spec(),
        "source": {
            "path": str(fasta.path.resolve()),
            "size": options["fasta"]["size"],
            "fai_md5": options["fasta"]["fai_md5"],
            "compression": fasta.kind,
        },
        "length": options["length"],
        "stride": options["stride"],
        "max_n_frac": cfg.max_n_frac,
        "softmask": {"file": "{split}.softmask.bin", "packing": "numpy.packbits, big bit order, L/8 bytes per window"},
        "options": options,
        "splits": splits,
        "chroms": state["chroms"],
        "records": state["records"],
    }
