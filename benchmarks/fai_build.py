"""Building a FASTA's .fai: lcft's numpy builder (lcft/genomics/fai_build.py) against pyfaidx's, which lcft used for
every file before and still uses for any file not of the plain layout.

Three generated files: a genome of `--mbp` Mbp in two chromosomes wrapped at 60 (benchmarks/prepare.py's generator:
soft-masked, N runs), an assembly of `--contigs` contigs of 100 bases (a header per 101 bytes of bases), and the
genome as BGZF (its .gzi built too). Each
build runs in its own process, alternating, `--repeat` times; prints the fastest of each, the ratio and each
side's peak RSS (VmHWM), and checks that both wrote the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from Bio import bgzf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare import write_fasta  # noqa: E402 (the benchmark's generated genome)

BUILD = """
import json, sys, time
from pathlib import Path
import pyfaidx
from lcft.genomics.fai_build import build_bgzf_index, build_fai
t = time.perf_counter()  # imports done: the build alone
gz = sys.argv[1].endswith(".gz")  # BGZF: a .gzi too
if sys.argv[3] == "lcft":
    fai = Path(sys.argv[2])
    assert build_bgzf_index(Path(sys.argv[1]), fai, fai.with_suffix(".gzi")) if gz else build_fai(Path(sys.argv[1]), fai) is None
else:
    gzi = {"gzi_indexname": sys.argv[2][:-4] + ".gzi"} if gz else {}
    pyfaidx.Faidx(sys.argv[1], indexname=sys.argv[2], **gzi).close()
dt = time.perf_counter() - t
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")]
print(json.dumps({"wall": dt, "rss_kib": hwm[0]}))
"""


def build(fasta: Path, fai: Path, who: str) -> dict:
    fai.unlink(missing_ok=True)
    fai.with_suffix(".gzi").unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-c", BUILD, str(fasta), str(fai), who], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def contigs(path: Path, n: int) -> None:
    rng = random.Random(0)
    path.write_text("".join(f">ctg{i} len=100\n{''.join(rng.choices('ACGT', k=100))}\n" for i in range(n)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 Mbp and 20,000 contigs instead of 200 Mbp and 200,000")
    ap.add_argument("--mbp", type=int, default=None, help="genome size in Mbp")
    ap.add_argument("--contigs", type=int, default=None, help="contigs of the assembly")
    ap.add_argument("--repeat", type=int, default=3, help="builds of each (the fastest is kept)")
    args = ap.parse_args()
    mbp = args.mbp or (20 if args.quick else 200)
    n = args.contigs or (20_000 if args.quick else 200_000)
    with tempfile.TemporaryDirectory(prefix="lcft-bench-fai-") as tmp:
        d = Path(tmp)
        genome, assembly = d / "genome.fa", d / "assembly.fa"
        write_fasta(genome, mbp * 1_000_000)
        contigs(assembly, n)
        packed = d / "genome.fa.gz"  # the genome as BGZF (Biopython's writer: 64 KiB blocks)
        with bgzf.BgzfWriter(str(packed), "wb") as w:
            w.write(genome.read_bytes())
        print(f"{'':44}{'lcft s':>9}{'pyfaidx s':>11}{'ratio':>8}{'lcft MiB':>10}{'pyfaidx MiB':>13}")
        for label, fasta in ((f"genome, {mbp} Mbp in 2 records", genome), (f"assembly, {n:,} contigs", assembly),
                             (f"genome, {mbp} Mbp, BGZF (.fai and .gzi)", packed)):
            ours, theirs = [], []
            for _ in range(args.repeat):
                ours.append(build(fasta, d / "ours.fai", "lcft"))
                theirs.append(build(fasta, d / "theirs.fai", "pyfaidx"))
            same = all((d / f"ours{x}").read_bytes() == (d / f"theirs{x}").read_bytes()
                       for x in ([".fai", ".gzi"] if fasta == packed else [".fai"]))
            a, b = min(ours, key=lambda r: r["wall"]), min(theirs, key=lambda r: r["wall"])
            print(f"{label:44}{a['wall']:9.3f}{b['wall']:11.3f}{b['wall'] / a['wall']:7.1f}x"
                  f"{a['rss_kib'] / 1024:10.0f}{b['rss_kib'] / 1024:13.0f}   same bytes: {same}")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
