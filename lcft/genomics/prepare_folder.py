"""The output folder of `prepare_windows`: the files a run writes, what the folder already holds (this job done, a
killed run to resume, or windows of other options), and the move of a finished run out of `<out>/.partial`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from lcft.console import say_on_stderr
from lcft.disk import removed_or_said
from lcft.errors import LcftError, shown
from lcft.genomics.fasta import FastaFile
from lcft.genomics.prepare_state import load_state
from lcft.genomics.seq_tokenizer import TOKENIZER_FILE, SeqTokenizer, is_char
from lcft.genomics.shards import MANIFEST, SPLITS, SplitWriter, bin_name, read_manifest, softmask_name
from lcft.genomics.window_set import basemask_name, bases_name
from lcft.hashing import file_hash

PARTIAL = ".partial"
RESOLVED = "prepare.toml"


class PreparedOtherwise(LcftError):
    """The output folder holds windows of other options; `held` says so without the advice (a caller without
    --overwrite words its own)."""

    def __init__(self, held: str) -> None:
        super().__init__(f"{held}; pass --overwrite to replace them, or choose another --out")
        self.held = held


def _differing(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    for key in new:
        if old.get(key) != new[key]:
            return key
    return None


def split_files(split: str, tok: SeqTokenizer) -> tuple[str, ...]:
    """The files of one split, in SplitWriter.add order: ids, token soft mask, then for model tokenizers the
    bases per token and the per-base soft mask."""
    extra = () if is_char(tok) else (bases_name(split), basemask_name(split))
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


def check_existing(out: Path, options: dict, overwrite: bool, fasta: FastaFile) -> dict | None:
    """The manifest when `out` already holds exactly this job (no-op); None when there is work to do (a run of
    these options killed in `.partial`, under --overwrite or not, resumes)."""
    if (out / MANIFEST).is_file() and not overwrite:
        old = read_manifest(out)
        recorded = old.get("options") if isinstance(old.get("options"), dict) else {}
        key = _differing(_recorded(recorded, options, fasta), options)
        if key is None:  # done; a `.partial` beside it is what a finished run, or an --overwrite, was killed in
            drop_partial(out, "left by an earlier run of these options", "each run over this folder")
            return old
        if load_state(out / PARTIAL, options) is not None:  # a killed --overwrite of these options
            return None
        was, now = (_option_shown(key, v) for v in (recorded.get(key), options[key]))
        flag = {"fasta": "--fasta", "max_n_frac": "--max-n-frac"}.get(key, f"--{key}")
        raise PreparedOtherwise(f"{out} already holds windows prepared with a different {key} ({flag}: was {was}, "
                                f"now {now})")
    # --overwrite: the old outputs stay until the new ones are complete (clear_replaced); a `.partial` of other
    # options is cleared when the run starts (lcft.genomics.prepare)
    if not overwrite and not (out / PARTIAL).is_dir():
        stray = [n for n in _outputs() if (out / n).exists()]
        if stray:
            raise LcftError(f"{out} already has {stray[0]} but no complete manifest; pass --overwrite to replace it")
    return None


def resume_writers(partial: Path, state: dict, tok: SeqTokenizer) -> dict[str, SplitWriter] | None:
    """Writers reopened at the last checkpoint, or None when the kept bytes do not hash to what the
    checkpoint recorded (a torn write, or a machine crash before the data reached the disk)."""
    digests = state.get("digests", {})
    writers = {s: SplitWriter(partial, s, tuple(state["sizes"][s]), split_files(s, tok), tuple(digests.get(s, ())))
               for s in SPLITS}
    ok = all(
        list(w.sizes()) == state["sizes"][s] and (not any(state["sizes"][s]) or list(w.digests()) == digests.get(s))
        for s, w in writers.items()
    )
    if ok:
        return writers
    for w in writers.values():
        w.close()
    return None


def clear_replaced(out: Path, partial: Path) -> None:
    """Before a finished run moves its outputs in: drop the folder's old manifest (from here it is incomplete
    until the new one lands) and the old outputs the new run does not replace."""
    (out / MANIFEST).unlink(missing_ok=True)
    for name in _outputs():
        if not (partial / name).exists():
            (out / name).unlink(missing_ok=True)


def finalize(out: Path, partial: Path) -> None:
    """Move outputs into place, the manifest last (its presence means the folder is complete)."""
    for name in _outputs():
        if (partial / name).exists():
            os.replace(partial / name, out / name)
    # what stays is the run's state file, a few kB: the next run over the folder removes it, or warns
    shutil.rmtree(partial, ignore_errors=True)


def drop_partial(out: Path, what: str, later: str) -> None:
    """Remove `out`'s `.partial/` (`what`: whose it is); one that stays, windows that may take gigabytes, is a
    warning on stderr naming it and why (`later`: who tries again)."""
    removed_or_said(out / PARTIAL, say_on_stderr, f"{out / PARTIAL}, {what}", f" ({later} tries again)")
