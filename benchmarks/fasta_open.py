"""What checking a reused .fai against its FASTA costs when a FASTA is opened: many short records, plain and BGZF.

A FASTA of `--records` records of 100 bases (an assembly of short contigs: the worst case per byte, one header
read per record) is indexed once; then, alternating, pyfaidx opens it alone (its index reused, nothing read) and
lcft's FastaFile opens it (pyfaidx's open plus one read per record of its header and first line,
lcft.genomics.fasta_check). Prints the fastest of `--repeat` opens of each, their ratio and the peak RSS.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path


def write(folder: Path, records: int, bgzf: bool) -> Path:
    random.seed(0)
    text = "".join(f">ctg{i} len=100\n{''.join(random.choices('ACGT', k=100))}\n" for i in range(records))
    if not bgzf:
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

    from lcft.genomics.fasta import FastaFile
    from lcft.train.precision import cpu_describe

    n = 20_000 if args.quick else args.records
    print(f"CPU: {cpu_describe()}; {n:,} records of 100 bases")
    print("| file | pyfaidx open s | FastaFile open s | ratio | peak RSS GiB |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for bgzf in (False, True):
            path = write(Path(tmp), n, bgzf)
            with FastaFile(path):
                pass  # the index, beside the file

            def plain(path: Path = path) -> None:
                pyfaidx.Faidx(str(path)).close()

            def checked(path: Path = path) -> None:
                with FastaFile(path):
                    pass

            a, b = best(plain, args.repeat), best(checked, args.repeat)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"| {'BGZF' if bgzf else 'plain'} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {peak:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
