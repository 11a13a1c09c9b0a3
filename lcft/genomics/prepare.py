"""`prepare_windows`: FASTA -> train/eval window shards + manifest, atomic (via <out>/.partial) and resumable."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TimeRemainingColumn
from rich.text import Text

from lcft.config import Size, build, paths_absolute, save_resolved, to_dict
from lcft.console import make_console, text_column
from lcft.disk import write_failure
from lcft.errors import LcftError, shown
from lcft.files import file_hash, folder_lock
from lcft.genomics.cut import check_oov, cut_char, cut_tokens
from lcft.genomics.fasta import FastaFile
from lcft.genomics.hf_tokenizer import prepare_tokenizer
from lcft.genomics.manifest import build_manifest, is_char
from lcft.genomics.prepare_state import STATE, load_state
from lcft.genomics.seq_tokenizer import TOKENIZER_FILE, SeqTokenizer
from lcft.genomics.shards import (
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    SplitWriter,
    bin_name,
    is_window_length,
    read_manifest,
    softmask_name,
    write_json_atomic,
)
from lcft.genomics.tokenizer import tokenizer_spec
from lcft.genomics.window_set import basemask_name, bases_name
from lcft.genomics.windows import window_starts

PARTIAL = ".partial"
RESOLVED = "prepare.toml"


class PreparedOtherwise(LcftError):
    """The output folder holds windows of other options; `held` says so without the advice (a caller without
    --overwrite words its own)."""

    def __init__(self, held: str) -> None:
        super().__init__(f"{held}; pass --overwrite to replace them, or choose another --out")
        self.held = held


@dataclass
class PrepareConfig:
    """Options of `lcft prepare windows`."""

    fasta: str | None = None
    """FASTA to read: plain, BGZF (bgzip) or plain gzip (decompressed once into $LCFT_CACHE, default ~/.cache/lcft)."""
    out: str | None = None
    """Output folder for {split}.bin, {split}.softmask.bin, manifest.json and prepare.toml (with a model tokenizer also {split}.bases.bin, {split}.basemask.bin and tokenizer.json)."""
    length: Size = 524288
    """Window length in tokens (65536, 512K, 1M). Must be a multiple of 8 (soft-mask bits are packed by byte); training also needs a multiple of 2 x cp x block size, which `lcft train` checks."""
    stride: Size | None = None
    """Distance between window starts in tokens (= bases for char; default: the window length, no overlap)."""
    train: tuple[str, ...] = ("chr1", "chr2")
    """Chromosomes (FASTA record names) for the train split, comma separated."""
    eval: tuple[str, ...] = ("chr22",)
    """Held-out chromosomes for the eval split, comma separated (may be empty)."""
    max_n_frac: float = 0.1
    """Skip windows whose fraction of N (and other non-ACGT) bases is above this."""
    overwrite: bool = False
    """Replace windows already in --out that were prepared with different options."""
    tokenizer: str = "char"
    """The model's tokenizer: char (one token per base, lcft's vocabulary), kmer:K (non-overlapping K-mers, built-in vocabulary; kmer:K:PATH takes ids from a vocab.txt or a folder holding one), or a path to a tokenizer.json, a model folder holding one (or a k-mer vocab.txt), or that vocab.txt (read offline), or a model's Hub id ORG/NAME[@REVISION]. --length and --stride count its tokens."""
    max_oov_frac: float = 0.01
    """Refuse a split when more than this fraction of its tokens are the tokenizer's unknown token (letters it has no token for); the error names the letters."""

    def __post_init__(self) -> None:
        _validate(self)  # a PrepareConfig that exists is valid (files are checked when preparing)


def _console() -> Console:
    return make_console(stderr=True)


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
    if not is_window_length(length):
        raise LcftError(f"window length {length} must be a positive multiple of 8 (soft-mask bits are packed by byte)")
    if stride <= 0:
        raise LcftError(f"stride {stride} must be positive")
    if not 0.0 <= cfg.max_n_frac <= 1.0:
        raise LcftError(f"max_n_frac {cfg.max_n_frac} must be between 0 and 1")
    if not 0.0 <= cfg.max_oov_frac <= 1.0:
        raise LcftError(f"max_oov_frac {cfg.max_oov_frac} must be between 0 and 1")
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


def _options(cfg: PrepareConfig, fasta: FastaFile, length: int, stride: int, tok: SeqTokenizer,
             hashed: bool = True) -> dict[str, Any]:
    """Everything that determines the output bytes; equal options = same output (the source path is not
    part of it: the same FASTA moved elsewhere gives the same windows; its contents are, by their sha256).
    hashed=False: the sha256 is left None, for `_run` to fill in before it first records the options."""
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_spec() if _is_char(tok) else tok.spec(),
        "fasta": {"size": fasta.path.stat().st_size, "sha256": fasta.sha256() if hashed else None},
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


def _is_char(tok: SeqTokenizer) -> bool:
    return is_char(tok)


def _split_files(split: str, tok: SeqTokenizer) -> tuple[str, ...]:
    """The files of one split, in SplitWriter.add order: ids, token soft mask, then for model tokenizers the
    bases per token and the per-base soft mask."""
    extra = () if _is_char(tok) else (bases_name(split), basemask_name(split))
    return (bin_name(split), softmask_name(split), *extra)


def _outputs(split_names: tuple[str, ...] = SPLITS) -> list[str]:
    names = [f(s) for s in split_names for f in (bin_name, softmask_name, bases_name, basemask_name)]
    return names + [TOKENIZER_FILE, RESOLVED, MANIFEST]


def _option_shown(key: str, value: Any) -> str:
    """An option of a manifest (read from the file: any JSON) or of this run, for the message naming what differs:
    a tokenizer by its name, a FASTA by its sha256 (the same name may hold other contents)."""
    if key == "tokenizer" and isinstance(value, dict):
        value = value.get("name")
    if key == "fasta" and isinstance(value, dict):
        return f"sha256 {shown(value.get('sha256', '?'))[:12]}"
    return shown(value)


def _recorded(old: dict[str, Any], options: dict[str, Any], fasta: FastaFile) -> dict[str, Any]:
    """A manifest's options as this version writes them: folders from before the FASTA's sha256 was recorded
    named it by its size and the md5 of its .fai, which still identify it when they match."""
    src = old.get("fasta")
    if isinstance(src, dict) and "sha256" not in src and src.get("size") == options["fasta"]["size"] and \
            src.get("fai_md5") == file_hash(fasta.indexname, "md5").hexdigest():
        return {**old, "fasta": options["fasta"]}
    return old


def _check_existing(out: Path, options: dict, overwrite: bool, fasta: FastaFile) -> dict | None:
    """The manifest when `out` already holds exactly this job (no-op); None when there is work to do (a run of
    these options killed in `.partial`, under --overwrite or not, resumes)."""
    if (out / MANIFEST).is_file() and not overwrite:
        old = read_manifest(out)
        recorded = old.get("options") if isinstance(old.get("options"), dict) else {}
        key = _differing(_recorded(recorded, options, fasta), options)
        if key is None:  # done; a `.partial` beside it is what a finished run was killed removing
            shutil.rmtree(out / PARTIAL, ignore_errors=True)
            return old
        if load_state(out / PARTIAL, options) is not None:  # a killed --overwrite of these options
            return None
        was, now = (_option_shown(key, v) for v in (recorded.get(key), options[key]))
        flag = {"fasta": "--fasta", "max_n_frac": "--max-n-frac"}.get(key, f"--{key}")
        raise PreparedOtherwise(f"{out} already holds windows prepared with a different {key} ({flag}: was {was}, "
                                f"now {now})")
    # --overwrite: the old outputs stay until the new ones are complete (_clear_replaced); a `.partial` of other
    # options is cleared when the run starts (_run)
    if not overwrite and not (out / PARTIAL).is_dir():
        stray = [n for n in _outputs() if (out / n).exists()]
        if stray:
            raise LcftError(f"{out} already has {stray[0]} but no complete manifest; pass --overwrite to replace it")
    return None


def _resume_writers(partial: Path, state: dict, tok: SeqTokenizer) -> dict[str, SplitWriter] | None:
    """Writers reopened at the last checkpoint, or None when the kept bytes do not hash to what the
    checkpoint recorded (a torn write, or a machine crash before the data reached the disk)."""
    writers = {s: SplitWriter(partial, s, tuple(state["sizes"][s]), _split_files(s, tok)) for s in SPLITS}
    digests = state.get("digests", {})
    ok = all(
        list(w.sizes()) == state["sizes"][s] and (not any(state["sizes"][s]) or list(w.digests()) == digests.get(s))
        for s, w in writers.items()
    )
    if ok:
        return writers
    for w in writers.values():
        w.close()
    return None


def _clear_replaced(out: Path, partial: Path) -> None:
    """Before a finished run moves its outputs in: drop the folder's old manifest (from here it is incomplete
    until the new one lands) and the old outputs the new run does not replace."""
    (out / MANIFEST).unlink(missing_ok=True)
    for name in _outputs():
        if not (partial / name).exists():
            (out / name).unlink(missing_ok=True)


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
    tok = prepare_tokenizer(cfg.tokenizer)
    with FastaFile(cfg.fasta) as fasta:  # type: ignore[arg-type]
        chosen = {"train": list(cfg.train), "eval": list(cfg.eval)}
        fasta.require(chosen["train"] + chosen["eval"])
        for split, names in chosen.items():  # (model tokens: checked once cut, their bases per token vary)
            if _is_char(tok) and names and not any(window_starts(fasta.length(c), length, stride) for c in names):
                longest = max(names, key=fasta.length)
                raise LcftError(
                    f"window length {length} is longer than every {split} chromosome "
                    f"(longest: {longest}, {fasta.length(longest)} bp); use a smaller --length"
                )
        created = not out.exists()
        if created:  # nothing to compare the FASTA's digest with: hashed while the first chromosome is cut
            fasta.hash_in_background()
        options = _options(cfg, fasta, length, stride, tok, hashed=not created)
        # the lock first: a second run must not delete (--overwrite) what the first is writing
        with folder_lock(out, "lcft prepare"):  # (removes a folder it created that stays empty)
            done = None if created else _check_existing(out, options, cfg.overwrite, fasta)
            if done is not None:
                for split in SPLITS:  # max_oov_frac is not an option of the output: checked against it here
                    info = done["splits"][split]
                    check_oov(split, info["oov"], info["tokens"], info.get("oov_letters", {}), cfg.max_oov_frac,
                              tok.name)
                if con:
                    con.print(f"{out} is already prepared with these options: nothing to do", style="green")
                return done
            try:
                (out / PARTIAL).mkdir(exist_ok=True)
            except OSError as e:
                raise LcftError(f"cannot write to output folder {out}: {e.strerror or e}") from None
            return _run_locked(cfg, fasta, options, out, chosen, con, tok)


def _run_locked(cfg: PrepareConfig, fasta: FastaFile, options: dict, out: Path, chosen: dict, con: Console | None,
                tok: SeqTokenizer) -> dict:
    """_run with its failures as one-line errors: a user error drops the partial folder, a write error keeps it."""
    try:
        return _run(cfg, fasta, options, out, chosen, con, tok)
    except LcftError:
        shutil.rmtree(out / PARTIAL, ignore_errors=True)
        raise
    except OSError as e:
        raise LcftError(f"cannot write to {out / PARTIAL}: {write_failure(e)}; the finished part is kept there: "
                        "fix the cause and re-run the same command to resume") from None


def _run(cfg: PrepareConfig, fasta: FastaFile, options: dict, out: Path, chosen: dict, con: Console | None,
         tok: SeqTokenizer) -> dict:
    partial = out / PARTIAL
    state = load_state(partial, options)
    if state and state.get("finished"):
        _finalize(out, partial)
        return read_manifest(out)
    writers = _resume_writers(partial, state, tok) if state else None
    if writers is None:  # fresh start (leftovers of other options or of a torn run are not resumed)
        for child in partial.iterdir():
            child.unlink() if child.is_file() else shutil.rmtree(child)
        state = {"options": options, "chroms": [], "records": [],
                 "sizes": {s: [0] * len(_split_files(s, tok)) for s in SPLITS}, "digests": {}}
        writers = {s: SplitWriter(partial, s, names=_split_files(s, tok)) for s in SPLITS}
    elif con:
        con.print(f"resuming: {len(state['chroms'])} chromosome(s) already done in {partial}")
    finished = {c["chrom"] for c in state["chroms"]}
    bar = (
        Progress(
            text_column("{task.description:>12}"), BarColumn(), text_column("{task.percentage:>5.1f}%"),
            BasesPerSecond(), TimeRemainingColumn(), console=con, transient=False,
        )
        if con else None
    )
    try:
        if bar:
            bar.start()
        for split in SPLITS:
            for chrom in chosen[split]:
                if chrom not in finished:
                    _cut_one(fasta, split, chrom, options, tok, writers[split], state, bar)
                    options["fasta"]["sha256"] = fasta.sha256()  # (state["options"] is this dict)
                    write_json_atomic(partial / STATE, state, sync=False)
        for w in writers.values():
            w.sync()  # the finished data reaches the disk once, before the manifest declares it complete
    finally:
        if bar:
            bar.stop()
        for w in writers.values():
            w.close()
    return _complete(cfg, fasta, options, state, writers, chosen, tok, out)


def _cut_one(fasta: FastaFile, split: str, chrom: str, options: dict, tok: SeqTokenizer, writer: SplitWriter,
             state: dict, bar: Progress | None) -> None:
    """Cut one chromosome into `writer`, then checkpoint the state: sizes and running digests. No fsync here
    (it would stall on every chromosome); a resume re-hashes the kept prefix and starts over if it differs."""
    n = fasta.length(chrom)
    task = bar.add_task(f"{split} {chrom}", total=n) if bar else None

    def progress(upto: int) -> None:
        if bar:
            bar.update(task, completed=upto)

    letters = Counter(state.setdefault("oov_letters", {}).get(split, {}))
    if _is_char(tok):
        kept, skipped = cut_char(fasta, chrom, split, options, writer, state["records"], letters, progress)
    else:
        kept, skipped = cut_tokens(fasta, chrom, split, options, tok, writer, state["records"], letters, progress)
    progress(n)
    writer.flush()
    state["sizes"][split] = list(writer.sizes())
    state["digests"][split] = list(writer.digests())
    state["oov_letters"][split] = dict(letters)
    state["chroms"].append({"split": split, "chrom": chrom, "length": n, "windows": kept, "skipped_n": skipped})


def _complete(cfg: PrepareConfig, fasta: FastaFile, options: dict, state: dict, writers: dict, chosen: dict,
              tok: SeqTokenizer, out: Path) -> dict:
    """Check the splits (windows left, unknown tokens), write tokenizer, resolved options and manifest, finalize."""
    partial = out / PARTIAL
    options["fasta"]["sha256"] = fasta.sha256()  # (a run that cut nothing has not filled it in)
    manifest = build_manifest(fasta, options, state, writers, tok.dtype.name)
    for split in SPLITS:
        info = manifest["splits"][split]
        if chosen[split] and info["windows"] == 0 and info["skipped_n"] == 0:
            raise LcftError(f"window length {options['length']} is longer than every {split} chromosome in "
                            f"{tok.name} tokens; use a smaller --length")
        if chosen[split] and info["windows"] == 0:
            raise LcftError(
                f"no {split} window left after the N filter: all {info['skipped_n']} have "
                f"more than max_n_frac={cfg.max_n_frac} N bases (raise --max-n-frac or pick other chromosomes)"
            )
        check_oov(split, info["oov"], info["tokens"], state["oov_letters"].get(split, {}), cfg.max_oov_frac, tok.name)
    if not _is_char(tok):
        (partial / TOKENIZER_FILE).write_text(tok.json_text)
    resolved = {**to_dict(cfg), "stride": options["stride"]}
    saved = {k: v for k, v in resolved.items() if k != "overwrite"}  # (train's config.toml is absolute too)
    save_resolved(partial / RESOLVED, paths_absolute(saved, ("fasta", "out", "tokenizer")))
    write_json_atomic(partial / MANIFEST, manifest)
    _clear_replaced(out, partial)
    state["finished"] = True
    write_json_atomic(partial / STATE, state)
    _finalize(out, partial)
    return manifest
