"""The cache's copies follow a FASTA's content: a rewrite that keeps its size and modification time is read anew.
What the cache holds is listed with each entry's last use, and entries unused for a while are removed."""

from __future__ import annotations

import gzip
import hashlib
import os
import time
import zlib
from pathlib import Path

import pytest
from Bio import bgzf

from lcft.errors import LcftError
from lcft.genomics import prepare_windows
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_cache import cache_dir, cache_entries, mark_used, remove_unused
from tests.genomics.conftest import bio_records, random_genome, write_fasta
from tests.one_line import one_line

SWAP_AC = str.maketrans("ACac", "CAca")  # a rewrite of the bases only: the same bytes long


def _swapped(recs: dict[str, str]) -> dict[str, str]:
    return {n: s.translate(SWAP_AC) for n, s in recs.items()}


def _records(f: FastaFile) -> dict[str, str]:
    return {n: f.read_raw(n, 0, f.length(n)).replace(b"\n", b"").decode() for n in f.names}


def _rewrite_keeping_stat(path: Path, data: bytes) -> None:
    """Write `data` over `path` (which must keep its size) and give it back its modification time, as
    `cp -p`, `touch -r` or `rsync -t` of another file would."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def _stored_gzip(text: bytes) -> bytes:
    """gzip without compression (stored blocks), header time 0: the size depends on the length of `text` only."""
    return gzip.compress(text, compresslevel=0, mtime=0)


def test_gzip_rewritten_with_its_size_and_time_is_decompressed_again(tmp_path):
    """Oracle: Biopython over gzip.open of the new file."""
    recs = {"a": random_genome(1, 9_000), "b": random_genome(2, 4_000)}
    gz = tmp_path / "x.fa.gz"
    gz.write_bytes(_stored_gzip(write_fasta(tmp_path / "old.fa", recs).read_bytes()))
    with FastaFile(gz) as f:
        assert _records(f) == bio_records(gz)
    old = bio_records(gz)
    _rewrite_keeping_stat(gz, _stored_gzip(write_fasta(tmp_path / "new.fa", _swapped(recs)).read_bytes()))
    new = bio_records(gz)
    assert new != old and {n: len(s) for n, s in new.items()} == {n: len(s) for n, s in old.items()}
    with FastaFile(gz) as f:
        assert f.kind == "gzip" and _records(f) == new
        assert f.sha256() == hashlib.sha256(gz.read_bytes()).hexdigest()


def test_cr_only_fasta_rewritten_with_its_size_and_time_is_normalized_again(tmp_path):
    """Old-Mac line ends are read from a normalized copy in the cache, which must follow the content too."""
    recs = {"c": random_genome(3, 3_000, n_runs=0)}
    path = write_fasta(tmp_path / "mac.fa", recs, eol="\r")
    with FastaFile(path) as f:
        assert f.readable.is_relative_to(cache_dir()) and _records(f) == recs
    _rewrite_keeping_stat(path, write_fasta(tmp_path / "new.fa", _swapped(recs), eol="\r").read_bytes())
    with FastaFile(path) as f:
        assert _records(f) == _swapped(recs) != recs


def test_misnamed_bgzf_rewritten_with_its_size_and_time_is_read_anew(tmp_path):
    """A BGZF named .fa is read through a link in the cache; the link follows the path, so it reads what is
    there now (Biopython's reading of the decompressed bytes is the oracle)."""
    recs = {"a": random_genome(4, 20_000)}
    old, new = write_fasta(tmp_path / "old.fa", recs), write_fasta(tmp_path / "new.fa", _swapped(recs))
    path = tmp_path / "b.fa"

    def write(data: bytes) -> bytes:
        with bgzf.BgzfWriter(str(tmp_path / "tmp.bgz"), "wb", compresslevel=0) as w:
            w.write(data)
        return (tmp_path / "tmp.bgz").read_bytes()

    path.write_bytes(write(old.read_bytes()))
    with FastaFile(path) as f:
        assert f.readable.is_relative_to(cache_dir()) and _records(f) == bio_records(old)
    _rewrite_keeping_stat(path, write(new.read_bytes()))
    with FastaFile(path) as f:
        assert _records(f) == bio_records(new) != bio_records(old)


def test_prepare_hashes_a_gzip_fasta_once(tmp_path, monkeypatch):
    """The sha256 that names the decompressed copy is the one the manifest records, computed once (the copy
    checks the bytes it reads against it as it decompresses them)."""
    import lcft.genomics.fasta as fasta

    gz = tmp_path / "x.fa.gz"
    gz.write_bytes(gzip.compress(write_fasta(tmp_path / "src.fa", {"a": random_genome(5, 20_000)}).read_bytes()))
    hashed: list[Path] = []
    real = fasta.file_hash

    def counting(path, *a, **kw):
        hashed.append(Path(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(fasta, "file_hash", counting)
    m = prepare_windows(fasta=str(gz), out=str(tmp_path / "o"), length=1024, train="a", eval=())
    assert hashed == [gz]
    assert m["source"]["sha256"] == hashlib.sha256(gz.read_bytes()).hexdigest()


@pytest.mark.parametrize("same", [True, False])
def test_one_decompressed_copy_per_content(tmp_path, same):
    """Two paths holding the same gzip share one copy; different contents get their own."""
    recs = {"a": random_genome(6, 3_000)}
    for i, r in enumerate([recs, recs if same else _swapped(recs)]):
        (tmp_path / f"{i}").mkdir()
        (tmp_path / f"{i}" / "x.fa.gz").write_bytes(_stored_gzip(write_fasta(tmp_path / f"{i}.fa", r).read_bytes()))
    copies = []
    for i in range(2):
        with FastaFile(tmp_path / f"{i}" / "x.fa.gz") as f:
            copies.append(f.readable)
    assert (copies[0] == copies[1]) == same


@pytest.mark.parametrize("kind", ["gzip", "cr"])
def test_a_fasta_rewritten_while_it_is_copied_leaves_no_copy(tmp_path, monkeypatch, kind):
    """The file changes between its sha256 and the copy that is named by it (rewritten in place while read): the
    open is a one-line error and the cache holds no copy under the old digest (a later open of the old bytes
    would read the new ones from it)."""
    import lcft.genomics.fasta as fasta

    recs = {"a": random_genome(7, 6_000, n_runs=0)}
    path = tmp_path / ("x.fa.gz" if kind == "gzip" else "mac.fa")
    eol = "\r" if kind == "cr" else "\n"
    old = write_fasta(tmp_path / "old.fa", recs, eol=eol).read_bytes()
    new = write_fasta(tmp_path / "new.fa", _swapped(recs), eol=eol).read_bytes()
    path.write_bytes(_stored_gzip(old) if kind == "gzip" else old)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    real = fasta.file_hash

    def then_rewritten(p, *a, **kw):
        hashed = real(p, *a, **kw)
        _rewrite_keeping_stat(path, _stored_gzip(new) if kind == "gzip" else new)
        return hashed

    monkeypatch.setattr(fasta, "file_hash", then_rewritten)
    with pytest.raises(LcftError, match="changed while it was read") as e:
        FastaFile(path)
    assert "\n" not in str(e.value)
    named = [p.name for p in (cache_dir() / "fasta").glob(f"{digest[:32]}-*")]
    assert named == [], named  # nor its temp file: the copy is written atomically
    assert not [p for p in (cache_dir() / "fasta").iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(fasta, "file_hash", real)
    with FastaFile(path) as f:  # opened again once complete: the new bytes
        assert _records(f) == _swapped(recs)


@pytest.mark.parametrize("kind", ["joined", "joined-gzip", "blanks"])
def test_a_fasta_refused_leaves_no_copy_in_the_cache(tmp_path, monkeypatch, kind):
    """A file read from a copy in the cache (normalized; a plain gzip decompressed first) and refused all the same
    (two files joined, the first without a final line end; blanks standing for a base) leaves none of its copies:
    they held its size again for nothing. A file read from its copy keeps it, for the next open."""
    monkeypatch.setenv("LCFT_CACHE", str(tmp_path / "cache"))
    recs = {"a": random_genome(8, 3_000, n_runs=0), "b": random_genome(9, 3_000, n_runs=0)}
    text = write_fasta(tmp_path / "a.fa", {"a": recs["a"]}).read_bytes()[:-1] + write_fasta(
        tmp_path / "b.fa", {"b": recs["b"]}).read_bytes()
    if kind == "blanks":
        text = b">r0\nACGTACGTA \nACGTACGTAC\nACGTACGTAC\nACG\n"
    path = tmp_path / ("x.fa.gz" if kind == "joined-gzip" else "x.fa")
    path.write_bytes(_stored_gzip(text) if kind == "joined-gzip" else text)
    one_line(lambda: FastaFile(path), str(path))
    assert list((tmp_path / "cache" / "fasta").iterdir()) == []
    (tmp_path / "mac.fa").write_bytes(write_fasta(tmp_path / "lf.fa", recs).read_bytes().replace(b"\n", b"\r"))
    with FastaFile(tmp_path / "mac.fa") as f:
        assert _records(f) == recs and f.readable.is_file()
    assert sorted(p.name for p in (tmp_path / "cache" / "fasta").iterdir()) == [
        f.readable.name, f.readable.name + ".fai", f.readable.name + ".sum"]


DAY = 86400


@pytest.mark.parametrize("eol", ["\n", "\r"])
@pytest.mark.parametrize("at", ["head", "past the head"])
def test_a_gzip_fasta_with_damaged_deflate_data_is_one_line(tmp_path, at, eol):
    """Damaged deflate data raises zlib.error, no OSError, and had escaped as a traceback: where the first text is
    read, and past it, where the copy is made (decompressed, or normalized for CR-only line ends). One line naming
    the file, and nothing left in the cache."""
    text = write_fasta(tmp_path / "g.fa", {"chr1": random_genome(1, 400_000)}, eol=eol).read_bytes()
    cut = 100 if at == "head" else 300_000  # the first 64 KiB decompressed are read first
    deflate = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    gz = bytearray(deflate.compress(text[:cut]) + deflate.flush(zlib.Z_FULL_FLUSH))  # the next block starts a byte
    gz += b"\xff" + (deflate.compress(text[cut:]) + deflate.flush())[1:]  # its header: type 3, which deflate reserves
    path = tmp_path / "g.fa.gz"
    path.write_bytes(gz)
    before = cache_entries()  # the cache is the session's: other tests' entries stay
    one_line(lambda: FastaFile(path), f"{path}: ", "decompressing data")
    assert cache_entries() == before


def _age(path: Path, days: float) -> None:
    """Date a cache file's last use (and write) `days` back, as if nothing had opened it since."""
    t = time.time() - days * DAY
    os.utime(path, (t, t), follow_symlinks=False)


def _opened_cache(tmp_path: Path, monkeypatch) -> tuple[Path, Path, dict[str, str]]:
    """A private cache holding what opening a plain gzip FASTA and a FASTA in a read-only folder leave: the
    decompressed copy with its index, and an index of the read-only file."""
    monkeypatch.setenv("LCFT_CACHE", str(tmp_path / "cache"))
    recs = {"a": random_genome(3, 5_000)}
    gz = tmp_path / "g.fa.gz"
    gz.write_bytes(gzip.compress(write_fasta(tmp_path / "g.fa", recs).read_bytes()))
    shut = tmp_path / "ro"
    shut.mkdir()
    write_fasta(shut / "r.fa", recs)
    shut.chmod(0o555)
    for path in (gz, shut / "r.fa"):
        with FastaFile(path) as f:
            assert _records(f) == bio_records(path)
    return gz, shut / "r.fa", recs


def test_the_cache_lists_each_copy_with_its_index(tmp_path, monkeypatch):
    _opened_cache(tmp_path, monkeypatch)
    entries = {e.kind: e for e in cache_entries()}
    assert sorted(entries) == ["decompressed", "index"]
    copy = entries["decompressed"]
    assert copy.name.endswith("-g.fa")
    assert sorted(f.name for f in copy.files) == [copy.name, copy.name + ".fai", copy.name + ".sum"]  # .sum: its record
    assert copy.bytes == sum(os.stat(f).st_blocks * 512 for f in copy.files) > 5_000
    assert entries["index"].name.endswith("-r.fa") and [f.suffix for f in entries["index"].files] == [".fai"]
    assert all(time.time() - e.last_used < 600 for e in entries.values())


def test_a_reuse_is_recorded_without_making_the_copys_index_stale(tmp_path, monkeypatch):
    """Opening a FASTA again marks its cache entries used (their access time), and leaves the modification
    time the index's freshness is judged by: the copy's .fai is not rebuilt."""
    gz, ro, _ = _opened_cache(tmp_path, monkeypatch)
    for e in cache_entries():
        for f in e.files:
            _age(f, 40)
    fai = next(e for e in cache_entries() if e.kind == "decompressed").files[1]
    written = fai.stat().st_mtime_ns
    assert all(e.last_used < time.time() - 39 * DAY for e in cache_entries())
    for path in (gz, ro):
        with FastaFile(path):
            pass
    assert all(time.time() - e.last_used < 600 for e in cache_entries())
    assert fai.stat().st_mtime_ns == written  # the index was reused, not written again
    copy = next(e for e in cache_entries() if e.kind == "decompressed").files[0]
    assert copy.stat().st_mtime < time.time() - 39 * DAY  # only its access time moved


def test_a_use_is_recorded_whether_or_not_the_file_system_records_reads(tmp_path):
    """mark_used sets the access time itself (a noatime mount records no read), never the modification time,
    and on a link the link's own, not its target's."""
    target = tmp_path / "t.fa"
    target.write_bytes(b">t\nACGT\n")
    link = tmp_path / "l.fa"
    link.symlink_to(target)
    for path in (target, link):
        _age(path, 40)
    before = target.stat()
    mark_used(link)
    assert time.time() - os.lstat(link).st_atime < 600 and os.lstat(link).st_mtime < time.time() - 39 * DAY
    assert (target.stat().st_atime_ns, target.stat().st_mtime_ns) == (before.st_atime_ns, before.st_mtime_ns)
    mark_used(target)
    assert time.time() - target.stat().st_atime < 600 and target.stat().st_mtime_ns == before.st_mtime_ns
    assert mark_used(tmp_path / "missing") == tmp_path / "missing"  # nothing to record, no error


def test_entries_unused_for_days_are_removed_and_made_again(tmp_path, monkeypatch):
    gz, ro, recs = _opened_cache(tmp_path, monkeypatch)
    old = next(e for e in cache_entries() if e.kind == "decompressed")
    for f in old.files:
        _age(f, 40)
    links = cache_dir() / "links"
    links.mkdir()
    (links / "x-gone.fa").symlink_to(tmp_path / "gone.fa")  # a link to a file since deleted: removed whatever its age
    unfinished = cache_dir() / "fasta" / ".y.fa.tmp"  # a copy whose writer was killed 40 days ago, and one now
    unfinished.write_bytes(b">y\nACGT\n")
    _age(unfinished, 40)
    (cache_dir() / "fasta" / ".z.fa.tmp").write_bytes(b">z\nACGT\n")
    removed = remove_unused(30)
    assert sorted(e.kind for e in removed) == ["decompressed", "link to a missing file", "unfinished"]
    assert not any(f.exists() or f.is_symlink() for e in removed for f in e.files)
    assert sorted(e.kind for e in cache_entries()) == ["index", "unfinished"]  # used just now: kept
    with FastaFile(gz) as f:  # the copy is made again from the FASTA
        assert f.kind == "gzip" and _records(f) == recs == bio_records(gz)
    assert remove_unused(0) and cache_entries() == []
    with FastaFile(ro) as f:
        assert _records(f) == recs


@pytest.mark.parametrize("kind", ["gzip", "misnamed bgzf", "read-only folder"])
def test_a_cache_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, kind):
    """LCFT_CACHE naming a file (or a folder on a read-only filesystem): the first use of the cache, a gzip's
    copy, a link naming a BGZF for pyfaidx, or the index of a FASTA in a read-only folder, was a traceback."""
    fasta = write_fasta(tmp_path / "g.fa", {"c1": "ACGT" * 30})
    if kind == "gzip":
        path = tmp_path / "g.fa.gz"
        path.write_bytes(gzip.compress(fasta.read_bytes()))
    elif kind == "misnamed bgzf":
        path = tmp_path / "g.fa"
        with bgzf.BgzfWriter(str(tmp_path / "b.gz"), "wb") as w:
            w.write(fasta.read_bytes())
        os.replace(tmp_path / "b.gz", path)
    else:
        path = fasta
        monkeypatch.setattr("lcft.genomics.fasta_cache.writable_dir", lambda folder: False)  # root writes anywhere
    (tmp_path / "not_a_folder").write_text("")
    monkeypatch.setenv("LCFT_CACHE", str(tmp_path / "not_a_folder"))
    with pytest.raises(LcftError, match=r"^cannot use the cache folder .*not_a_folder.* \(Not a directory\): "
                                        r"set LCFT_CACHE to a writable folder$"):
        FastaFile(path)


def test_a_non_ascii_fasta_name_under_an_ascii_file_system_encoding(tmp_path):
    """LC_ALL=C with Python's UTF-8 mode off: a FASTA path holding UTF-8 bytes reaches lcft as surrogates (what
    Python makes of bytes its encoding lacks); the cache's key of the path is made from its bytes, never a
    UnicodeEncodeError traceback."""
    import subprocess
    import sys

    fasta = tmp_path / "g\u00f6.fa"
    fasta.write_text(">chrA\n" + "ACGT" * 64 + "\n")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "LCFT_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "lcft", "prepare", "inspect", str(fasta)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "chrA" in r.stdout, r.stderr[-2000:]


def test_a_tilde_in_lcft_cache_is_the_home_folder(tmp_path):
    """LCFT_CACHE='~/c' (quoted, or from an env file: no shell expands it) is a folder in the home folder, as
    the default ~/.cache/lcft is; never a folder named '~' in the working folder."""
    import subprocess
    import sys

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    with gzip.open(work / "g.fa.gz", "wt") as f:  # plain gzip: decompressed once into the cache
        f.write(">chrA\n" + "ACGT" * 64 + "\n")
    env = {**os.environ, "HOME": str(home), "LCFT_CACHE": "~/c",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "lcft", "prepare", "inspect", "g.fa.gz"], env=env, cwd=work,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (home / "c" / "fasta").is_dir() and not (work / "~").exists()


def test_the_copy_into_the_cache_is_named_on_stderr_once(tmp_path, capfd):
    """Unpacking a plain gzip (a minute for a genome) came before any progress bar and said nothing: it is named
    as it starts, and the run that reuses the copy says nothing. Oracle: the copy's records, by Biopython."""
    recs = {"a": random_genome(3, 5_000)}
    gz = tmp_path / "x.fa.gz"
    gz.write_bytes(gzip.compress(write_fasta(tmp_path / "x.fa", recs).read_bytes()))
    capfd.readouterr()
    with FastaFile(gz) as f:
        assert _records(f) == bio_records(gz)
    assert capfd.readouterr().err == f"unpacking {gz} into {cache_dir() / 'fasta'} (once: later runs reuse the copy)\n"
    with FastaFile(gz) as f:
        assert _records(f) == recs
    assert capfd.readouterr().err == ""
    cr = tmp_path / "cr.fa"  # old-Mac CR-only line ends: pyfaidx would see one line, a copy with LF is read
    cr.write_bytes(b">a\r" + recs["a"][:60].encode() + b"\r" + recs["a"][60:99].encode() + b"\r")
    with FastaFile(cr) as f:
        assert _records(f) == {"a": recs["a"][:99]}
    assert capfd.readouterr().err == (f"normalizing the line ends of {cr} into {cache_dir() / 'fasta'} (once: later "
                                      "runs reuse the copy)\n")


@pytest.mark.parametrize("lcft_cache,xdg,want", [
    (None, "{tmp}/xdg", "{tmp}/xdg/lcft"),  # a cluster's XDG_CACHE_HOME on scratch space: it was ignored
    ("{tmp}/mine", "{tmp}/xdg", "{tmp}/mine"),  # LCFT_CACHE first
    (None, "relative/xdg", "{home}/.cache/lcft"),  # a relative one is ignored, as the XDG specification says
    (None, "", "{home}/.cache/lcft"),
    (None, None, "{home}/.cache/lcft")])
def test_the_cache_folder_follows_lcft_cache_then_xdg_cache_home(tmp_path, monkeypatch, lcft_cache, xdg, want):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name, value in (("LCFT_CACHE", lcft_cache), ("XDG_CACHE_HOME", xdg)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value.format(tmp=tmp_path))
    assert cache_dir() == Path(want.format(tmp=tmp_path, home=tmp_path / "home"))
