"""What checking a reused .fai against its FASTA costs when a FASTA is opened: many short records, plain and BGZF,
and a genome of unwrapped records.

A FASTA of `--records` records of 100 bases (an assembly of short contigs: the worst case per byte, a header for
every 100 bases) is indexed once; then pyfaidx opens it alone (its index reused, nothing read) and lcft's
FastaFile opens it: pyfaidx's open plus the check that its index fits the file (lcft.genomics.fasta_scan: each
record's header and its first line's end, read many records at a time and judged with numpy), and again with
that check made a record at a time (its fallback). The unwrapped genome (2 records of 50 Mbp, each on one line)
shows that a record's first line is not read whole. Prints the fastest of `--repeat` opens of each, the ratios
and the peak RSS. Then the check alone on the plain file damaged under its open index (a blank ending the first
line of the record 90% in, another name in its header, a blank ending every record's first line): only the
records of a read numpy cannot decide checked one by one, against every record from the first once a read is
undecided (`fasta_scan.RECHECK_FROM_START`, the way before), alternated, fastest of `--repeat`.
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


def damaged_scans(path: Path, records: int, repeat: int) -> None:
    """The check of `path`'s index (records of 100 bases) with one of the damages above, both ways."""
    from lcft.genomics import fasta_scan
    from lcft.genomics.fasta import FastaFile

    clean = path.read_bytes()
    print("\n| damage | check, the records of an undecided read one by one: s | every record from the first: s "
          "| gain | peak RSS GiB |\n|---|---|---|---|---|")
    for damage in ("a blank 90% in", "a header 90% in", "a blank in every record"):
        with FastaFile(path) as f:
            data = bytearray(clean)
            for name in [f"ctg{records * 9 // 10}"] if "90%" in damage else f.names:
                rec = f.index[name]
                at = rec.offset + rec.lenc - 1 if "blank" in damage else rec.offset - len(name) - 8
                data[at] = ord(" " if "blank" in damage else "x")  # (a header '>ctg1 len=100': its 't')
            path.write_bytes(bytes(data))  # the same inode: the open file reads the new bytes
            times: dict[bool, list[float]] = {False: [], True: []}
            for i in range(repeat):
                for whole in (False, True)[:: 1 if i % 2 else -1]:
                    fasta_scan.RECHECK_FROM_START = whole
                    t0 = time.perf_counter()
                    found = fasta_scan.scan_index(f)
                    times[whole].append(time.perf_counter() - t0)
                    assert found.mismatch or found.blanks, damage
            fasta_scan.RECHECK_FROM_START = False
        path.write_bytes(clean)
        ours, before = min(times[False]), min(times[True])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"| {damage} | {ours:.3f} | {before:.3f} | {before / ours:.2f}x | {peak:.2f} |", flush=True)


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
        damaged_scans(Path(tmp) / "many.fa", n, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
