"""Building a FASTA's .fai: lcft's numpy builder (lcft/genomics/fai_build.py) against pyfaidx's, which lcft used for
every file before and still uses for any file not of the plain layout.

Three generated files: a genome of `--mbp` Mbp in two chromosomes wrapped at 60 (benchmarks/prepare.py's generator:
soft-masked, N runs), an assembly of `--contigs` contigs of 100 bases (a header per 101 bytes of bases), and the
genome as BGZF (its .gzi built too). Each
build runs in its own process, alternating, `--repeat` times; prints the fastest of each (wall and CPU seconds),
the ratios and each side's peak RSS (VmHWM), and checks that all sides wrote the same bytes.

`--comment` puts a `;` comment line first in each file: not the plain layout, so lcft builds it by pyfaidx's steps
(lcft/genomics/fai_lines.py). `--old REV` adds a third side: lcft with fai_lines.py as it was at git revision REV.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from Bio import bgzf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare import write_fasta  # noqa: E402 (the benchmark's generated genome)

BUILD = """
import importlib.util, json, sys, time
from pathlib import Path
import pyfaidx
from lcft.genomics import fai_build
from lcft.genomics.fai_build import build_bgzf_index, build_fai
if sys.argv[3].startswith("lcft@"):  # fai_lines.py of another revision, written to argv[4]
    spec = importlib.util.spec_from_file_location("old_fai_lines", sys.argv[4])
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    fai_build.index_rows = old.index_rows
t, cpu = time.perf_counter(), time.process_time()  # imports done: the build alone
gz = sys.argv[1].endswith(".gz")  # BGZF: a .gzi too
if sys.argv[3].startswith("lcft"):
    fai = Path(sys.argv[2])
    assert build_bgzf_index(Path(sys.argv[1]), fai, fai.with_suffix(".gzi")) if gz else build_fai(Path(sys.argv[1]), fai) is None
else:
    gzi = {"gzi_indexname": sys.argv[2][:-4] + ".gzi"} if gz else {}
    pyfaidx.Faidx(sys.argv[1], indexname=sys.argv[2], **gzi).close()
dt, dcpu = time.perf_counter() - t, time.process_time() - cpu
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")]
print(json.dumps({"wall": dt, "cpu": dcpu, "rss_kib": hwm[0]}))
"""


def build(fasta: Path, fai: Path, who: str, old: Path | None = None) -> dict:
    fai.unlink(missing_ok=True)
    fai.with_suffix(".gzi").unlink(missing_ok=True)
    # One BLAS thread: numpy's, unused here, would otherwise spin after import (about 0.08 s CPU in every process)
    r = subprocess.run([sys.executable, "-c", BUILD, str(fasta), str(fai), who, str(old)], capture_output=True,
                       text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def contigs(path: Path, n: int, first: str = "") -> None:
    rng = random.Random(0)
    path.write_text(first + "".join(f">ctg{i} len=100\n{''.join(rng.choices('ACGT', k=100))}\n" for i in range(n)))


def old_lines(rev: str, d: Path) -> Path:
    """fai_lines.py as it was at git revision `rev`, written into `d`."""
    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "show", f"{rev}:lcft/genomics/fai_lines.py"], cwd=root, capture_output=True,
                         check=True).stdout
    (d / "old_fai_lines.py").write_bytes(src)
    return d / "old_fai_lines.py"


def files(d: Path, mbp: int, n: int, first: str) -> list[tuple[str, Path]]:
    """The three files (labelled), each with `first` before its first record."""
    genome, assembly, packed = d / "genome.fa", d / "assembly.fa", d / "genome.fa.gz"
    write_fasta(genome, mbp * 1_000_000)
    if first:
        genome.write_bytes(first.encode() + genome.read_bytes())
    contigs(assembly, n, first)
    with bgzf.BgzfWriter(str(packed), "wb") as w:  # the genome as BGZF (Biopython's writer: 64 KiB blocks)
        w.write(genome.read_bytes())
    after = ", a ';' line first" if first else ""
    return [(f"genome, {mbp} Mbp in 2 records{after}", genome), (f"assembly, {n:,} contigs{after}", assembly),
            (f"genome, {mbp} Mbp, BGZF (.fai and .gzi){after}", packed)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 Mbp and 20,000 contigs instead of 200 Mbp and 200,000")
    ap.add_argument("--mbp", type=int, default=None, help="genome size in Mbp")
    ap.add_argument("--contigs", type=int, default=None, help="contigs of the assembly")
    ap.add_argument("--repeat", type=int, default=3, help="builds of each (the fastest is kept)")
    ap.add_argument("--comment", action="store_true", help="a ';' comment line first: lcft reads a line at a time")
    ap.add_argument("--old", metavar="REV", help="also lcft with fai_lines.py of git revision REV")
    args = ap.parse_args()
    mbp = args.mbp or (20 if args.quick else 200)
    n = args.contigs or (20_000 if args.quick else 200_000)
    with tempfile.TemporaryDirectory(prefix="lcft-bench-fai-") as tmp:
        d = Path(tmp)
        old = old_lines(args.old, d) if args.old else None
        sides = ["lcft", "pyfaidx"] + ([f"lcft@{args.old}"] if old else [])
        print(f"{'':50}{'wall s':>8}{'CPU s':>8}{'peak MiB':>10}{'x of lcft (wall, CPU)':>23}")
        for label, fasta in files(d, mbp, n, ";c\n" if args.comment else ""):
            runs: dict[str, list[dict]] = {who: [] for who in sides}
            for _ in range(args.repeat):
                for k, who in enumerate(sides):
                    runs[who].append(build(fasta, d / f"side{k}.fai", who, old))
            same = all((d / f"side0{x}").read_bytes() == (d / f"side{k}{x}").read_bytes() for k in range(1, len(sides))
                       for x in ([".fai", ".gzi"] if fasta.suffix == ".gz" else [".fai"]))
            print(f"{label}   same bytes: {same}")
            best = {who: (min(r["wall"] for r in rs), min(r["cpu"] for r in rs), max(r["rss_kib"] for r in rs))
                    for who, rs in runs.items()}
            for who, (wall, cpu, rss) in best.items():
                ratio = "" if who == "lcft" else f"{wall / best['lcft'][0]:11.2f}x{cpu / best['lcft'][1]:9.2f}x"
                print(f"  {who:48}{wall:8.3f}{cpu:8.3f}{rss / 1024:10.0f}{ratio:>23}")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
