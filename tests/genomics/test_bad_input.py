"""Every bad input of lcft prepare: a one-line LcftError, and nothing half-written in the output folder."""

from __future__ import annotations

import errno
import gzip
import os
import re

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.genomics import decode, open_windows, prepare_windows
from lcft.genomics.fasta_cache import cache_dir
from lcft.genomics.shards import HashedFile
from tests.genomics.conftest import bio_records, random_genome, write_fasta
from tests.one_line import cli_fails

L = 4096


def run(fasta, out, **kw):
    kw.setdefault("length", L)
    kw.setdefault("train", ("c1",))
    kw.setdefault("eval", ())
    return prepare_windows(fasta=str(fasta), out=str(out), **kw)


def fails(match, fasta, out, **kw) -> str:
    with pytest.raises(LcftError, match=match) as e:
        run(fasta, out, **kw)
    msg = str(e.value)
    assert "\n" not in msg
    assert not out.exists() or not any(out.iterdir()), f"left behind: {list(out.iterdir())}"
    return msg


@pytest.fixture
def good(tmp_path):
    return write_fasta(tmp_path / "g.fa", {"c1": random_genome(1, 5 * L), "c2": random_genome(2, 3 * L)})


def test_missing_file(tmp_path):
    fails("FASTA not found", tmp_path / "nope.fa", tmp_path / "out")


def test_a_folder_or_an_index_given_as_the_fasta_says_what_to_give(good, tmp_path):
    """A windows folder, and the FASTA's own .fai, given as --fasta (had been 'not a file: PATH' and 'does not
    start with >')."""
    (tmp_path / "windows").mkdir()
    fails(f"FASTA {tmp_path / 'windows'} is a folder: give the FASTA file itself", tmp_path / "windows",
          tmp_path / "out")
    run(good, tmp_path / "first")  # indexes it: g.fa.fai beside it
    fails(f"FASTA {good}.fai is the index of {good}: give that file", f"{good}.fai", tmp_path / "out")


@pytest.mark.parametrize(("names", "given", "said"), [
    (("1", "2", "X"), ("chr1", "chrx"), "chromosome chr1 (did you mean '1'?), chrx (did you mean 'X'?) not found"),
    (("chr1", "chr2"), ("1",), "chromosome 1 (did you mean 'chr1'?) not found"),
    (("gi|9626243|ref|NC_001416.1|",), ("NC_001416",), "chromosome NC_001416 (did you mean "
                                                         "'gi|9626243|ref|NC_001416.1|'?) not found"),
    (("scaffold_12", "scaffold_13"), ("scafold_12",), "chromosome scafold_12 (did you mean 'scaffold_12'?)"),
    (("c1", "c2"), ("mito",), "chromosome mito not found"),
    (("1", "MT"), ("chrM",), "chromosome chrM (did you mean 'MT'?) not found"),  # hg38's name, an Ensembl FASTA
    (("chr1", "chrM"), ("MT",), "chromosome MT (did you mean 'chrM'?) not found"),  # and the other way round
    # hg38's contigs against Ensembl's names for them (GenBank accessions), both ways
    (("1", "KI270302.1", "KI270706.1"), ("chrUn_KI270302v1", "chr1_KI270706v1_random"),
     "chromosome chrUn_KI270302v1 (did you mean 'KI270302.1'?), chr1_KI270706v1_random (did you mean 'KI270706.1'?)"),
    (("chr1", "chrUn_GL000195v1", "chr19_GL000209v2_alt"), ("GL000195.1", "GL000209.2"),
     "chromosome GL000195.1 (did you mean 'chrUn_GL000195v1'?), GL000209.2 (did you mean 'chr19_GL000209v2_alt'?)"),
])
def test_a_chromosome_not_found_names_what_was_likely_meant(tmp_path, names, given, said):
    """UCSC against Ensembl names (the mitochondrion's too: chrM, MT; contigs: chrUn_KI270302v1, KI270302.1), an accession inside an NCBI name, a typo: the
    record meant is named."""
    fasta = write_fasta(tmp_path / "g.fa", {n: random_genome(i, L) for i, n in enumerate(names)})
    msg = fails(re.escape(said), fasta, tmp_path / "out", train=given)
    assert ("did you mean" in msg) == (given != ("mito",))  # nothing close: no guess


def test_not_fasta(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("chromosome,start\nchr1,5\n")
    fails("not a FASTA file", p, tmp_path / "out")


def test_binary_not_fasta(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(bytes(range(256)) * 4)
    fails("not a FASTA file", p, tmp_path / "out")


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b";only a comment\n"])
def test_empty_fasta(tmp_path, content):
    p = tmp_path / "e.fa"
    p.write_bytes(content)
    fails("empty FASTA", p, tmp_path / "out")


def test_header_without_sequence(tmp_path):
    p = tmp_path / "h.fa"
    p.write_text(">c1\n")
    fails("c1", p, tmp_path / "out")


def test_plain_gzip_is_decompressed_to_the_cache(tmp_path, good):
    gz = tmp_path / "plain.fa.gz"
    gz.write_bytes(gzip.compress(good.read_bytes()))
    a = run(gz, tmp_path / "a")
    b = run(good, tmp_path / "b")
    assert a["source"]["compression"] == "gzip"
    assert a["splits"] == b["splits"]
    assert list((cache_dir() / "fasta").glob("*-plain.fa")), "plain gzip should be decompressed once into $LCFT_CACHE"


def test_short_line_then_unterminated_last_line(tmp_path):
    """pyfaidx raises a bare RuntimeError ("Unhandled exception during fasta indexing") for this shape."""
    p = tmp_path / "odd.fa"
    p.write_text(">c1\nACGTACGTAC\nACGTACGTA\nACGTACGTAC\nA")
    msg = fails("inconsistent line lengths", p, tmp_path / "out")
    assert "'c1'" in msg and "seqkit" in msg


def test_inconsistent_line_lengths_names_record_and_line(tmp_path):
    p = tmp_path / "bad.fa"
    p.write_text(">ok\n" + "ACGT" * 5 + "\n" + ">c1\nACGTACGTAC\nACGTACGTAC\nACGTAC\nACGTACGTAC\nACG\n")
    msg = fails("inconsistent line lengths", p, tmp_path / "out")
    assert "'c1'" in msg and "line 6" in msg  # the 6-base line is the 6th line of the file


def test_duplicate_record_names(tmp_path):
    p = write_fasta(tmp_path / "dup.fa", {"c1": "ACGT" * 10})
    p.write_text(p.read_text() * 2)
    fails("record names must be unique", p, tmp_path / "out")


def test_a_record_name_is_shown_not_run_in_the_error(tmp_path):
    """pyfaidx quotes the duplicate name as the file has it; a terminal escape in it reaches the one-line error
    escaped (here, ESC [2J would clear the user's screen), through the library and the CLI alike."""
    from tests.one_line import cli_fails

    p = write_fasta(tmp_path / "dup.fa", {"c1\x1b[2J": "ACGT" * 10})
    p.write_text(p.read_text() * 2)
    msg = fails("record names must be unique", p, tmp_path / "out")
    assert "c1\\x1b[2J" in msg and msg.isprintable()
    line = cli_fails(["prepare", "inspect", str(p)], "record names must be unique", "c1\\x1b[2J")
    assert "\x1b" not in line


def test_chromosome_not_found_lists_names(good, tmp_path):
    msg = fails("chromosome chrX not found", good, tmp_path / "out", train=("chrX",))
    assert "available: c1, c2" in msg


def test_same_chromosome_in_train_and_eval(good, tmp_path):
    fails("c1 is in both --train and --eval", good, tmp_path / "out", train=("c1", "c2"), eval=("c1",))


def test_window_longer_than_every_chromosome(good, tmp_path):
    fails("longer than every train chromosome", good, tmp_path / "out", length=6 * L, train=("c1", "c2"))


def test_length_must_be_multiple_of_8(good, tmp_path):
    fails("multiple of 8", good, tmp_path / "out", length=L + 4)


def test_no_window_left_after_n_filter(tmp_path):
    p = write_fasta(tmp_path / "n.fa", {"c1": "N" * (3 * L) + "ACGT" * 100})
    fails("no train window left after the N filter", p, tmp_path / "out")


def test_a_refused_run_removes_the_folders_it_made(tmp_path):
    """`--out` under missing folders, refused once the cut is done: none of the folders it made is left; the
    folder that existed before stays (had left new/ and new/deeper/)."""
    p = write_fasta(tmp_path / "n.fa", {"c1": "N" * (3 * L) + "ACGT" * 100})
    res = CliRunner().invoke(app, ["prepare", "windows", "--fasta", str(p), "--out", str(tmp_path / "new/deeper/out"),
                                   "--length", str(L), "--train", "c1", "--eval", ""])  # (its progress bar shown)
    assert res.exit_code == 1 and res.output.splitlines()[-1].startswith("error: no train window left"), res.output
    assert sorted(os.listdir(tmp_path)) == ["n.fa", "n.fa.fai"]


def test_output_folder_not_creatable(good, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LcftError, match=f"^--out {blocker / 'out'}: {blocker} is a file, not a folder$"):
        run(good, blocker / "out")  # (mkdir said 'Not a directory')
    with pytest.raises(LcftError, match="not a folder"):
        run(good, blocker)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_output_folder_read_only(good, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(LcftError, match="cannot write to output folder"):
            run(good, ro / "out")
    finally:
        ro.chmod(0o755)


def test_disk_full_then_resume(good, tmp_path, monkeypatch):
    """ENOSPC from the OS on the 3rd write: a one-line error, no final file; after 'freeing space' the same
    command resumes and the result equals a clean run byte for byte."""
    real_write, calls = HashedFile.append, {"n": 0}

    def full_disk(self, data, sync_every=0):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, data, sync_every)

    out = tmp_path / "out"
    monkeypatch.setattr(HashedFile, "append", full_disk)
    with pytest.raises(LcftError, match="No space left on device") as e:
        run(good, out, train=("c1",), eval=("c2",))
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in out.iterdir()) == [".partial"]
    monkeypatch.setattr(HashedFile, "append", real_write)
    run(good, out, train=("c1",), eval=("c2",))
    run(good, tmp_path / "clean", train=("c1",), eval=("c2",))
    for name in ("train.bin", "train.softmask.bin", "eval.bin", "eval.softmask.bin", "manifest.json"):
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name


def test_windows_line_endings(tmp_path):
    recs = {"c1": random_genome(3, 3 * L + 77)}
    unix = write_fasta(tmp_path / "u.fa", recs, width=70)
    dos = write_fasta(tmp_path / "d.fa", recs, width=70, eol="\r\n")
    assert b"\r\n" in dos.read_bytes()
    run(unix, tmp_path / "ou", max_n_frac=1.0)
    run(dos, tmp_path / "od", max_n_frac=1.0)
    a, b = open_windows(tmp_path / "ou", "train"), open_windows(tmp_path / "od", "train")
    assert len(a) == len(b) == 3
    for i in range(3):
        assert (a[i] == b[i]).all() and (a.softmask(i) == b.softmask(i)).all()
        _, s, e = b.coords(i)
        assert decode(b[i], b.softmask(i)) == recs["c1"][s:e]


@pytest.mark.parametrize("eol", ["\r\n", "\r"])
def test_line_endings_pyfaidx_needs_help_with(tmp_path, eol):
    """CRLF with blank lines (pyfaidx rejects them as inconsistent) and old-Mac CR-only line ends (pyfaidx
    would read each record as one line): indexed from a normalized copy in the cache."""
    recs = {"c1": random_genome(4, 2 * L + 50), "c2": random_genome(5, L + 7)}
    text = "".join(f">{n} desc{eol}" + eol.join(q[i : i + 60] for i in range(0, len(q), 60)) + eol + eol
                   for n, q in recs.items())
    p = tmp_path / "w.fa"
    p.write_bytes(text.encode())
    run(p, tmp_path / "o", train=("c1",), eval=("c2",), max_n_frac=1.0)
    bio = bio_records(p)
    assert bio == recs
    for split, chrom in (("train", "c1"), ("eval", "c2")):
        ws = open_windows(tmp_path / "o", split)
        assert len(ws) == len(recs[chrom]) // L
        for i in range(len(ws)):
            _, s, e = ws.coords(i)
            assert decode(ws[i], ws.softmask(i)) == bio[chrom][s:e]


def test_iupac_codes_become_n(tmp_path):
    core = "ACGTRYSWKMBDHVNacgtryswkmbdhvn"
    seq = (core * (L // len(core) + 1))[:L]
    p = write_fasta(tmp_path / "i.fa", {"c1": seq})
    run(p, tmp_path / "o", max_n_frac=1.0)
    ws = open_windows(tmp_path / "o", "train")
    want = "".join(c if c.upper() in "ACGT" else ("n" if c.islower() else "N") for c in seq)
    assert decode(ws[0], ws.softmask(0)) == want
    assert bio_records(p)["c1"] == seq  # the oracle read the file as written


@pytest.mark.parametrize("where", ["tokenizer", "files", "split"])
@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "sub/tokenizer.json", ".."])
def test_manifest_naming_a_file_outside_the_folder_is_refused(good, tmp_path, where, name):
    """manifest.json's tokenizer.file (or a listed file) pointing outside the folder: `prepare verify` and
    opening the windows refuse it in one line naming it; nothing outside is read."""
    import json

    from lcft.genomics import verify_windows

    out = tmp_path / "out"
    run(good, out, tokenizer="kmer:3", length=1024, max_n_frac=1.0)
    path = out / "manifest.json"
    m = json.loads(path.read_text())
    if where == "tokenizer":
        m["tokenizer"]["file"] = name
    elif where == "files":
        m["files"][name] = m["files"].pop(next(iter(m["files"])))
    else:
        files = m["splits"]["train"]["files"]
        files[name] = files.pop("train.bin")
    path.write_text(json.dumps(m))
    for read in (verify_windows, lambda d: open_windows(d, "train").tokenizer):
        with pytest.raises(LcftError) as e:
            read(out)
        assert repr(name) in str(e.value) and "refused" in str(e.value) and "\n" not in str(e.value)


MANIFEST_DAMAGE = {  # each: a field a reader uses, gone or of another kind (KeyError or TypeError before)
    "no-tokenizer": lambda m: m.pop("tokenizer"),  # opening the windows' tokenizer
    "vocab-size-text": lambda m: m["tokenizer"].__setitem__("vocab_size", "74"),  # a training run sizes by it
    "sha256-number": lambda m: m["tokenizer"].__setitem__("sha256", 5),  # compared with, and shown in errors
    "no-source": lambda m: m.pop("source"),  # lcft prepare inspect
    "no-stride": lambda m: m.pop("stride"),
    "chrom-entry": lambda m: m["chroms"][0].pop("length"),
    "split-chroms": lambda m: m["splits"]["train"].__setitem__("chroms", [1, 2]),
    "split-windows": lambda m: m["splits"]["eval"].pop("windows"),
    "split-files": lambda m: m["splits"]["train"].pop("files"),  # found by fuzzing: KeyError in prepare verify
}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_a_manifest_missing_what_readers_use_is_one_line(good, tmp_path, damage):
    """Found by fuzzing manifest.json (a deleted 'tokenizer': KeyError when the windows' tokenizer was read): the
    fields readers compute with are checked when the manifest is read, for every reader."""
    import json

    from lcft.genomics import verify_windows

    out = tmp_path / "out"
    run(good, out, tokenizer="kmer:3", length=1024, max_n_frac=1.0)
    path = out / "manifest.json"
    m = json.loads(path.read_text())
    MANIFEST_DAMAGE[damage](m)
    path.write_text(json.dumps(m))
    for read in (verify_windows, lambda d: open_windows(d, "train").tokenizer):
        with pytest.raises(LcftError) as e:
            read(out)
        assert str(path) in str(e.value) and "corrupt manifest" in str(e.value) and "\n" not in str(e.value)
    cli_fails(["prepare", "inspect", str(out)], str(path), "corrupt manifest")


@pytest.mark.parametrize("options, said", [
    (lambda o: [1, 2], "different format_version (--format_version: was None, now 1)"),
    (lambda o: {**o, "fasta": {"sha256": 5}}, "different fasta (--fasta: was sha256 5, now sha256 "),
    (lambda o: {**o, "fasta": "\x1b[2J"}, "different fasta (--fasta: was '\\x1b[2J', now sha256 ")])
def test_a_manifest_recording_options_of_other_kinds_is_one_line_on_prepare(good, tmp_path, options, said):
    """Preparing into a folder that holds windows: its manifest's recorded options (any JSON) are compared and
    shown, one printable line (a list was an AttributeError, a numeric sha256 a TypeError)."""
    import json

    out = tmp_path / "out"
    run(good, out)
    path = out / "manifest.json"
    m = json.loads(path.read_text())
    path.write_text(json.dumps({**m, "options": options(m["options"])}))
    with pytest.raises(LcftError) as e:
        run(good, out)
    msg = str(e.value)
    assert "already holds windows prepared with a " + said in msg and msg.isprintable(), msg


def bgzf_fasta(path, recs: dict[str, str]):
    from Bio import bgzf

    with bgzf.BgzfWriter(str(path), "wb") as w:
        for name, seq in recs.items():
            w.write(f">{name}\n" + "\n".join(seq[i : i + 60] for i in range(0, len(seq), 60)) + "\n")
    return path


def test_truncated_bgzf_is_one_line(tmp_path):
    whole = bgzf_fasta(tmp_path / "w.fa.gz", {"c1": random_genome(9, 40 * L)}).read_bytes()
    cut = tmp_path / "cut.fa.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    fails(r"cut.fa.gz: truncated or corrupt BGZF", cut, tmp_path / "o")


def test_bgzf_truncated_after_indexing_is_one_line_and_leaves_nothing(tmp_path):
    """The .fai/.gzi made while it was whole stay newer than the file: the index check meets the cut."""
    p = bgzf_fasta(tmp_path / "w.fa.gz", {"c1": random_genome(9, 40 * L)})
    run(p, tmp_path / "first")
    with open(p, "r+b") as fh:
        fh.truncate(p.stat().st_size // 2)
    for index in (tmp_path / "w.fa.gz.fai", tmp_path / "w.fa.gz.gzi"):
        os.utime(index)
    fails(r"w.fa.gz: truncated or corrupt BGZF \(", p, tmp_path / "o")


@pytest.mark.parametrize("blank", [" ", "\t", "  \t"])
def test_blanks_ending_sequence_lines_are_not_bases(tmp_path, blank):
    """pyfaidx counts trailing spaces as bases; the windows must be Biopython's sequence (which drops them)."""
    recs = {"c1": random_genome(6, 3 * L + 11, n_runs=0)}
    text = "".join(f">{n} desc \n" + "".join(q[i : i + 120] + blank + "\n" for i in range(0, len(q), 120))
                   for n, q in recs.items())
    p = tmp_path / "b.fa"
    p.write_text(text)
    assert bio_records(p) == recs
    m = run(p, tmp_path / "o")
    assert m["splits"]["train"]["oov"] == 0 and m["chroms"][0]["length"] == len(recs["c1"])
    ws = open_windows(tmp_path / "o", "train")
    for i in range(len(ws)):
        _, s, e = ws.coords(i)
        assert decode(ws[i], ws.softmask(i)) == recs["c1"][s:e]
