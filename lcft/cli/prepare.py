"""`lcft prepare`: windows, inspect, verify, fetch, cache — thin wrappers over lcft.genomics."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from lcft.cli.common import console, user_errors
from lcft.cli.generate import Opt, command_from_config
from lcft.cli.help import Typer
from lcft.config import format_size
from lcft.console import styled
from lcft.errors import shell_word
from lcft.genomics.prepare_config import PrepareConfig
from lcft.units import counted

CONCATENATE = ("to cut several FASTA files, concatenate them into one: `cat a.fa b.fa > ab.fa` (gzip files as they "
               "are: `cat a.fa.gz b.fa.gz > ab.fa.gz`)")
LENGTH = "length (bases)"  # a chromosome's, in the tables of inspect: windows count tokens, which may be several bases

app = Typer(help="Prepare genome data: FASTA -> verified fixed-length token windows.", no_args_is_help=True)


def _summary(manifest: dict, wrote: bool) -> Table:
    """The windows table; under it the tokenizer, and a line a split (bases, unknown tokens): left aligned, each line
    whole at 80 columns."""
    t = Table(title=f"windows of {format_size(manifest['length'])} tokens (stride {format_size(manifest['stride'])})"
              + ("" if wrote else ", already there"), caption_justify="left")
    # two-line headers leave a chromosome's name room to stay whole at 80 columns (22:20000001-21000000); where
    # the table is narrower still, a cell folds onto more lines: a name or a count is never cut to '…'
    for col in ("split", "chromosomes", "windows", "skipped\nfor N", "tokens", "bytes\nwritten" if wrote else "bytes"):
        t.add_column(col, justify="left" if col in ("split", "chromosomes") else "right", overflow="fold")
    for split, info in manifest["splits"].items():
        size = sum(f["bytes"] for f in info.get("files", {}).values())
        t.add_row(split, ", ".join(info["chroms"]) or "-", f"{info['windows']:,}", f"{info['skipped_n']:,}",
                  f"{info['tokens']:,}", f"{size:,}")
    lines = [f"tokenizer {manifest['tokenizer'].get('name', '?')}"] + [
        f"{split}: {counted(info.get('bases', 0), 'base')}, {counted(info.get('oov', 0), 'unknown token')}"
        for split, info in manifest["splits"].items()]
    t.caption = "\n".join(lines)
    return t


def _windows(cfg: PrepareConfig) -> None:
    from lcft.checkpoint.layout import check_output_folder
    from lcft.genomics.prepare import prepare_windows_wrote

    if cfg.out:  # here, as lcft.genomics sits below the checkpoint layout that knows runs and models
        check_output_folder(cfg.out, "the windows", ("windows",), fasta=cfg.fasta or "")
    manifest, wrote = prepare_windows_wrote(cfg, progress=True)
    console.print(_summary(manifest, wrote))
    done = f"wrote {cfg.out}/manifest.json" if wrote else f"nothing written: {cfg.out} already held these windows"
    console.print(f"{done}; check it with `lcft prepare verify {shell_word(cfg.out)}`", soft_wrap=True)


command_from_config(app, "windows", PrepareConfig, _windows, table="prepare", resumes=True,
                    options={"fasta": Opt(metavar="PATH", once=CONCATENATE), "out": Opt(metavar="DIR"),
                             "train": Opt(commas=True, metavar="CHROMS"), "eval": Opt(commas=True, metavar="CHROMS")},
                    help="Cut a FASTA into train/eval windows of token ids (+ soft-mask bits) with a manifest.")


@app.command("verify")
@user_errors
def verify(out: Path = typer.Argument(..., metavar="DIR", help="A folder written by `lcft prepare windows`.")) -> None:
    """Recompute every size and sha256 listed in the manifest; name the corrupt file and exit 1 if any."""
    from lcft.genomics.shards import verify_windows

    m = verify_windows(out)
    n = sum(len(s["files"]) for s in m["splits"].values()) + len(m.get("files", {}))  # + the tokenizer's
    console.print(styled(("ok:", "green"), f" {n} files in {out} match the manifest"), soft_wrap=True)


@app.command("inspect")
@user_errors
def inspect(path: Path = typer.Argument(..., metavar="PATH", help="A FASTA file, or a folder written by `lcft prepare windows`.")) -> None:
    """Chromosomes of a FASTA (length, N, soft-masked, GC), or the summary of a prepared folder."""
    from lcft.genomics.inspect import inspect_fasta, summarize_windows

    if path.is_dir():
        s = summarize_windows(path)
        console.print(f"{s['dir']}: windows of {counted(s['length'], 'token')} of tokenizer {s['tokenizer']} "
                      f"(stride {counted(s['stride'], 'token')}, max N fraction {s['max_n_frac']}) from {s['source']}",
                      soft_wrap=True)
        t = Table("split", "chromosome", LENGTH, "windows", "skipped for N")
        for c in s["chroms"]:
            t.add_row(c["split"], c["chrom"], f"{c['length']:,}", f"{c['windows']:,}", f"{c['skipped_n']:,}")
        for split, info in s["splits"].items():
            t.add_row(Text(split, style="bold"), "all", "", Text(f"{info['windows']:,}", style="bold"),
                      f"{info['skipped_n']:,}")
        console.print(t)
        return
    rows = inspect_fasta(path, progress=True)
    t = Table("chromosome", LENGTH, "N", "soft-masked", "GC", title=str(path))
    for r in rows:
        t.add_row(r["chrom"], f"{r['length']:,}", f"{r['n_frac']:.2%}", f"{r['softmask_frac']:.2%}", f"{r['gc_frac']:.2%}")
    console.print(t)


@app.command("fetch")
@functools.partial(user_errors, resumes=True)  # the download goes on from its .part file
def fetch(
    name: str = typer.Argument("hg38", metavar="NAME", help="Genome to download (known: hg38)."),
    out: Path = typer.Option(Path("data"), "--out", help="Folder to download into."),
    url: str | None = typer.Option(None, "--url", help="Download from this URL instead (a mirror, or a local server)."),
    md5: str | None = typer.Option(None, "--md5", help="Expected md5 of the download; default: the one published in md5sum.txt next to the URL; 'skip' to skip."),
    bgzip: bool = typer.Option(False, "--bgzip", help="Keep it compressed: a plain gzip NAME.fa.gz is recompressed as BGZF in its place (random access "
                               "through NAME.fa.gz.gzi) instead of decompressed to NAME.fa."),
) -> None:
    """Download a reference FASTA (resumable, md5-checked) and make it ready for `prepare windows`: hg38.fa.gz
    becomes hg38.fa (the download removed once unpacked) or, with --bgzip, hg38.fa.gz as BGZF; indexed beside."""
    from lcft.genomics.fetch import fetch_fasta

    ready = fetch_fasta(name, out, url=url, md5=md5, bgzip=bgzip, progress=True)
    console.print(str(ready), soft_wrap=True)


@app.command("cache")
@user_errors
def cache(
    days: float | None = typer.Option(
        None, "--remove-unused", metavar="DAYS", min=0,
        help="Remove what no FASTA open has used for DAYS days (0: everything), and links to files that are gone. "
             "Each is made again when a FASTA needs it (a plain gzip copy: decompressed again)."),
) -> None:
    """What lcft keeps in its cache ($LCFT_CACHE, default $XDG_CACHE_HOME/lcft or ~/.cache/lcft): decompressed and
    normalized FASTA copies, links and indexes, largest first, with their size and last use."""
    from lcft.genomics.fasta_cache import cache_dir, cache_entries, remove_unused

    if days is not None:
        gone = remove_unused(days)
        console.print(f"removed {counted(len(gone), 'entry', 'entries')} ({_size(sum(e.bytes for e in gone))}) from {cache_dir()}",
                      highlight=False, soft_wrap=True)
    entries = sorted(cache_entries(), key=lambda e: (-e.bytes, e.name))
    now = time.time()
    t = Table("kind", "name", "size", "last used", title=str(cache_dir()))
    for e in entries:
        t.add_row(e.kind, e.name, _size(e.bytes), _ago(now - e.last_used))
    if entries:
        console.print(t)
    console.print(f"{counted(len(entries), 'entry', 'entries')}, {_size(sum(e.bytes for e in entries))}", highlight=False)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.{2 if shift == 30 else 1}f} {unit}"
    return f"{n / 1024:.0f} KiB"


def _ago(seconds: float) -> str:
    for unit, length in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f} {unit} ago"
    return "just now"


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="prepare")
