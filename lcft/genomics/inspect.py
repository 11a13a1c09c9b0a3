"""`lcft prepare inspect`: per-chromosome composition of a FASTA, or the summary of a prepared folder."""

from __future__ import annotations

import os
from pathlib import Path

from rich.progress import BarColumn, Progress

from lcft.console import make_console, text_column
from lcft.genomics.fasta import FastaFile
from lcft.genomics.shards import SPLIT_COUNTS, read_manifest
from lcft.genomics.windows import chromosome_stats


def inspect_fasta(path: str | os.PathLike, progress: bool = False) -> list[dict]:
    """One dict per record: chrom, length, n_frac, softmask_frac, gc_frac (streamed, any genome size)."""
    with FastaFile(path) as fasta:
        if not progress:
            return [chromosome_stats(fasta, c) for c in fasta.names]
        rows = []
        with Progress(text_column("{task.description}"), BarColumn(), console=make_console(stderr=True),
                      transient=True) as bar:
            task = bar.add_task("scanning", total=len(fasta.names))
            for c in fasta.names:
                bar.update(task, description=f"scanning {c}")
                rows.append(chromosome_stats(fasta, c))
                bar.advance(task)
        return rows


def summarize_windows(out_dir: str | os.PathLike) -> dict:
    """The headline facts of a prepared folder (from its manifest; `verify_windows` checks the bytes)."""
    m = read_manifest(out_dir)
    return {
        "dir": str(Path(out_dir)),
        "source": m["source"]["path"],
        "tokenizer": m["tokenizer"].get("name", "?"),  # what `length` and `stride` count
        "length": m["length"],
        "stride": m["stride"],
        "max_n_frac": m["max_n_frac"],
        "splits": {
            s: {k: info[k] for k in ("chroms", *SPLIT_COUNTS)}
            | {k: info.get(k, 0) for k in ("bases", "oov")}
            | {"bytes": sum(f["bytes"] for f in info.get("files", {}).values())}
            for s, info in m["splits"].items()
        },
        "chroms": m["chroms"],
    }
