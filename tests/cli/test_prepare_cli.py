"""`lcft prepare windows|verify|inspect|fetch|cache` through typer: options, TOML precedence, exit codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.cli.common import console
from lcft.genomics import open_windows, sample_fasta

runner = CliRunner()


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LCFT_CACHE", str(tmp_path_factory.getbasetemp() / "lcft-cache"))


def lcft(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def windows_args(out, *extra):
    """prepare windows of the sample into `out`; `extra` may give --train or --eval instead of the defaults (an
    option of one value given twice is refused)."""
    split = [a for opt, value in (("--train", "chr2"), ("--eval", "chr22")) if opt not in extra for a in (opt, value)]
    return ["prepare", "windows", "--fasta", sample_fasta(), "--out", out, *split, *extra]


def test_windows_then_noop_then_mismatch(tmp_path):
    out = tmp_path / "w"
    r = lcft(*windows_args(out, "--length", "64K"))
    assert r.exit_code == 0, r.output
    assert "skipped" in r.stdout and "written" in r.stdout  # (two-line headers: 'skipped for N', 'bytes written')
    m = json.loads((out / "manifest.json").read_text())
    assert m["length"] == 65536 and m["splits"]["train"]["windows"] == len(open_windows(out, "train"))

    assert "wrote" in r.stdout and "already" not in r.stdout
    size = sum(f.stat().st_size for f in out.iterdir() if f.name.startswith("train."))
    assert f"{size:,}" in r.stdout  # the train split's files, as the table counts them

    r = lcft(*windows_args(out, "--length", "64K"))
    assert r.exit_code == 0 and "nothing to do" in r.stderr
    # the table still shows the windows, but claims no writing it did not do
    assert "written ┃" not in r.stdout and "wrote" not in r.stdout  # (the header of bytes written)
    assert "already there" in r.stdout and f"{size:,}" in r.stdout and "nothing written" in r.stdout

    r = lcft(*windows_args(out, "--length", "128K"))
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "length" in r.stderr and "--overwrite" in r.stderr

    r = lcft(*windows_args(out, "--length", "128K", "--overwrite"))
    assert r.exit_code == 0 and json.loads((out / "manifest.json").read_text())["length"] == 131072


def test_config_toml_then_flags_override(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[prepare]\nfasta = "{sample_fasta()}"\nout = "{tmp_path / "t"}"\nlength = "32K"\n'
                   'stride = "64K"\ntrain = ["chr2"]\neval = ["chr22"]\nmax_n_frac = 0.5\n')
    r = lcft("prepare", "windows", "--config", cfg, "--max-n-frac", "0.05")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert (m["length"], m["stride"], m["max_n_frac"]) == (32768, 65536, 0.05)  # TOML, TOML, flag
    saved = (tmp_path / "t" / "prepare.toml").read_text()
    assert "max_n_frac = 0.05" in saved and "stride = 65536" in saved
    # the saved resolved config reproduces the run: a no-op
    r = lcft("prepare", "windows", "--config", tmp_path / "t" / "prepare.toml")
    assert r.exit_code == 0 and "nothing to do" in r.stderr


def test_config_unknown_key(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text('lenght = "32K"\n')
    r = lcft("prepare", "windows", "--config", cfg)
    assert r.exit_code == 1 and "unknown" in r.stderr and "lenght" in r.stderr


def test_bad_inputs_exit_nonzero_with_one_line(tmp_path):
    for args, needle in [
        (["prepare", "windows", "--fasta", tmp_path / "missing.fa", "--out", tmp_path / "o"], "FASTA not found"),
        (windows_args(tmp_path / "o", "--length", "64K", "--train", "chr9"), "available: chr2, chr22"),
        (windows_args(tmp_path / "o", "--length", "12345"), "multiple of 8"),
        (windows_args(tmp_path / "o", "--length", "lots"), "not an integer"),
        (windows_args(tmp_path / "o", "--eval", "chr2"), "in both --train and --eval"),
        (windows_args(tmp_path / "o", "--length", "4M"), "longer than every train chromosome"),
        (windows_args(tmp_path / "o", "--length", "9" * 400 + "K"), "length: <int of 1339 bits> is past the 64-bit"),
        (windows_args(tmp_path / "o", "--length", "9" * 400 + ".5"), "not an integer"),
    ]:
        r = lcft(*args)
        assert r.exit_code == 1, (args, r.output)
        assert needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "o").exists()


def test_a_fasta_where_windows_belong_and_a_missing_fasta_name_the_next_step(tmp_path):
    """A FASTA given as --data, or a --fasta not downloaded yet: the error names the command that makes it."""
    r = lcft("train", "--data", sample_fasta(), "--out", tmp_path / "run")
    assert (r.exit_code, r.stderr) == (1, f"error: {sample_fasta()} is a file, not a folder; expected a folder of "
                                          "windows that `lcft prepare windows --fasta FILE --out DIR` writes\n")
    r = lcft("prepare", "windows", "--fasta", tmp_path / "hg38.fa", "--out", tmp_path / "o")
    assert (r.exit_code, r.stderr) == (1, f"error: FASTA not found: {tmp_path / 'hg38.fa'} (`lcft prepare fetch hg38 "
                                          "--out DIR` downloads the human reference as DIR/hg38.fa)\n")


def test_verify_and_inspect(tmp_path):
    out = tmp_path / "w"
    assert lcft(*windows_args(out, "--length", "64K")).exit_code == 0
    r = lcft("prepare", "verify", out)
    assert r.exit_code == 0 and "4 files" in r.stdout

    r = lcft("prepare", "inspect", out)
    assert r.exit_code == 0 and "chr22" in r.stdout and "skipped for N" in r.stdout
    # windows count tokens (of the tokenizer named), a chromosome's length bases
    assert (f"{out}: windows of 65,536 tokens of tokenizer dna-char (stride 65,536 tokens, max N fraction 0.1) "
            f"from {sample_fasta()}") in " ".join(r.stdout.split())
    assert "length (bases)" in r.stdout

    r = lcft("prepare", "inspect", sample_fasta())
    assert r.exit_code == 0 and "length (bases)" in r.stdout
    assert "2,333,275" in r.stdout and "1,000,000" in r.stdout and "35.64%" in r.stdout  # chr2 soft-masked share

    data = bytearray((out / "eval.softmask.bin").read_bytes())
    data[100] ^= 1
    (out / "eval.softmask.bin").write_bytes(bytes(data))
    r = lcft("prepare", "verify", out)
    assert r.exit_code == 1 and "eval.softmask.bin is corrupt" in r.stderr

    r = lcft("prepare", "verify", tmp_path)
    assert r.exit_code == 1 and "no manifest.json" in r.stderr


def test_verify_counts_the_tokenizer_it_checks(tmp_path):
    """With a model tokenizer verify also checks tokenizer.json: the count it prints is every file it hashed, that
    is every file of the folder but manifest.json and prepare.toml (it had left tokenizer.json out: 8 of 9)."""
    out = tmp_path / "w"
    assert lcft(*windows_args(out, "--length", "8K", "--tokenizer", "kmer:4")).exit_code == 0
    data_files = sorted(p.name for p in out.iterdir() if p.name not in ("manifest.json", "prepare.toml"))
    assert "tokenizer.json" in data_files
    r = lcft("prepare", "verify", out)
    assert r.exit_code == 0 and f"ok: {len(data_files)} files in" in r.stdout, (data_files, r.stdout)


def test_the_summary_keeps_names_and_lines_whole_at_80_columns(tmp_path, monkeypatch):
    """At 80 columns the held-out 22:20000001-21000000 was cut to '22:20000001-210…' though two-line headers
    leave it room, and the caption broke mid-phrase, centred: a line a split now, whole. Its counts: '1 unknown
    token' in the singular (it said '1 unknown tokens')."""
    monkeypatch.setattr(console, "width", 80)
    rng = np.random.default_rng(0)
    seq = "".join(rng.choice(list("ACGT"), 2048))
    fasta = tmp_path / "x.fa"
    held_out = "22:20000001-21000000"
    fasta.write_text(f">a\n{seq[:99]}X{seq[100:]}\n>{held_out}\n{seq}\n")  # X has no token of the char vocabulary
    r = lcft("prepare", "windows", "--fasta", fasta, "--out", tmp_path / "w", "--length", "1K", "--train", "a",
             "--eval", held_out)
    assert r.exit_code == 0, r.output
    lines = [line.rstrip() for line in r.stdout.splitlines()]
    assert max(map(len, lines[:-1])) <= 80 and "…" not in r.stdout, r.stdout  # (the last: `lcft prepare verify`)
    assert any(line.startswith(f"│ eval  │ {held_out} │") for line in lines), r.stdout
    assert ["tokenizer dna-char", "train: 2,048 bases, 1 unknown token", "eval: 2,048 bases, 0 unknown tokens"] == [
        line for line in lines if line.startswith(("tokenizer", "train:", "eval:"))], r.stdout


def test_ctrl_c_says_to_run_the_command_again_where_it_resumes(tmp_path, monkeypatch):
    """A Ctrl-C in prepare windows after its first chromosome: `interrupted` (exit 130) said no more; now it says to
    run the same command again, and that run resumes. inspect, which keeps nothing to go on from, says no more."""
    import lcft.genomics.prepare as P

    real, cut = P._cut_one, []

    def ctrl_c_on_the_second(*args, **kwargs):
        if cut:
            raise KeyboardInterrupt
        cut.append(real(*args, **kwargs))

    monkeypatch.setattr(P, "_cut_one", ctrl_c_on_the_second)
    out = tmp_path / "w"
    r = lcft(*windows_args(out, "--length", "64K"))
    assert (r.exit_code, r.stderr.splitlines()[-1]) == (130, "interrupted: run the same command again to resume")
    monkeypatch.setattr(P, "_cut_one", real)
    r = lcft(*windows_args(out, "--length", "64K"))
    assert r.exit_code == 0 and "resuming: 1 chromosome(s) already done" in r.stderr, r.output

    import lcft.genomics.inspect as inspect

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect, "inspect_fasta", ctrl_c)
    r = lcft("prepare", "inspect", sample_fasta())
    assert (r.exit_code, r.stderr) == (130, "interrupted\n")


def test_sigterm_stops_prepare_as_a_ctrl_c_and_the_rerun_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    """A scheduler's SIGTERM to prepare windows after its first chromosome: it died where it stood, without a word
    (exit -15, its lock file left); now `stopped by SIGTERM` and how to go on, exit 143, and the same command
    resumes to the bytes of an uninterrupted run. (The test's own SIGTERM handler stands for the default one,
    which would end the test process.)"""
    import os
    import signal

    import lcft.genomics.prepare as P

    real, cut = P._cut_one, []

    def sigterm_on_the_second(*args, **kwargs):
        if cut:
            os.kill(os.getpid(), signal.SIGTERM)
        cut.append(real(*args, **kwargs))

    def default(_signum, _frame):
        raise AssertionError("SIGTERM reached the handler prepare found installed")

    old = signal.signal(signal.SIGTERM, default)
    try:
        monkeypatch.setattr(P, "_cut_one", sigterm_on_the_second)
        r = lcft(*windows_args(tmp_path / "w", "--length", "64K"))
        assert signal.getsignal(signal.SIGTERM) is default  # put back when the command ended
    finally:
        signal.signal(signal.SIGTERM, old)
    assert (r.exit_code, r.stderr.splitlines()[-1]) == (143, "stopped by SIGTERM: run the same command again to "
                                                         "resume"), (r.exit_code, r.output, r.exception)
    monkeypatch.setattr(P, "_cut_one", real)
    r = lcft(*windows_args(tmp_path / "w", "--length", "64K"))
    assert r.exit_code == 0 and "resuming: 1 chromosome(s) already done" in r.stderr, r.output
    assert lcft(*windows_args(tmp_path / "whole", "--length", "64K")).exit_code == 0
    for split in ("train", "eval"):
        assert (tmp_path / "w" / f"{split}.bin").read_bytes() == (tmp_path / "whole" / f"{split}.bin").read_bytes()


def test_fetch_rejects_bad_url(tmp_path):
    r = lcft("prepare", "fetch", "hg38", "--out", tmp_path, "--url", "file:///etc/passwd")
    assert r.exit_code == 1 and "not an http(s) URL" in r.stderr


def test_cache_lists_then_removes(tmp_path, monkeypatch):
    """A plain gzip FASTA inspected leaves its decompressed copy in the cache: listed with its size, then
    removed by --remove-unused 0; a negative number of days is a usage error."""
    import gzip

    monkeypatch.setenv("LCFT_CACHE", str(tmp_path / "cache"))
    r = lcft("prepare", "cache")
    assert r.exit_code == 0 and "0 entries, 0 KiB" in r.stdout, r.output
    gz = tmp_path / "s.fa.gz"
    gz.write_bytes(gzip.compress(gzip.decompress(open(sample_fasta(), "rb").read())))  # plain gzip, not BGZF
    assert lcft("prepare", "inspect", gz).exit_code == 0
    r = lcft("prepare", "cache")
    assert r.exit_code == 0 and "decompressed" in r.stdout and "1 entry, " in r.stdout, r.output
    assert "just now" in r.stdout and str(tmp_path / "cache") in r.stdout.replace("\n", "")
    r = lcft("prepare", "cache", "--remove-unused", "0")
    assert r.exit_code == 0 and "removed 1 entry (" in r.stdout and "0 entries, 0 KiB" in r.stdout, r.output
    assert not list((tmp_path / "cache" / "fasta").iterdir())
    r = lcft("prepare", "cache", "--remove-unused", "-1")
    assert r.exit_code == 2 and "--remove-unused" in r.output and "greater than or equal" in r.output


MARKUP_NAMES = ("chr[/]", "x[bold]y", "z[red]")  # rich markup: a closing tag that closes nothing, two styles


def test_names_that_read_as_markup_print_as_written(tmp_path):
    """Record names from a FASTA (and the folder's own path) reach tables, titles, progress bars and errors as
    they are written: '[/]' was a MarkupError traceback in `lcft prepare inspect`, '[bold]' restyled the table."""
    folder = tmp_path / "g[" / "]"  # the path reads '.../g[/]/...'
    folder.mkdir(parents=True)
    fasta = folder / "g.fa"
    fasta.write_text("".join(f">{n}\n" + "ACGT" * 600 + "\n" for n in (*MARKUP_NAMES, "e\x1b[2Jf")))
    r = lcft("prepare", "inspect", fasta)
    assert r.exit_code == 0 and all(n in r.stdout for n in MARKUP_NAMES) and "g[/]/g.fa" in r.stdout, r.output
    assert "e\\x1b[2Jf" in r.stdout and "\x1b" not in r.output  # a terminal escape in a name is shown, not sent
    out = folder / "w[bold]"
    r = lcft("prepare", "windows", "--fasta", fasta, "--out", out, "--train", "chr[/],x[bold]y", "--eval",
             "z[red]", "--length", "1K")
    assert r.exit_code == 0 and "chr[/], x[bold]y" in r.stdout and "g[/]/w[bold]" in r.stdout, r.output
    for command in ("inspect", "verify"):
        r = lcft("prepare", command, out)
        assert r.exit_code == 0 and "g[/]/w[bold]" in r.stdout, r.output
    assert all(n in lcft("prepare", "inspect", out).stdout for n in MARKUP_NAMES)
    r = lcft("prepare", "windows", "--fasta", fasta, "--out", out, "--train", "[/]nope", "--length", "1K")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "[/]nope" in r.output, r.output


@pytest.mark.parametrize("out", ["my windows", "-w", "it's $HOME"])
def test_the_verify_command_prepare_suggests_runs_as_pasted(out, tmp_path, monkeypatch):
    """The `lcft prepare verify ...` that prepare prints is one a shell runs as written: a path with a space, a
    quote or '$' quoted, a relative one starting with '-' not read as an option."""
    import re
    import shlex

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    r = lcft("prepare", "windows", "--fasta", "g.fa", "--out", out, "--length", "64", "--train", "chrA", "--eval", "")
    assert r.exit_code == 0, r.output
    words = shlex.split(re.search(r"`(lcft prepare verify .*)`", " ".join(r.stdout.split())).group(1))
    assert words[:3] == ["lcft", "prepare", "verify"] and len(words) == 4 and not words[3].startswith("-"), words
    assert lcft(*words[1:]).exit_code == 0


def test_the_saved_config_reruns_from_another_working_folder(tmp_path, monkeypatch):
    """prepare.toml holds --fasta and --out as absolute paths (train's config.toml does too), so `--config
    DIR/prepare.toml` from elsewhere is the same job: nothing to do. A built-in tokenizer spec stays as written."""
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    fasta = tmp_path / "here" / "g.fa"
    fasta.write_bytes(open(sample_fasta(), "rb").read())
    r = lcft("prepare", "windows", "--fasta", "g.fa", "--out", "w", "--train", "chr2", "--eval", "chr22",
             "--length", "64K", "--tokenizer", "kmer:3")
    assert r.exit_code == 0, r.output
    saved = (tmp_path / "here" / "w" / "prepare.toml").read_text()
    assert f'fasta = "{fasta}"' in saved and 'tokenizer = "kmer:3"' in saved
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = lcft("prepare", "windows", "--config", tmp_path / "here" / "w" / "prepare.toml")
    assert r.exit_code == 0 and "nothing to do" in r.stderr, r.output
    assert not (tmp_path / "elsewhere" / "w").exists()
