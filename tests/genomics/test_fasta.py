"""FastaFile: random-access reads equal Biopython's sequence (plain, BGZF, misnamed, read-only folders)."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pyfaidx
import pytest
from Bio import bgzf

from lcft.errors import LcftError
from lcft.genomics import fasta as fasta_module
from lcft.genomics import prepare_windows, sample_fasta
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_cache import cache_dir
from lcft.genomics.tokenizer import (
    FLAG_GC,
    FLAG_LOWER,
    FLAG_NOT_ACGT,
    ID_BITS,
    A,
    C,
    G,
    T,
    encode,
    encode_lines,
    encode_pieces,
    softmask_bits,
)
from lcft.genomics.windows import chromosome_stats
from tests.genomics.conftest import bio_records, random_genome, write_fasta
from tests.genomics.test_bad_input import bgzf_fasta
from tests.unprivileged import unprivileged


def _random_slices(seq_len: int, n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    out = [(0, seq_len), (seq_len - 1, seq_len), (0, 1), (5, 5)]
    for _ in range(n):
        a = int(rng.integers(0, seq_len))
        out.append((a, int(min(seq_len, a + rng.integers(1, 200_000)))))
    return out


@pytest.mark.parametrize("name", ["hg38_chr2_1-2333275.fa.gz", "lambda_phage_NC_001416.1.fa", "sacCer3_chrIV.fa"])
def test_read_raw_matches_biopython(genomes_dir, name):
    bio = bio_records(genomes_dir / name)
    with FastaFile(genomes_dir / name) as f:
        assert f.names == list(bio)
        for chrom, seq in bio.items():
            assert f.length(chrom) == len(seq)
            for a, b in _random_slices(len(seq), 40, seed=len(seq)):
                assert f.read_raw(chrom, a, b).decode().replace("\n", "") == seq[a:b], (chrom, a, b)


def _pieces_codes(f: FastaFile, chrom: str, a: int, b: int, piece_bytes: int) -> np.ndarray:
    out = np.full(b - a, 255, dtype=np.uint8)
    got = encode_pieces(f.line_pieces(chrom, a, b, piece_bytes), f.line_bytes(chrom)[0], out)
    assert got == b - a
    return out


@pytest.mark.parametrize("name", ["hg38_chr2_1-2333275.fa.gz", "lambda_phage_NC_001416.1.fa", "sacCer3_chrIV.fa"])
def test_line_pieces_encode_like_biopython(genomes_dir, name):
    """The fast path (whole lines translated without deletion, breaks dropped by position) gives the codes
    of Biopython's sequence for random ranges: plain, BGZF, and one-line records."""
    bio = bio_records(genomes_dir / name)
    with FastaFile(genomes_dir / name) as f:
        for chrom, seq in bio.items():
            for a, b in _random_slices(len(seq), 15, seed=len(seq) + 1):
                for piece in (61, 1000, 1 << 18):  # one line per piece, a few, many
                    assert np.array_equal(_pieces_codes(f, chrom, a, b, piece), encode_lines(seq[a:b].encode())), (a, b)


@pytest.mark.parametrize("eol, trailing", [("\n", True), ("\r\n", True), ("\n", False)])
def test_line_pieces_line_endings_and_last_line(tmp_path, eol, trailing):
    """CRLF files, and a last line that fills its width with no line break before the end of the file."""
    recs = {"a": random_genome(1, 60 * 500), "b": random_genome(2, 60 * 700 + 17)}
    path = write_fasta(tmp_path / "x.fa", recs, eol=eol)
    if not trailing:
        path.write_bytes(path.read_bytes()[: -len(eol)])
    with FastaFile(path) as f:
        for chrom, seq in recs.items():
            n = len(seq)
            for a, b in [(0, n), (1, n), (59, n - 1), (60, 120 * 60), (n - 200, n), (7, 7 + 2 * 60 + 1)]:
                assert np.array_equal(_pieces_codes(f, chrom, a, b, 600), encode_lines(seq[a:b].encode())), (a, b)


def test_file_changed_after_indexing_is_an_error(tmp_path):
    seq = random_genome(3, 60 * 400)
    path = write_fasta(tmp_path / "x.fa", {"c": seq})
    with FastaFile(path):
        pass  # index it
    stamp = path.stat().st_mtime
    data = bytearray(path.read_bytes())
    del data[3 + 61 * 200 + 5]  # one base fewer inside line 201: every later line break moves
    path.write_bytes(bytes(data) + b"A")  # same size, and the old mtime: the index looks current
    os.utime(path, (stamp, stamp))
    # the record no longer ends where the index says: indexed again, which finds the short line
    with pytest.raises(LcftError, match=r"record 'c' has inconsistent line lengths \(pyfaidx reports \(201, 60\)"):
        FastaFile(path)


def replaced_keeping_mtime(path, recs: dict[str, str], width: int = 60) -> None:
    """Write `recs` over `path` with a modification time older than its index (as `cp -p` of an older file)."""
    stamp = path.stat().st_mtime - 100
    write_fasta(path, recs, width=width)
    os.utime(path, (stamp, stamp))


@pytest.mark.parametrize("change", ["grown", "shifted", "shrunk"])
@pytest.mark.parametrize("readonly", [False, True])
def test_index_newer_than_a_replaced_fasta_is_built_again(tmp_path, change, readonly):
    """Oracle: Biopython reads the new file. grown: the first record longer (every later offset moves); shifted:
    the first record's header longer by a whole line; shrunk: the last record shorter."""
    old = {"a": random_genome(1, 12_000), "b": random_genome(2, 9_000)}
    new = {"grown": {"a": random_genome(1, 18_000), "b": old["b"]},
           "shifted": {"a" + " x" * 30: old["a"], "b": old["b"]},
           "shrunk": {"a": old["a"], "b": old["b"][:6_000]}}[change]
    folder = tmp_path / "g"
    folder.mkdir()
    path = write_fasta(folder / "x.fa", old)
    with FastaFile(path):
        pass  # its .fai beside it
    replaced_keeping_mtime(path, new)
    want = bio_records(path)
    if readonly:
        folder.chmod(0o555)
    try:
        with FastaFile(path) as f:
            assert {n: f.length(n) for n in f.names} == {n: len(q) for n, q in want.items()}
            for n, q in want.items():
                assert f.read_raw(n, 0, len(q)).replace(b"\n", b"").decode() == q
    finally:
        folder.chmod(0o755)


def test_shared_folder_is_left_untouched(genomes_dir):
    """The shared genomes folder is read-only (r-x): indexes go to the cache, even for root."""
    before = sorted(p.name for p in genomes_dir.iterdir())
    with FastaFile(genomes_dir / "human_chrM_GRCh38_ensembl_dna_sm.fa") as f:
        assert str(f.indexname).startswith(str(cache_dir()))
    assert sorted(p.name for p in genomes_dir.iterdir()) == before


def test_chromosome_stats_brute_force(genomes_dir):
    path = genomes_dir / "human_chrM_GRCh38_ensembl_dna_sm.fa"
    seq = bio_records(path)["MT"]
    with FastaFile(path) as f:
        s = chromosome_stats(f, "MT", chunk=1000)  # many chunks on purpose
    acgt = sum(seq.upper().count(c) for c in "ACGT")
    assert s["length"] == 16569 and s["n_frac"] == pytest.approx(1 / 16569)
    assert s["softmask_frac"] == pytest.approx(177 / 16569)
    assert s["gc_frac"] == pytest.approx((seq.upper().count("G") + seq.upper().count("C")) / acgt)


def test_encode_lines_is_the_tokenizer_lut():
    raw = bytes(range(256)) + b"ACGTNacgtnRYry\r\n\n"
    coded = encode_lines(raw)
    kept = np.frombuffer(raw, np.uint8)[~np.isin(np.frombuffer(raw, np.uint8), [10, 13])]
    ids = encode(kept)
    assert np.array_equal(coded & ID_BITS, ids)
    assert np.array_equal((coded & FLAG_LOWER) != 0, softmask_bits(kept))
    assert np.array_equal((coded & FLAG_GC) != 0, np.isin(ids, [C, G]))
    assert np.array_equal((coded & FLAG_NOT_ACGT) != 0, ~np.isin(ids, [A, C, G, T]))


def test_content_decides_not_the_name(tmp_path):
    """pyfaidx chooses its reader from the suffix; a BGZF file named .fa and a plain FASTA named .gz work."""
    seq = random_genome(7, 50_000)
    plain = write_fasta(tmp_path / "p.fa", {"c1": seq})
    misnamed_bgzf = tmp_path / "b.fa"
    with bgzf.BgzfWriter(str(misnamed_bgzf), "wb") as w:
        w.write(plain.read_bytes())
    misnamed_plain = tmp_path / "x.fa.gz"
    shutil.copy(plain, misnamed_plain)
    for p in (misnamed_bgzf, misnamed_plain):
        with FastaFile(p) as f:
            assert f.read_raw("c1", 0, 50_000).decode().replace("\n", "") == seq


def test_read_only_sample_copy_prepares(tmp_path):
    """An installed package folder may be read-only and its index stale: the index goes to the cache."""
    ro = tmp_path / "pkg"
    ro.mkdir()
    shutil.copy(sample_fasta(), ro / "human_sample.fa.gz")  # no .fai/.gzi beside it
    ro.chmod(0o555)
    try:
        m = prepare_windows(fasta=str(ro / "human_sample.fa.gz"), out=str(tmp_path / "o"), length="256K",
                            train="chr2", eval="chr22")
        assert sorted(p.name for p in ro.iterdir()) == ["human_sample.fa.gz"]
    finally:
        ro.chmod(0o755)
    ref = prepare_windows(fasta=str(sample_fasta()), out=str(tmp_path / "r"), length="256K", train="chr2",
                          eval="chr22")
    assert m["splits"] == ref["splits"] and m["records"] == ref["records"]


def test_read_only_folder_with_stale_indexes(tmp_path):
    """A fresh clone or an install can leave .fai/.gzi older than the FASTA; in a read-only folder pyfaidx
    would try to rebuild them in place, so lcft indexes into the cache instead."""
    ro = tmp_path / "pkg"
    ro.mkdir()
    for suffix in ("", ".fai", ".gzi"):
        shutil.copy(str(sample_fasta()) + suffix, ro / ("human_sample.fa.gz" + suffix))
    os.utime(ro / "human_sample.fa.gz.gzi", (1, 1))  # stale
    ro.chmod(0o555)
    try:
        with FastaFile(ro / "human_sample.fa.gz") as f:
            assert f.names == ["chr2", "chr22"] and str(f.indexname).startswith(str(cache_dir()))
            assert f.read_raw("chr22", 0, 60) == bio_records(sample_fasta())["chr22"][:60].encode()
        assert (ro / "human_sample.fa.gz.gzi").stat().st_mtime == 1  # left alone (root could write there)
    finally:
        ro.chmod(0o755)


def test_bundled_sample_is_the_documented_copy(genomes_dir):
    """chr2 is the hg38 piece unchanged; chr22 is the GRCh37 piece with only its header renamed."""
    bundled = bio_records(sample_fasta())
    assert bundled["chr2"] == bio_records(genomes_dir / "hg38_chr2_1-2333275.fa.gz")["chr2"]
    assert bundled["chr22"] == bio_records(genomes_dir / "grch37_chr22_20000001-21000000.fa")["22:20000001-21000000"]
    assert sample_fasta().stat().st_size < 2_000_000
    assert gzip.decompress(sample_fasta().read_bytes()).startswith(b">chr2\n")


def index_builds(monkeypatch) -> list[str]:
    """The .fai files built from now on (one per index): by lcft's builder, or pyfaidx's (a damaged BGZF)."""
    built, real, ours = [], pyfaidx.Faidx.build_index, fasta_module.build_fai

    def build(self, *a, **kw):
        built.append(self.indexname)
        return real(self, *a, **kw)

    def build_ours(fasta, fai):
        ours(fasta, fai)
        built.append(str(fai))

    monkeypatch.setattr(pyfaidx.Faidx, "build_index", build)
    monkeypatch.setattr(fasta_module, "build_fai", build_ours)
    return built


@pytest.mark.parametrize("header", [">a desc", "> a", ">a\tdesc"])
def test_an_index_that_fits_is_not_built_again(tmp_path, monkeypatch, header):
    """pyfaidx names a record by the first word after '>', blanks after '>' allowed."""
    path = tmp_path / "x.fa"
    seq = random_genome(1, 5_000)
    path.write_text(f"{header}\n" + "".join(seq[i : i + 60] + "\n" for i in range(0, len(seq), 60)))
    with FastaFile(path):
        pass
    built = index_builds(monkeypatch)
    for _ in range(2):
        with FastaFile(path) as f:
            assert f.names == ["a"] and f.length("a") == len(seq)
    assert built == []


def test_an_empty_index_newer_than_its_fasta_is_built_again(tmp_path):
    """pyfaidx truncates its .fai before writing it: a kill in between leaves it empty and newer."""
    path = write_fasta(tmp_path / "x.fa", {"a": random_genome(1, 3_000)})
    Path(str(path) + ".fai").write_text("")
    with FastaFile(path) as f:
        assert f.length("a") == 3_000


@pytest.mark.parametrize("field, value", [(1, "-10"), (2, "-1"), (3, "-60"), (4, "-61"), (3, "0"), (4, "70"),
                                          (2, str(1 << 64)), (1, str(1 << 62))])
def test_an_index_with_impossible_numbers_is_built_again(tmp_path, field, value):
    """pyfaidx takes any integers from a .fai it reuses (a negative length made a read of -1 bytes: OSError,
    found by fuzzing): one that no FASTA has is not the file's index. Oracle: Biopython."""
    path = write_fasta(tmp_path / "x.fa", {"a": random_genome(1, 3_000), "b": random_genome(2, 500)})
    with FastaFile(path):
        pass
    fai = Path(str(path) + ".fai")
    rows = [line.split("\t") for line in fai.read_text().splitlines()]
    rows[0][field] = value
    fai.write_text("".join("\t".join(r) + "\n" for r in rows))
    with FastaFile(path) as f:
        for name, seq in bio_records(path).items():
            assert f.read_raw(name, 0, len(seq)).replace(b"\n", b"").decode() == seq


@pytest.mark.parametrize("garble", [lambda t: b"\x80" + t, lambda t: b"\r" + t[1:], lambda t: t.replace(b"\t", b" ", 1),
                                    lambda t: t + b"\n", lambda t: t + t, lambda t: t.replace(b"3000", b"3e3", 1),
                                    lambda t: t.replace(b"3000", b"9" * 5000, 1)],
                         ids=["not-utf8", "cr-first", "four-fields", "blank-line", "names-twice", "not-integer",
                              "5000-digits"])
def test_an_index_pyfaidx_cannot_read_is_built_again(tmp_path, garble):
    """Found by fuzzing with the reads checked against Biopython: pyfaidx's ValueError reading a garbled .fai was
    reported as the FASTA's fault ('record names must be unique'), though the FASTA was sound."""
    path = write_fasta(tmp_path / "x.fa", {"a": random_genome(1, 3_000), "b": random_genome(2, 500)})
    with FastaFile(path):
        pass
    fai = Path(str(path) + ".fai")
    fai.write_bytes(garble(fai.read_bytes()))
    with FastaFile(path) as f:
        for name, seq in bio_records(path).items():
            assert f.read_raw(name, 0, len(seq)).replace(b"\n", b"").decode() == seq


def _gzi(entries: list[tuple[int, int]], count: int | None = None) -> bytes:
    return struct.pack("<Q", len(entries) if count is None else count) + b"".join(
        struct.pack("<QQ", c, u) for c, u in entries)


GZI_DAMAGE = {  # each: a .gzi beside a sound BGZF FASTA, newer than it (pyfaidx reads it as it is)
    "cut": lambda e: _gzi(e)[:-5],  # struct.error: reported as a corrupt FASTA
    "count-over": lambda e: _gzi(e, count=len(e) + 1),
    "count-huge": lambda e: _gzi(e, count=1 << 60),
    "past-the-file": lambda e: _gzi([*e[:-1], (1 << 40, e[-1][1])]),  # an invalid seek: OSError
    "not-increasing": lambda e: _gzi([e[1], e[0], *e[2:]]),
    "shifted-inside": lambda e: _gzi([(e[0][0] + 7, e[0][1]), *e[1:]]),  # fits every bound: a read fails
    "empty": lambda e: b"",
}


@pytest.mark.parametrize("damage", list(GZI_DAMAGE))
def test_a_gzi_that_does_not_describe_its_bgzf_is_built_again(tmp_path, damage):
    """Found by fuzzing the .gzi (a start past the file: OSError from the seek). Oracle: Biopython reads the
    BGZF as gzip."""
    path = bgzf_fasta(tmp_path / "x.fa.gz", {"a": random_genome(1, 150_000), "b": random_genome(2, 90_000)})
    with FastaFile(path):
        pass
    gzi = Path(str(path) + ".gzi")
    data = gzi.read_bytes()
    entries = list(struct.iter_unpack("<QQ", data[8:]))
    assert len(entries) >= 3
    gzi.write_bytes(GZI_DAMAGE[damage](entries))
    for index in (gzi, Path(str(path) + ".fai")):
        os.utime(index)  # newer than the FASTA: pyfaidx would read it without looking at the file
    with FastaFile(path) as f:
        for name, seq in bio_records(path).items():
            assert f.read_raw(name, 0, len(seq)).replace(b"\n", b"").decode() == seq
    assert gzi.read_bytes() == data  # built again, as bgzip would


@pytest.mark.parametrize("name,index", [("x.fa", ".fai"), ("x.fa.gz", ".fai"), ("x.fa.gz", ".gzi")])
@pytest.mark.parametrize("thing", ["fifo", "link to /dev/zero", "folder"])
def test_an_index_name_that_is_not_a_file_is_never_read(tmp_path, name, index, thing):
    """A FIFO under the index's name blocked pyfaidx's read forever; a link to /dev/zero was written through
    and read back without end: each is replaced by a built index. A folder there cannot be replaced: one line
    naming it."""
    records = {"a": random_genome(1, 20_000), "b": random_genome(2, 900)}
    path = (bgzf_fasta if name.endswith(".gz") else write_fasta)(tmp_path / name, records)
    where = Path(str(path) + index)
    if thing == "fifo":
        os.mkfifo(where)
    elif thing == "folder":
        where.mkdir()
        with pytest.raises(LcftError, match=rf"{name}{index}: cannot replace this index of .*{name} \(Is a "
                                            r"directory\); remove it$"):
            FastaFile(path)
        return
    else:
        where.symlink_to("/dev/zero")
    with FastaFile(path) as f:
        for name, seq in bio_records(path).items():
            assert f.read_raw(name, 0, len(seq)).replace(b"\n", b"").decode() == seq
    assert where.is_file() and not where.is_symlink()


READ_A = """
import sys
from lcft.genomics.fasta import FastaFile
with FastaFile(sys.argv[1]) as f:
    print(f.read_raw("a", 0, 8).decode())
"""


@pytest.mark.parametrize("name,index", [("x.fa", ".fai"), ("x.fa.gz", ".fai"), ("x.fa.gz", ".gzi")])
def test_an_index_this_user_cannot_read_is_built_again(tmp_path, name, index):
    """An index of mode 0 (another owner's, say) in a folder this user may write: its check read it whole and
    raised PermissionError, a traceback; now it is built again, as a garbled one is."""
    records = {"a": random_genome(1, 20_000), "b": random_genome(2, 900)}
    path = (bgzf_fasta if name.endswith(".gz") else write_fasta)(tmp_path / name, records)
    with FastaFile(path):
        pass
    where = Path(str(path) + index)
    built = where.read_bytes()
    where.chmod(0)
    r = unprivileged([sys.executable, "-c", READ_A, str(path)])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.split() == [records["a"][:8]]
    assert where.read_bytes() == built and where.stat().st_mode & 0o444


def test_a_read_only_folders_stale_index_is_built_once_in_the_cache(tmp_path, monkeypatch):
    folder = tmp_path / "g"
    folder.mkdir()
    path = write_fasta(folder / "x.fa", {"a": random_genome(1, 12_000)})
    with FastaFile(path):
        pass
    replaced_keeping_mtime(path, {"a": random_genome(1, 18_000)})
    folder.chmod(0o555)
    built = index_builds(monkeypatch)
    try:
        for _ in range(3):
            with FastaFile(path) as f:
                assert f.length("a") == 18_000
    finally:
        folder.chmod(0o755)
    assert len(built) == 1 and built[0].startswith(str(cache_dir()))


def test_blanks_ending_the_lines_of_a_later_record_are_not_bases(tmp_path):
    """The first 64 KiB are clean; the second record's lines end in a space. Oracle: Biopython."""
    recs = {"a": random_genome(1, 80_000, n_runs=0), "b": random_genome(2, 600, n_runs=0)}
    text = write_fasta(tmp_path / "clean.fa", {"a": recs["a"]}).read_text()
    text += ">b\n" + "".join(recs["b"][i : i + 60] + " \n" for i in range(0, 600, 60))
    path = tmp_path / "x.fa"
    path.write_text(text)
    assert bio_records(path) == recs
    with FastaFile(path) as f:
        assert f.length("b") == 600
        assert f.read_raw("b", 0, 600).replace(b"\n", b"").decode() == recs["b"]


@pytest.mark.parametrize("where", ["between records", "at the end", "both"])
@pytest.mark.parametrize("stale_index", [False, True], ids=["fresh", "stale-index"])
def test_two_blank_lines_after_a_full_last_line_read_as_biopython_reads_them(tmp_path, where, stale_index):
    """pyfaidx refuses exactly two blank lines after a record whose last line is full ("Unhandled exception during
    fasta indexing"), where one or three pass: read through the normalized copy, as other blank lines are.
    Oracle: Biopython. stale-index: an index newer than the file, of another file, is built again the same way."""
    recs = {"a": random_genome(3, 3_000, n_runs=0), "b": random_genome(4, 1_800, n_runs=0)}  # 50 and 30 full lines
    a, b = (write_fasta(tmp_path / f"{k}.fa", {k: v}).read_text() for k, v in recs.items())
    text = a + ("\n\n" if where != "at the end" else "") + b + ("\n\n" if where != "between records" else "")
    path = tmp_path / "x.fa"
    path.write_text(text)
    if stale_index:
        other = write_fasta(tmp_path / "other.fa", recs)
        with FastaFile(other):
            pass
        shutil.copyfile(str(other) + ".fai", str(path) + ".fai")  # newer than x.fa: pyfaidx would keep it
    assert bio_records(path) == recs
    with FastaFile(path) as f:
        assert f.names == list(recs)
        for name, seq in recs.items():
            assert f.length(name) == len(seq)
            assert f.read_raw(name, 0, len(seq)).replace(b"\n", b"").decode() == seq
