"""prepare_windows on the real genome samples, checked against Biopython and a brute-force window count."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from lcft.genomics import decode, open_windows, prepare_windows, verify_windows
from tests.genomics.conftest import bio_records

L = 65536

CASES = {
    # file, train, eval, stride
    "hg38_chr2_softmasked": ("hg38_chr2_1-2333275.fa.gz", ("chr2",), (), L),
    "chr22_internal_N": ("grch37_chr22_20000001-21000000.fa", ("22:20000001-21000000",), (), L // 2 + 8192),
    "ecoli_plain_gzip": ("ecoli_K12_MG1655_NC_000913.3.fna.gz", ("NC_000913.3",), (), L),
    "yeast_one_line": ("sacCer3_chrIV.fa", ("chrIV",), (), 3 * L // 2),
}


def expected_ids(seq: str) -> str:
    """What the token ids must decode to: upper case, every non-ACGT letter as N."""
    return re.sub("[^ACGT]", "N", seq.upper())


def brute_force(seq: str, length: int, stride: int, max_n_frac: float) -> tuple[list[int], int]:
    kept, skipped = [], 0
    for s in range(0, len(seq) - length + 1, stride):
        n = sum(1 for ch in expected_ids(seq[s : s + length]) if ch == "N")
        if n / length > max_n_frac:
            skipped += 1
        else:
            kept.append(s)
    return kept, skipped


@pytest.mark.parametrize("case", list(CASES))
def test_windows_match_biopython(case, genomes_dir, tmp_path):
    name, train, ev, stride = CASES[case]
    fasta = genomes_dir / name
    out = tmp_path / "out"
    m = prepare_windows(fasta=str(fasta), out=str(out), length=L, stride=stride, train=train, eval=ev)
    bio = bio_records(fasta)
    ws = open_windows(out, "train")
    assert ws.length == L and ws.manifest == m
    chrom = train[0]
    seq = bio[chrom]
    kept, skipped = brute_force(seq, L, stride, 0.1)
    assert [ws.coords(i) for i in range(len(ws))] == [(chrom, s, s + L) for s in kept]
    assert m["splits"]["train"]["windows"] == len(kept) and m["splits"]["train"]["skipped_n"] == skipped
    for i in range(len(ws)):
        c, s, e = ws.coords(i)
        ref = seq[s:e]
        assert isinstance(ws[i], np.ndarray) and ws[i].dtype == np.uint8 and ws[i].shape == (L,)
        assert decode(ws[i]) == expected_ids(ref)
        lower = np.frombuffer(ref.encode(), dtype=np.uint8) >= ord("a")
        assert np.array_equal(ws.softmask(i), lower)
        assert decode(ws[i], ws.softmask(i)) == ref.translate(str.maketrans("RYSWKMBDHVryswkmbdhv", "N" * 10 + "n" * 10))
        r = ws.records[i]
        assert r["n_frac"] == pytest.approx(expected_ids(ref).count("N") / L, abs=1e-6)
    verify_windows(out)


def test_softmask_and_n_present_where_expected(genomes_dir, tmp_path):
    """The hg38 piece is 35.6% soft-masked and starts with a 10 kb N telomere: both must show up."""
    out = tmp_path / "o"
    m = prepare_windows(fasta=str(genomes_dir / "hg38_chr2_1-2333275.fa.gz"), out=str(out), length=L,
                        train=("chr2",), eval=(), max_n_frac=0.2)
    ws = open_windows(out, "train")
    assert ws.coords(0) == ("chr2", 0, L)
    assert decode(ws[0][:10000]) == "N" * 10000 and ws.records[0]["n_frac"] == pytest.approx(10000 / L, abs=1e-6)
    frac = np.mean([ws.softmask(i).mean() for i in range(len(ws))])
    assert 0.25 < frac < 0.45
    assert m["splits"]["eval"]["windows"] == 0 and len(open_windows(out, "eval")) == 0


def test_train_and_eval_from_one_file(tmp_path):
    """The bundled sample: chr2 trains, chr22 is held out; records carry their split."""
    from lcft.genomics import sample_fasta

    out = tmp_path / "s"
    m = prepare_windows(fasta=str(sample_fasta()), out=str(out), length="64K", train="chr2", eval="chr22")
    tr, ev = open_windows(out, "train"), open_windows(out, "eval")
    assert len(tr) == m["splits"]["train"]["windows"] > 0 and len(ev) == m["splits"]["eval"]["windows"] > 0
    assert {r["chrom"] for r in tr.records} == {"chr2"} and {r["chrom"] for r in ev.records} == {"chr22"}
    assert (out / "train.bin").stat().st_size == len(tr) * L
    assert (out / "eval.softmask.bin").stat().st_size == len(ev) * L // 8
    assert m["tokenizer"]["vocab_size"] == 16 and m["length"] == L and m["stride"] == L
    assert (out / "prepare.toml").is_file() and not (out / ".partial").exists()


def test_inspect_fasta_matches_documented_counts(genomes_dir):
    """README.txt of the shared genomes: 831,507 soft-masked bases and a 10 kb N run in 2,333,275 bp."""
    from lcft.genomics.inspect import inspect_fasta

    path = genomes_dir / "hg38_chr2_1-2333275.fa.gz"
    (row,) = inspect_fasta(path)
    seq = bio_records(path)["chr2"]
    up = seq.upper()
    assert row["chrom"] == "chr2" and row["length"] == len(seq) == 2_333_275
    assert row["softmask_frac"] == pytest.approx(831_507 / len(seq))
    assert row["n_frac"] == pytest.approx(up.count("N") / len(seq)) and up.count("N") == 10_000
    assert row["gc_frac"] == pytest.approx((up.count("G") + up.count("C")) / (len(seq) - 10_000))


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, lcft.genomics; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_every_finished_chromosome_shows_its_rate(tmp_path, capsys):
    """A model tokenizer reports progress a read (2 Mbp) at a time: the sample's 1 Mbp eval chromosome was one
    update, and its finished bar showed '-- Mbp/s'."""
    from lcft.genomics import sample_fasta

    prepare_windows(fasta=str(sample_fasta()), out=str(tmp_path / "w"), length=8192, train=("chr2",),
                    eval=("chr22",), tokenizer="kmer:4", progress=True)
    bars = [line for line in capsys.readouterr().err.splitlines() if "%" in line]
    assert [line.split()[:2] for line in bars] == [["train", "chr2"], ["eval", "chr22"]], bars
    assert all(re.search(r"100\.0% +\d+\.\d Mbp/s", line) for line in bars), bars


def test_a_finished_chromosome_shows_how_long_it_took(tmp_path, capsys, monkeypatch):
    """Each finished bar ends with the time its chromosome took (every reading of the clock 7 s later): it had
    ended with the time left, 0:00:00, so a log never showed how long a stage took."""
    import itertools

    from lcft.genomics import sample_fasta

    ticks = itertools.count(0, 7)
    monkeypatch.setattr("rich.console.monotonic", lambda: float(next(ticks)))
    prepare_windows(fasta=str(sample_fasta()), out=str(tmp_path / "w"), length=8192, train=("chr2",),
                    eval=("chr22",), progress=True)
    bars = [line for line in capsys.readouterr().err.splitlines() if "%" in line]
    took = [re.fullmatch(r"(\d+):(\d\d):(\d\d)", line.split()[-1]) for line in bars]
    assert len(bars) == 2 and all(took), bars
    assert all(int(t[1]) * 3600 + int(t[2]) * 60 + int(t[3]) >= 7 for t in took), bars


def test_a_fasta_name_the_saved_prepare_toml_cannot_hold_is_refused_before_any_cutting(tmp_path, capsys):
    """A FASTA named with a byte that is not UTF-8: every window was cut and written, with a prepare.toml no
    --config could read back (TOML is Unicode text). Now one line, and --out is not made."""
    from lcft.config import ConfigError
    from lcft.genomics import sample_fasta

    fasta = os.path.join(os.fsencode(tmp_path), b"g\xff.fa")
    with open(sample_fasta(), "rb") as src, open(fasta, "wb") as dst:
        dst.write(src.read())
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        prepare_windows(fasta=os.fsdecode(fasta), out=str(tmp_path / "w"), length=2048, train=("chr2",), eval=())
    assert not (tmp_path / "w").exists()
