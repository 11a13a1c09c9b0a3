"""What checking a reused .fai against its FASTA costs when a FASTA is opened: many short records, plain and BGZF,
and a genome of unwrapped records.

A FASTA of `--records` records of 100 bases (an assembly of short contigs: the worst case per byte, a header for
every 100 bases) is indexed once; then pyfaidx opens it alone (its index reused, nothing read) and lcft's
FastaFile opens it: pyfaidx's open plus the check that its index fits the file (lcft.genomics.fasta_scan: each
record's header and its first line's end, read many records at a time and judged with numpy), and again with
that check made a record at a time (its fallback). The unwrapped genome (2 records of 50 Mbp, each on one line)
shows that a record's first line is not read whole. Prints the fastest of `--repeat` opens of each, the ratios
and the peak RSS.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path


def write(folder: Path, records: int, kind: str) -> Path:
    random.seed(0)
    if kind == "unwrapped":
        path = folder / "unwrapped.fa"
        with path.open("w") as fh:
            for name in ("a", "b"):
                fh.write(f">{name}\n{'ACGT' * 12_500_000}\n")
        return path
    text = "".join(f">ctg{i} len=100\n{''.join(random.choices('ACGT', k=100))}\n" for i in range(records))
    if kind == "plain":
        path = folder / "many.fa"
        path.write_text(text)
        return path
    from Bio import bgzf as bg

    path = folder / "many.fa.gz"
    with bg.BgzfWriter(str(path), "wb") as w:
        w.write(text)
    return path


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="20,000 records")
    args = ap.parse_args()
    import pyfaidx

    from lcft.genomics import fasta_scan
    from lcft.genomics.fasta import FastaFile
    from lcft.train.precision import cpu_describe

    n, plain_records = 20_000 if args.quick else args.records, fasta_scan.PLAIN_RECORDS
    print(f"CPU: {cpu_describe()}; {n:,} records of 100 bases")
    print("| file | pyfaidx open s | FastaFile open s | ratio | check a record at a time: open s | numpy's gain "
          "| peak RSS GiB |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("plain", "BGZF", "unwrapped"):
            path = write(Path(tmp), n, kind)
            with FastaFile(path):
                pass  # the index, beside the file

            def plain(path: Path = path) -> None:
                pyfaidx.Faidx(str(path)).close()

            def checked(path: Path = path) -> None:
                with FastaFile(path):
                    pass

            def one_at_a_time(path: Path = path) -> None:
                fasta_scan.PLAIN_RECORDS = 1 << 62
                try:
                    checked(path)
                finally:
                    fasta_scan.PLAIN_RECORDS = plain_records

            a, b, c = best(plain, args.repeat), best(checked, args.repeat), best(one_at_a_time, args.repeat)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            if kind == "unwrapped":
                print(f"\nunwrapped genome (2 records of 50 Mbp, one line each): pyfaidx open {a * 1e3:.2f} ms, "
                      f"FastaFile open {b * 1e3:.2f} ms")
            else:
                print(f"| {kind} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {c:.2f} | {c / b:.2f}x | {peak:.2f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
