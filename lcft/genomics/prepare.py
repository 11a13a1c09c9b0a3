"""`prepare_windows`: FASTA -> train/eval window shards + manifest, atomic (via <out>/.partial) and resumable."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task
from rich.text import Text

from lcft.config_build import build
from lcft.config_toml import absolute_paths, save_resolved, to_dict
from lcft.console import make_console, text_column, time_left_column
from lcft.disk import write_failure
from lcft.errors import RESUME, LcftError
from lcft.files import atomic_write, expect_folder
from lcft.folder_lock import folder_lock
from lcft.foreign_entries import refuse_foreign
from lcft.genomics.cut import check_oov, cut_char, cut_tokens
from lcft.genomics.fasta import FastaFile
from lcft.genomics.hf_tokenizer import prepare_tokenizer
from lcft.genomics.manifest import build_manifest
from lcft.genomics.prepare_config import PrepareConfig
from lcft.genomics.prepare_folder import (
    PARTIAL,
    RESOLVED,
    check_existing,
    clear_replaced,
    drop_partial,
    finalize,
    resume_writers,
    split_files,
)
from lcft.genomics.prepare_state import STATE, load_state
from lcft.genomics.seq_tokenizer import TOKENIZER_FILE, SeqTokenizer, is_char
from lcft.genomics.shards import (
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    SplitWriter,
    read_manifest,
    write_json_atomic,
)
from lcft.genomics.windows import window_starts


def _console() -> Console:
    return make_console(stderr=True)


class BasesPerSecond(ProgressColumn):
    """Throughput of one chromosome's task in bases per second: while it runs, rich's estimate ('--' until two
    updates); once finished, its bases over its time. A model tokenizer reports its bases a read (2 Mbp) at a
    time, so a shorter chromosome is one update: rich has no rate for it, and sets no finished one on update()."""

    def render(self, task: Task) -> Text:
        speed = task.completed / task.finished_time if task.finished and task.finished_time else task.speed
        return Text(f"{speed / 1e6:6.1f} Mbp/s" if speed else "   -- Mbp/s", style="cyan")


def _resolve(cfg: PrepareConfig | None, fields: dict[str, Any]) -> PrepareConfig:
    if cfg is None:
        return build(PrepareConfig, fields)
    if fields:
        return build(PrepareConfig, {**to_dict(cfg), **fields})
    return cfg


def _options(cfg: PrepareConfig, fasta: FastaFile, length: int, stride: int, tok: SeqTokenizer,
             hashed: bool = True) -> dict[str, Any]:
    """Everything that determines the output bytes; equal options = same output (the source path is not
    part of it: the same FASTA moved elsewhere gives the same windows; its contents are, by their sha256).
    hashed=False: the sha256 is left None, for `_run` to fill in before it first records the options."""
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": tok.spec(),
        "fasta": {"size": fasta.path.stat().st_size, "sha256": fasta.sha256() if hashed else None},
        "length": length,
        "stride": stride,
        "train": list(cfg.train),
        "eval": list(cfg.eval),
        "max_n_frac": cfg.max_n_frac,
    }


def prepare_windows(cfg: PrepareConfig | None = None, *, progress: bool = False, **fields: Any) -> dict:
    """Cut a FASTA into fixed-length token windows for training and held-out evaluation; return the manifest.

    Give a `PrepareConfig` or its fields as keywords (sizes like '512K' accepted). With `progress`, shows a
    bar per chromosome on stderr. Re-running with the same options is a no-op; a killed run resumes."""
    return prepare_windows_wrote(_resolve(cfg, fields), progress=progress)[0]


def prepare_windows_wrote(cfg: PrepareConfig, *, progress: bool = False) -> tuple[dict, bool]:
    """prepare_windows, and whether this call wrote the windows (False: the folder already held this job)."""
    length, stride = cfg.length, cfg.length if cfg.stride is None else cfg.stride
    con = _console() if progress else None
    out = Path(cfg.out)  # type: ignore[arg-type]
    expect_folder(out, "--out")
    absolute_paths(cfg)  # for its refusals (a name the saved prepare.toml could not hold), before any cutting
    tok = prepare_tokenizer(cfg.tokenizer)
    with FastaFile(cfg.fasta) as fasta:  # type: ignore[arg-type]
        chosen = {"train": list(cfg.train), "eval": list(cfg.eval)}
        fasta.require(chosen["train"] + chosen["eval"])
        for split, names in chosen.items():  # (model tokens: checked once cut, their bases per token vary)
            if is_char(tok) and names and not any(window_starts(fasta.length(c), length, stride) for c in names):
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
            refuse_foreign(out / PARTIAL, "prepare")  # before anything in .partial is read, resumed or removed
            done = None if created else check_existing(out, options, cfg.overwrite, fasta)
            if done is not None:
                for split in SPLITS:  # max_oov_frac is not an option of the output: checked against it here
                    info = done["splits"][split]
                    check_oov(split, info["oov"], info["tokens"], info.get("oov_letters", {}), cfg.max_oov_frac,
                              tok.name)
                if con:
                    con.print(f"{out} is already prepared with these options: nothing to do", style="green")
                return done, False
            try:
                (out / PARTIAL).mkdir(exist_ok=True)
            except OSError as e:
                raise LcftError(f"cannot write to output folder {out}: {e.strerror or e}") from None
            return _run_locked(cfg, fasta, options, out, chosen, con, tok), True


def _run_locked(cfg: PrepareConfig, fasta: FastaFile, options: dict, out: Path, chosen: dict, con: Console | None,
                tok: SeqTokenizer) -> dict:
    """_run with its failures as one-line errors: a user error drops the partial folder, a write error keeps it."""
    try:
        return _run(cfg, fasta, options, out, chosen, con, tok)
    except LcftError:
        drop_partial(out, "of the refused run", "the next run into this folder")
        raise
    except OSError as e:
        raise LcftError(f"cannot write to {out / PARTIAL}: {write_failure(e)}; the finished part is kept there: "
                        f"fix the cause and {RESUME}") from None


def _run(cfg: PrepareConfig, fasta: FastaFile, options: dict, out: Path, chosen: dict, con: Console | None,
         tok: SeqTokenizer) -> dict:
    partial = out / PARTIAL
    state = load_state(partial, options)
    if state and state.get("finished"):
        finalize(out, partial)
        return read_manifest(out)
    writers = resume_writers(partial, state, tok) if state else None
    if writers is None:  # fresh start (leftovers of other options or of a torn run are not resumed)
        for child in partial.iterdir():
            child.unlink() if child.is_file() else shutil.rmtree(child)
        state = {"options": options, "chroms": [], "records": [],
                 "sizes": {s: [0] * len(split_files(s, tok)) for s in SPLITS}, "digests": {}}
        writers = {s: SplitWriter(partial, s, names=split_files(s, tok)) for s in SPLITS}
    elif con:
        con.print(f"resuming: {len(state['chroms'])} chromosome(s) already done in {partial}")
    finished = {c["chrom"] for c in state["chroms"]}
    bar = (
        Progress(
            text_column("{task.description:>12}"), BarColumn(), text_column("{task.percentage:>5.1f}%"),
            BasesPerSecond(), time_left_column(), console=con, transient=False,
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
    if is_char(tok):
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
    if not is_char(tok):
        atomic_write(partial / TOKENIZER_FILE, tok.json_text)
    resolved = {**to_dict(absolute_paths(cfg)), "stride": options["stride"]}
    save_resolved(partial / RESOLVED, {k: v for k, v in resolved.items() if k != "overwrite"})
    write_json_atomic(partial / MANIFEST, manifest)
    clear_replaced(out, partial)
    state["finished"] = True
    write_json_atomic(partial / STATE, state)
    finalize(out, partial)
    return manifest
