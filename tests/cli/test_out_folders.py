"""Every --out is refused, in one line and before anything is written, when it is a folder lcft reads back as
something else (the --data windows, a run, a checkpoint, a model folder) or the folder holding --fasta, or when
a name is too long for the file system; a file given where a folder belongs, or a link leading back to itself given
for any path, is the same line from every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.evaluate.conftest import data_dir, save_model  # noqa: F401 (fixture)
from tests.one_line import cli_fails


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def _kinds(tmp_path: Path) -> dict[str, Path]:
    """A model folder, a run folder with one checkpoint, and a folder holding a FASTA."""
    model = save_model(tmp_path / "model", seed=1)
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state").mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 16}))
    (tmp_path / "run" / "config.toml").write_text('steps = 1\n')
    (tmp_path / "w2").mkdir()
    (tmp_path / "w2" / "manifest.json").write_text("{}")  # another windows folder (what its kind is told by)
    (tmp_path / "genome").mkdir()
    (tmp_path / "genome" / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    return {"model": model, "run": tmp_path / "run", "ckpt": ckpt, "fasta": tmp_path / "genome" / "g.fa",
            "windows": tmp_path / "w2"}


@pytest.mark.parametrize("case", ["train-into-data", "train-into-model", "train-into-checkpoint",
                                  "eval-into-data", "eval-into-checkpoint", "export-into-run",
                                  "prepare-into-run", "prepare-into-fasta-folder", "export-into-windows",
                                  "train-into-other-windows"])
def test_out_of_another_kind_is_one_line_and_writes_nothing(case, data_dir, tmp_path):  # noqa: F811
    k = _kinds(tmp_path)
    data = str(data_dir)
    args, needle = {
        "train-into-data": (["train", "--data", data, "--out", data, "--steps", "1"], f"is --data {data}"),
        "train-into-model": (["train", "--data", data, "--out", str(k["model"])], "is a model folder"),
        "train-into-checkpoint": (["train", "--data", data, "--out", str(k["ckpt"])], "is a checkpoint"),
        "eval-into-data": (["eval", "--data", data, "-c", str(k["model"]), "--out", data], f"is --data {data}"),
        "eval-into-checkpoint": (["eval", "--data", data, "-c", str(k["model"]), "--out", str(k["ckpt"])],
                            "is a checkpoint"),
        "export-into-windows": (["export", str(k["model"]), "--out", data, "--force"],
                                "is a prepared windows folder"),
        "train-into-other-windows": (["train", "--data", data, "--out", str(k["windows"])],
                                     "is a prepared windows folder"),
        "export-into-run": (["export", str(k["model"]), "--out", str(k["run"]), "--force"],
                            "is a training run's folder"),
        "prepare-into-run": (["prepare", "windows", "--fasta", str(k["fasta"]), "--out", str(k["run"]),
                              "--length", "64", "--train", "chrA", "--eval", ""], "is a training run's folder"),
        "prepare-into-fasta-folder": (["prepare", "windows", "--fasta", str(k["fasta"]), "--out",
                                       str(k["fasta"].parent), "--length", "64", "--train", "chrA", "--eval", ""],
                                      f"holds --fasta {k['fasta']}"),
    }[case]
    before = {name: _listing(p) for name, p in (("data", data_dir), ("tmp", tmp_path))}
    cli_fails(args, needle, "choose another --out")
    assert {name: _listing(p) for name, p in (("data", data_dir), ("tmp", tmp_path))} == before


@pytest.mark.parametrize("case", ["train-out", "eval-out", "export-out", "prepare-out", "demo-out", "train-data",
                                  "eval-data", "plan-data", "eval-manifest"])
@pytest.mark.parametrize("under", [False, True])
def test_a_file_where_a_folder_belongs_is_the_same_line_in_every_command(case, under, data_dir, tmp_path):  # noqa: F811
    """--out or --data naming a file, or a path under one: one line naming it, from each command alike, the file
    as it was. eval and train said only the OS's 'File exists' or 'Not a directory' for --out, eval 'data folder not
    found' for a --data that is there, as a file; --data naming the manifest is told to give its folder."""
    model = save_model(tmp_path / "model", seed=1)
    (tmp_path / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    given = notes / "sub" if under else notes
    data, out = str(data_dir), str(tmp_path / "out")
    if case == "eval-manifest":
        given = data_dir / "manifest.json" / "sub" if under else data_dir / "manifest.json"
    option, args = case.split("-")[1], {
        "train": ["train", "--data", data, "--out", out, "--steps", "1"],
        "eval": ["eval", "--data", data, "-c", str(model), "--out", out],
        "export": ["export", str(model), "--out", out],
        "prepare": ["prepare", "windows", "--fasta", str(tmp_path / "g.fa"), "--out", out, "--length", "64",
                    "--train", "chrA", "--eval", ""],
        "demo": ["demo", "--out", out],
        "plan": ["plan", "--preset", "tiny", "--data", data],
    }[case.split("-")[0]]
    option = "--out" if option == "out" else "--data"
    args[args.index(option) + 1] = str(given)
    before = {name: _listing(p) for name, p in (("data", data_dir), ("tmp", tmp_path))}
    said = cli_fails(args)
    file = given.parent if under else given
    if case == "eval-manifest" and not under:
        assert said == f"error: {given} is a windows folder's manifest: give the folder {data_dir}"
    else:
        named = f"--out {given}" if option == "--out" else str(given)
        hint = "" if option == "--out" else "; expected a folder of windows that `lcft prepare windows --fasta FILE " \
                                            "--out DIR` writes"
        assert said == f"error: {named}{f': {file}' if under else ''} is a file, not a folder{hint}"
    assert {name: _listing(p) for name, p in (("data", data_dir), ("tmp", tmp_path))} == before


@pytest.mark.parametrize("command", ["export", "eval", "prepare", "prepare-fasta"])
def test_a_name_too_long_for_the_file_system_is_one_line(command, data_dir, tmp_path):  # noqa: F811
    """A name over the file system's 255 bytes, given (--out) or made from one given (export's '.NAME.tmp'
    sibling of a 255-byte --out, a FASTA's '.fai' beside it): one line saying so, nothing written."""
    model = save_model(tmp_path / "model", seed=1)
    fasta = tmp_path / ("g" * 252 + ".fa")  # its index, NAME.fai, is 256 bytes
    fasta.write_text(">chrA\n" + "ACGT" * 64 + "\n")
    long, windows = str(tmp_path / ("o" * 256)), ["--length", "64", "--train", "chrA", "--eval", ""]
    args = {"export": ["export", str(model), "--out", str(tmp_path / ("o" * 255))],
            "eval": ["eval", "--data", str(data_dir), "-c", str(model), "--out", long],
            "prepare": ["prepare", "windows", "--fasta", str(tmp_path / "model" / "config.json"), "--out", long,
                        *windows],
            "prepare-fasta": ["prepare", "windows", "--fasta", str(fasta), "--out", str(tmp_path / "w"), *windows],
            }[command]
    before = _listing(tmp_path)
    cli_fails(args, "name too long for the file system", "choose a shorter")
    assert _listing(tmp_path) == before


def test_export_reads_a_leading_tilde_as_the_home_folder(tmp_path, monkeypatch):
    """`lcft export ~/model --out=~/x`: the shell leaves '~' after '=' (and in a quoted argument) as it is; lcft
    reads it as the home folder, as every config command does (lcft.config_build.home), never a folder named '~'."""
    from typer.testing import CliRunner

    from lcft.cli.app import app

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    save_model(tmp_path / "home" / "model", seed=1)
    r = CliRunner().invoke(app, ["export", "~/model", "--out=~/x"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "home" / "x" / "config.json").is_file() and not (tmp_path / "~").exists()


@pytest.mark.parametrize("case", ["train-out", "eval-out", "export-out", "prepare-out", "train-data", "eval-data",
                                  "eval-checkpoint", "prepare-fasta", "train-init", "train-resume", "eval-out-under"])
def test_a_path_through_a_loop_of_links_is_one_line_in_every_command(case, data_dir, tmp_path):  # noqa: F811
    """Any path option given a link that leads back to itself (or a path under one): one line naming it, nothing
    written; making it absolute, or comparing it with the command's inputs, was Python's RuntimeError traceback."""
    model = save_model(tmp_path / "model", seed=1)
    (tmp_path / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    links = tmp_path / "links"
    links.mkdir()
    (links / "a").symlink_to(links / "b")
    (links / "b").symlink_to(links / "a")
    loop = links / "a" / "x" if case.endswith("-under") else links / "a"
    data, out, command, option = str(data_dir), str(tmp_path / "out"), *case.split("-")[:2]
    args = {
        "train": ["train", "--data", data, "--out", out, "--steps", "1", "--init", str(model)],
        "eval": ["eval", "--data", data, "-c", str(model), "--out", out],
        "export": ["export", str(model), "--out", out],
        "prepare": ["prepare", "windows", "--fasta", str(tmp_path / "g.fa"), "--out", out, "--length", "64",
                    "--train", "chrA", "--eval", ""],
    }[command]
    if option == "resume":
        args += ["--resume", str(loop)]
    else:
        args[args.index("-c" if option == "checkpoint" else f"--{option}") + 1] = str(loop)
    before = {name: _listing(p) for name, p in (("data", data_dir), ("model", model))}
    assert cli_fails(args) == f"error: {loop}: cannot follow its links (symbolic links in a loop)"
    assert {name: _listing(p) for name, p in (("data", data_dir), ("model", model))} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.fa", "links", "model"]


@pytest.mark.parametrize("command", ["train", "train-nproc", "eval", "export", "prepare", "demo"])
@pytest.mark.parametrize("under", [False, True])
def test_an_out_through_a_link_to_nothing_is_one_line_before_any_work(command, under, data_dir, tmp_path):  # noqa: F811
    """--out a link to a folder not made yet (a scratch space's, not mounted here), or a path under one: one line
    naming the link and where it leads, nothing written, by every command; export built the whole model first,
    then failed with the OS's 'Not a directory'; train and eval made the folder the link leads to (their paths
    resolved first), a run written where a scratch space was expected."""
    model = save_model(tmp_path / "model", seed=1)
    (tmp_path / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    link = tmp_path / "scratch"
    link.symlink_to(tmp_path / "gone" / "run")
    out = link / "x" if under else link
    train = ["train", "--data", str(data_dir), "--out", str(out), "--steps", "1", "--init", str(model)]
    args = {
        "train": train,
        "train-nproc": [*train, "--nproc", "2"],
        "eval": ["eval", "--data", str(data_dir), "-c", str(model), "--out", str(out)],
        "export": ["export", str(model), "--out", str(out)],
        "prepare": ["prepare", "windows", "--fasta", str(tmp_path / "g.fa"), "--out", str(out), "--length", "64",
                    "--train", "chrA", "--eval", ""],
        "demo": ["demo", "--out", str(out)],
    }[command]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    said = f"error: --out {out}{f': {link}' if under else ''} is a link to {tmp_path / 'gone' / 'run'}, which is not "
    assert cli_fails(args) == said + "there; create that folder or give another path"
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
