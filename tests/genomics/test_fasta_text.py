"""FASTA text as tools and editors leave it (blanks among bases, form feeds, CR-only line ends behind a long
header, a cached copy of other rules) and as a fuzzer mutates it: lcft reads every record base for base as
Biopython does, or refuses the file in one line. Oracle: Biopython's "fasta" parser (it drops spaces and tabs
anywhere in sequence lines), given the file without the blank and ';' lines before its first header that lcft
also skips."""

from __future__ import annotations

import gzip
import io
import random
import shutil
import warnings
from pathlib import Path

import pytest
from Bio import SeqIO, bgzf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcft.errors import LcftError
from lcft.genomics import decode, open_windows, prepare_windows
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_cache import NORMALIZED, cache_dir
from lcft.genomics.tokenizer import IUPAC_AMBIGUOUS
from lcft.hashing import file_hash
from tests.genomics.conftest import bio_records, random_genome, write_fasta

EXAMPLES = 300  # about 3 s on 2 AMD EPYC cores; by hand, 3,000 random ones at a time found nothing more
WINDOW = 16  # bases per window of the fuzzed files' char windows


def _biopython(raw: bytes) -> dict[str, str] | None:
    """Records as Biopython reads the (decompressed) bytes once lcft's leading blank and ';' lines are dropped;
    None when it refuses them."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        lines = raw.decode().replace("\r\n", "\n").replace("\r", "\n").split("\n")  # UTF-8, as Biopython opens text
        while lines and (not lines[0].strip() or lines[0].startswith(";")):
            lines.pop(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # letters as the bytes they are: a non-ASCII one (UTF-8, as read) is lcft's <unk> for each byte
            return {r.id: bytes(r.seq).decode("latin-1") for r in SeqIO.parse(io.StringIO("\n".join(lines)), "fasta")}
    except (UnicodeDecodeError, ValueError):
        return None


def _char_ids(seq: str) -> list[int]:
    """lcft's char vocabulary, spelled out: A C G T N 4..8, an ambiguity code N, anything else <unk> (3)."""
    return [{"A": 4, "C": 5, "G": 6, "T": 7, "N": 8}.get(c.upper(), 8 if c.upper() in IUPAC_AMBIGUOUS else 3)
            for c in seq]


def _reads_as_biopython(path: Path, want: dict[str, str] | None, out: Path) -> None:
    """Whole records through FastaFile, then char windows of those long enough: both as `want`, or one line."""
    try:
        with FastaFile(path) as f:
            got = {n: f.read_raw(n, 0, f.length(n)).translate(None, b"\r\n").decode("latin-1") for n in f.names}
        names = tuple(n for n, s in got.items() if len(s) >= WINDOW)
        if names:
            prepare_windows(fasta=str(path), out=str(out), length=WINDOW, train=names, eval=(), tokenizer="char",
                            max_n_frac=1.0, max_oov_frac=1.0)
    except LcftError as e:
        assert "\n" not in str(e).strip(), f"a multi-line error: {e}"
        return
    assert want is not None, "lcft read a file Biopython refuses"
    assert got == want, "records read otherwise than Biopython reads them"
    ws = open_windows(out, "train") if names else []
    for i in range(len(ws)):
        chrom, s, e = ws.coords(i)
        assert [int(x) for x in ws[i]] == _char_ids(want[chrom][s:e]), f"window {i} ({chrom}:{s}-{e})"
        assert [bool(x) for x in ws.softmask(i)] == [c >= "a" for c in want[chrom][s:e]], f"window {i} mask"


@pytest.mark.parametrize("where", ["inside a line", "every 10 bases", "a tab", "leading a line"])
def test_a_blank_among_bases_is_one_line_naming_its_base(tmp_path, where):
    """pyfaidx counts a space or tab as a base (an <unk> token, every later base one place off); Biopython drops
    it. lcft refuses, naming the record and the base Biopython reads just before it plus one."""
    seq = random_genome(3, 4000, n_runs=0)
    lines = [seq[i:i + 60] for i in range(0, 4000, 60)]
    if where == "every 10 bases":  # as GenBank prints a sequence
        lines = [" ".join(ln[j:j + 10] for j in range(0, 60, 10)) for ln in lines[:-1]] + lines[-1:]
    elif where == "leading a line":
        lines[-1] = " " + lines[-1]
    else:
        lines[7] = lines[7][:30] + (" " if where == "inside a line" else "\t") + lines[7][31:]
    path = tmp_path / "b.fa"
    path.write_text(">c1 desc\n" + "\n".join(lines) + "\n")
    text = "\n".join(lines)
    before = len(text[:text.index(" " if where != "a tab" else "\t")].replace("\n", ""))
    want = bio_records(path)["c1"]
    assert want[:before] == seq[:before]  # the oracle drops the blank
    with pytest.raises(LcftError) as e:
        prepare_windows(fasta=str(path), out=str(tmp_path / "o"), length=64, train=("c1",), eval=())
    msg = str(e.value)
    assert "\n" not in msg and "'c1'" in msg and f"at base {before + 1:,})" in msg, msg
    assert ("a tab" if where == "a tab" else "a space") in msg
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize(("eol", "odd"), [
    ("\n", "TTTTTTTTT\r\n"),  # a CRLF line one base short: as many bytes as the others
    ("\r\n", "TTTTTTTTTTT\n"),  # a LF line one base more
])
def test_a_line_ending_otherwise_in_as_many_bytes_is_one_line(tmp_path, eol, odd, last):
    """pyfaidx checks each line's length in bytes only: a line of another line end and one base more or less
    passes, and every later base of the record would be read one place off (a CR read as a base, or a base
    dropped). Biopython reads the bases. Seen at open: the record then ends a byte off where its layout says."""
    record = ">c1" + eol + ("ACGTACGTAC" + eol) * 5 + odd + ("ACGTACGTAC" + eol) * 5 + "ACG" + eol
    other = ">c2" + eol + ("GGGGGCCCCC" + eol) * 3
    path = tmp_path / "m.fa"
    path.write_bytes(((other + record) if last else (record + other)).encode())
    assert bio_records(path)["c1"] == "ACGTACGTAC" * 5 + odd.strip() + "ACGTACGTAC" * 5 + "ACG"
    with pytest.raises(LcftError, match="re-wrap the file") as e:
        prepare_windows(fasta=str(path), out=str(tmp_path / "o"), length=8, train=("c1",), eval=())
    msg = str(e.value)  # the record ending off its layout, or (c1 first) the one whose header it then misses
    assert "\n" not in msg and any(f"'{n}'" in msg for n in ("c1",) + ("c2",) * (not last)), msg


def test_a_carriage_return_among_the_bases_of_a_reused_index_is_one_line(tmp_path):
    """The read-time check behind the one at open: through an index that fits the layout (written by hand
    here, as if the CR were a base), a CR among the bases of a LF record past the first 64 KiB (a lone CR there
    makes the file CR-only) is named with its base."""
    path = tmp_path / "r.fa"
    path.write_bytes(b">c1\n" + b"ACGTACGTAC\n" * 7000 + b"ACGT\rCGTAC\n" + b"ACGTACGTAC\n" * 2)
    (tmp_path / "r.fa.fai").write_text("c1\t70030\t4\t10\t11\n")
    with FastaFile(path) as f:
        with pytest.raises(LcftError, match=r"'c1' has a carriage return among its bases \(at base 70,005\)") as e:
            f.read_raw("c1", 0, 70030)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("more", [1, 2, 12, 25])
@pytest.mark.parametrize("last", [False, True])
def test_a_last_line_longer_than_the_others_is_one_line(tmp_path, more, last):
    """pyfaidx takes a record's last line of any length and reads it as if wrapped like the first: its last
    bases came from the next line or header, or a read ran past the record ('line breaks are not where the
    FASTA index puts them (changed since indexing?)' in prepare). Seen at open, in the scan's read per record."""
    long = random_genome(8, 20 + 10 + more, n_runs=0)  # two lines of 10, then one of 10 + more
    other = random_genome(9, 25, n_runs=0)
    records = [f">c1 a header\n{long[:10]}\n{long[10:20]}\n{long[20:]}\n",
               ">c2 another\n" + "".join(other[i:i + 10] + "\n" for i in range(0, 25, 10))]
    path = tmp_path / "l.fa"
    path.write_text("".join(records[::-1] if last else records))
    assert bio_records(path)["c1"] == long  # Biopython reads every base
    with pytest.raises(LcftError, match="re-wrap the file") as e:
        prepare_windows(fasta=str(path), out=str(tmp_path / "o"), length=8, train=("c1", "c2"), eval=())
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()


@pytest.mark.parametrize("text", [">r0\nACGTACGTA \nACGTACGTAC\nACGTACGTAC\nACG\n",
                                  ">r0\nACGTACGTAC\nACGTACGTA \nACGTACGTAC\nACG \n"], ids=["first", "last"])
def test_blanks_ending_some_lines_and_standing_for_a_base_in_others_is_one_line(tmp_path, text):
    """Blanks ending a record's first (or last) line send it to a copy without them; a blank in place of a base
    in another line then leaves that line short: one line (it was pyfaidx's FastaIndexingError, uncaught)."""
    path = tmp_path / "b.fa"
    path.write_text(text)
    with pytest.raises(LcftError, match=r"unequal length once the spaces and tabs .*first in record 'r0'") as e:
        FastaFile(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("last", [False, True])
def test_a_blank_ending_only_a_records_last_line_is_not_a_base(tmp_path, last):
    """The blank sits after every window's bases, so no read would meet it; the length would be one too many.
    Seen at open (one byte more in the read each record already has): the file is read from a copy without it."""
    recs = {"a": random_genome(1, 700, n_runs=0), "b": random_genome(2, 650, n_runs=0)}
    name = "b" if last else "a"
    text = "".join(f">{n}\n" + "".join(s[i:i + 60] + (" " if n == name and i + 60 >= len(s) else "") + "\n"
                                        for i in range(0, len(s), 60)) for n, s in recs.items())
    path = tmp_path / "x.fa"
    path.write_text(text)
    assert bio_records(path) == recs
    m = prepare_windows(fasta=str(path), out=str(tmp_path / "o"), length=64, train=("a", "b"), eval=())
    assert {c["chrom"]: c["length"] for c in m["chroms"]} == {n: len(s) for n, s in recs.items()}
    ws = open_windows(tmp_path / "o", "train")
    for i in range(len(ws)):
        chrom, s, e = ws.coords(i)
        assert decode(ws[i], ws.softmask(i)) == recs[chrom][s:e]


def test_a_form_feed_is_kept_as_biopython_keeps_it(tmp_path):
    """Biopython drops spaces and tabs only: a form feed ending a line is a letter of the record, lcft's <unk>."""
    path = tmp_path / "f.fa"
    path.write_bytes(b">a\nACGTACGT\nACGTACG\x0c\n")
    with FastaFile(path) as f:
        assert f.read_raw("a", 0, f.length("a")).replace(b"\n", b"").decode() == bio_records(path)["a"]
    with pytest.raises(LcftError, match=r"letters without a token: '\\x0c' \(1 bases\)"):
        prepare_windows(fasta=str(path), out=str(tmp_path / "o"), length=8, train=("a",), eval=(), max_n_frac=1.0)


@pytest.mark.parametrize("compress", [None, "gzip"])
def test_cr_line_ends_behind_a_header_longer_than_the_first_read(tmp_path, compress):
    """Which line ends a file has is seen in its first bytes, read on until a line break: a header of 70,000
    characters hid the old-Mac CR line ends, and pyfaidx read the file as one header line."""
    recs = {"L" * 70_000: random_genome(4, 500, n_runs=0), "b": random_genome(5, 300, n_runs=0)}
    text = write_fasta(tmp_path / "lf.fa", recs).read_bytes().replace(b"\n", b"\r")
    path = tmp_path / ("cr.fa.gz" if compress else "cr.fa")
    path.write_bytes(gzip.compress(text) if compress else text)
    assert bio_records(path) == recs
    with FastaFile(path) as f:
        assert {n: f.read_raw(n, 0, f.length(n)).replace(b"\n", b"").decode() for n in f.names} == recs


def test_bgzf_then_plain_gzip_members_read_as_one_gzip(tmp_path):
    """`cat a.fa.bgz b.fa.gz`: a gzip whose first member is BGZF. Bio.bgzf refused the second member, and the
    error said record names must be unique; it is read as the gzip it is (decompressed once, into the cache)."""
    recs = {"a": random_genome(6, 700, n_runs=0), "b": random_genome(7, 500, n_runs=0)}
    path = tmp_path / "ab.fa.gz"
    with bgzf.BgzfWriter(str(tmp_path / "a.fa.gz"), "wb") as w:
        w.write(f">a\n{recs['a']}\n")
    path.write_bytes((tmp_path / "a.fa.gz").read_bytes() + gzip.compress(f">b\n{recs['b']}\n".encode()))
    assert bio_records(path) == recs
    with FastaFile(path) as f:
        assert {n: f.read_raw(n, 0, f.length(n)).decode() for n in f.names} == recs


def test_a_cached_copy_made_under_other_rules_is_not_reused(tmp_path):
    """A normalized copy is named by the file's sha256 and the rules it was made by: one an older lcft made
    (rules unnamed, a form feed ending a line dropped) is not read for this file."""
    path = tmp_path / "x.fa"
    path.write_bytes(b">a\nACGTACGT \nACGTACGT\nACGTAC\x0c\n")
    old = cache_dir() / "fasta" / f"{file_hash(path).hexdigest()[:32]}-x.fa{NORMALIZED}"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_bytes(b">a\nACGTACGT\nACGTACGT\nACGTAC\n")
    with FastaFile(path) as f:
        assert f.readable != old
        assert f.read_raw("a", 0, f.length("a")).replace(b"\n", b"").decode() == bio_records(path)["a"]


LINE_EDITS = ["blank line", "CR", "spaces after", "space before", "space inside", "tab inside", "form feed",
              "other letter", "NUL", "non-ASCII", "a base less", "a base more", "header", "same header",
              "bare header", "empty record", "comment", "long header", "'>' inside"]


def _edit(lines: list[bytes], edit: str, rng: random.Random) -> None:
    """One edit of a FASTA's lines in place: at a random line (sequence line where it is about bases)."""
    k = rng.randrange(len(lines))
    s = rng.choice([i for i, ln in enumerate(lines) if not ln.startswith(b">")] or [k])
    ln, j = lines[s], rng.randrange(len(lines[s]) + 1)
    put = {"space inside": b" ", "tab inside": b"\t", "other letter": bytes([rng.randint(33, 126)]), "NUL": b"\0",
           "non-ASCII": bytes([rng.randint(128, 255)]), "'>' inside": b">"}
    if edit in put:
        lines[s] = ln[:j] + put[edit] + ln[j + 1:]
    elif edit in ("CR", "spaces after", "form feed", "a base more"):
        lines[s] = ln + {"CR": b"\r", "spaces after": b" " * rng.randint(1, 3), "form feed": b"\x0c"}.get(edit, b"A")
    elif edit == "space before":
        lines[s] = b" " + ln
    elif edit == "a base less":
        lines[s] = ln[:-1]
    else:
        lines.insert(k, {"blank line": b"", "header": b">x%d" % k, "same header": lines[0], "long header":
                         b">" + b"L" * rng.choice([300, 70_000]), "comment": b";c", "empty record": b">e",
                         "bare header": rng.choice([b">", b"> x", b">\t"])}[edit])


@st.composite
def fasta_files(draw) -> tuple[bytes, str]:
    """A FASTA of 1-3 records (width, line ends, case and N as genomes have them) with 1-3 edits, written plain,
    as gzip, as BGZF, or as BGZF then a plain gzip member."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    width, eol = rng.choice([7, 10, 60, 61]), rng.choice([b"\n", b"\n", b"\r\n"])
    lines = []
    for r in range(rng.randint(1, 3)):
        seq = "".join(rng.choices("ACGTacgtN", weights=(9, 9, 9, 9, 3, 3, 3, 3, 1), k=rng.randint(50, 400)))
        lines += [f">r{r}{rng.choice(['', ' desc', chr(9) + 'x'])}".encode()]
        lines += [seq[i:i + width].encode() for i in range(0, len(seq), width)]
    edits = draw(st.lists(st.sampled_from(LINE_EDITS), min_size=1, max_size=3))
    for edit in edits:
        _edit(lines, edit, rng)
    data = eol.join(lines) + eol
    end = draw(st.sampled_from(["whole", "cut", "no last line break", "CR only"]))
    if end == "cut":
        data = data[: rng.randrange(1, len(data))]
    elif end == "no last line break":
        data = data.rstrip(b"\r\n")
    elif end == "CR only":
        data = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r")
    return data, draw(st.sampled_from(["plain", "plain", "gzip", "bgzf", "bgzf + gzip"]))


def test_fuzzed_fasta_text_reads_as_biopython_or_is_one_line(tmp_path):
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(case=fasta_files())
    def check(case: tuple[bytes, str]) -> None:
        data, form = case
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        path = work / ("g.fa" if form == "plain" else "g.fa.gz")
        if form.startswith("bgzf"):  # "bgzf + gzip": its second half a plain gzip member (`cat a.bgz b.gz`)
            cut = len(data) // 2 if form != "bgzf" else len(data)
            with bgzf.BgzfWriter(str(path), "wb") as w:
                w.write(data[:cut])
            if cut < len(data):
                path.write_bytes(path.read_bytes() + gzip.compress(data[cut:]))
        else:
            path.write_bytes(gzip.compress(data) if form == "gzip" else data)
        _reads_as_biopython(path, _biopython(data), work / "windows")

    check()


@st.composite
def sound_fasta(draw) -> str:
    """A FASTA as tools write them: 1-4 records of 0-3,000 bases (case, N), each wrapped at its own width, LF or
    CRLF, blank lines between records, a ';' comment or blank lines before the first, the last line break or not."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    eol = rng.choice(["\n", "\r\n"])
    parts = [rng.choice(["", "", eol, ";comment" + eol])]
    for r in range(rng.randint(1, 4)):
        n, width = rng.choice([0, 1, 5, 59, 60, 61, 121, 500, 3000]), rng.choice([1, 7, 60, 61, 80])
        seq = "".join(rng.choices("ACGTacgtNn", k=n))
        parts.append(f">r{r}{rng.choice(['', ' d e s c', chr(9) + 'x', chr(0x1c) + 'x'])}{eol}")
        parts += [seq[i:i + width] + eol for i in range(0, n, width)] + [eol] * (rng.random() < 0.2)
    text = "".join(parts)
    return text.rstrip("\r\n") if rng.random() < 0.2 else text


def test_sound_fasta_files_open_and_read_as_biopython(tmp_path):
    """No file a tool writes is refused by the checks above (the scan at open judges pyfaidx's own index too):
    e.g. an empty record whose header ends the file unterminated, or a header whose name pyfaidx ends at \\x1c (it
    splits the decoded text), each of which the scan first took for a misfit."""
    @settings(max_examples=EXAMPLES // 3, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(text=sound_fasta())
    def check(text: str) -> None:
        shutil.rmtree(tmp_path / "s", ignore_errors=True)
        (tmp_path / "s").mkdir()
        path = tmp_path / "s" / "s.fa"
        path.write_text(text, newline="")
        want = _biopython(text.encode())
        with FastaFile(path) as f:
            assert {n: f.read_raw(n, 0, f.length(n)).translate(None, b"\r\n").decode() for n in f.names} == want

    check()


@pytest.mark.parametrize("text,line", [
    (">c1\nACGTÄCGT\n", 2), (">c1\nACGTÄCGTAC\nACGTACGTAC\nACG\n>c2\nACGT\n", 2),
    (">c1 Ä in a header is fine\nACGTACGTAC\nACGTACGTAC\nACG\n>c2\nACÄGT\n", 6)])
@pytest.mark.parametrize("compress", [False, True])
def test_a_letter_of_several_bytes_among_bases_is_named(tmp_path, text, line, compress):
    """pyfaidx counts 'Ä' as one character where the file holds two bytes: the index never fits, and the
    refusal said to re-wrap the file, which would not help."""
    path = tmp_path / ("u.fa.gz" if compress else "u.fa")
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    with pytest.raises(LcftError, match=rf"u.fa(.gz)?: line {line} holds a non-ASCII character among bases; "
                                        r"a FASTA's sequence lines are ASCII letters \(IUPAC codes\): fix or remove it$"):
        FastaFile(path)


def test_non_ascii_in_headers_only_reads_as_biopython(tmp_path):
    path = tmp_path / "h.fa"
    path.write_bytes(">c1 Änderung\nACGTACGT\nAC\n>c2 naïve\nACGT\n".encode())
    with FastaFile(path) as f:
        assert {n: f.read_raw(n, 0, f.length(n)).replace(b"\n", b"").decode() for n in f.names} == bio_records(path)
