"""Crafted JSON and TOML files through the readers that take them: nesting 200,000 levels deep (Python's parsers
give up with a RecursionError), nesting Python's JSON parser accepts but lcft's tokenizer walk and the tokenizers
library would not, integers past Python's digit limit, bytes that are not UTF-8. Each is one line naming the file
(exit 1 and `error: ...` on the command line), never a traceback; nesting up to the documented limit of 100
levels still reads."""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from lcft.checkpoint.dcp import _param_groups
from lcft.checkpoint.hf_folder import read_config
from lcft.checkpoint.layout import read_model_meta, verify_checkpoint
from lcft.checkpoint.model_files import read_generation_config
from lcft.checkpoint.state import read_state
from lcft.config import ConfigError
from lcft.config_toml import MAX_TOML_BYTES, load_toml
from lcft.files import read_json
from lcft.genomics import sample_fasta
from lcft.genomics.model_tokenizer import load_tokenizer, tokenizer_from_json_text
from lcft.genomics.shards import read_manifest
from lcft.genomics.vocab_file import read_roles
from lcft.train.metrics import MetricsLog, read_metrics
from tests.conftest import SHARED_PUBLISHED
from tests.one_line import cli_fails, one_line
from tests.test_files import NON_FILES, plant
from tests.train.conftest import data_dir, init_dir  # noqa: F401  (fixtures, by name)
from tests.unprivileged import unprivileged

DEEP = 200_000
LIMIT = 100  # the nesting lcft documents for a JSON or TOML file (lcft.files.MAX_NESTING)
HUGE_INT = "1" * 5000  # past Python's 4300-digit limit for int(str)


def nested(depth: int) -> str:
    """A JSON object whose value "a" nests `depth` - 1 lists: `depth` levels in all."""
    return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def _model(tmp_path: Path, init_dir: Path) -> Path:  # noqa: F811
    folder = tmp_path / "model"
    shutil.copytree(init_dir, folder)
    return folder


def _state_dir(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    (ckpt / "trainer_state").mkdir(parents=True)
    (ckpt / "dcp").mkdir()
    return ckpt


# (file name, where it goes under tmp_path, the reader that takes it)
READERS = {
    "config.json": lambda d: read_config(d / "model"),
    "lcft.json": lambda d: read_model_meta(d / "model"),
    "generation_config.json": lambda d: read_generation_config(d / "model"),
    "checksums.json": lambda d: verify_checkpoint(d / "model"),
    "manifest.json": lambda d: read_manifest(d / "windows"),
    "tokenizer.json": lambda d: load_tokenizer(str(d / "tok" / "tokenizer.json")),
    "special_tokens_map.json": lambda d: read_roles(d / "tok", ["A", "C", "G", "T"]),
    "tokenizer_config.json": lambda d: read_roles(d / "tok", ["A", "C", "G", "T"]),
    "state.json": lambda d: read_state(d / "ckpt"),
    "param_groups.json": lambda d: _param_groups(d / "ckpt", [{"params": ["w"]}]),
}
PLACES = {"config.json": "model", "lcft.json": "model", "generation_config.json": "model", "checksums.json": "model",
          "manifest.json": "windows",
          "tokenizer.json": "tok", "special_tokens_map.json": "tok", "tokenizer_config.json": "tok",
          "state.json": "ckpt/trainer_state", "param_groups.json": "ckpt/dcp"}


@pytest.fixture
def folders(tmp_path, init_dir, data_dir) -> Path:  # noqa: F811
    _model(tmp_path, init_dir)
    shutil.copytree(data_dir, tmp_path / "windows")
    (tmp_path / "tok").mkdir()
    _state_dir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("text, why", [(nested(DEEP), "nested deeper"), (nested(LIMIT + 1), "nested deeper"),
                                       ('{"a": ' + HUGE_INT + "}", "not valid JSON")],
                         ids=["200000-deep", "101-deep", "5000-digit-int"])
@pytest.mark.parametrize("name", list(READERS))
def test_hostile_json_is_one_line_naming_the_file(folders, name, text, why):
    path = folders / PLACES[name] / name
    path.write_text(text)
    one_line(lambda: READERS[name](folders), str(path), why)  # refused for what it is, not for a later check



@pytest.mark.parametrize("kind", NON_FILES)
@pytest.mark.parametrize("name", ["lcft.json", "checksums.json", "special_tokens_map.json", "tokenizer_config.json",
                                  "param_groups.json", "generation_config.json"])
def test_an_optional_file_there_but_no_regular_file_is_one_line_not_none(folders, name, kind):
    """Files a folder may lack, read when there: one there but no regular file was read as none (a sparse model as
    dense, a checkpoint taken unverified, a tokenizer's roles or an optimizer's saved groups dropped)."""
    path = plant(folders / PLACES[name] / name, kind)
    one_line(lambda: READERS[name](folders), str(path))

@pytest.mark.parametrize("name", ["config.json", "lcft.json", "special_tokens_map.json", "tokenizer_config.json",
                                  "generation_config.json"])
def test_a_model_folders_small_json_over_16_mib_is_one_line(folders, name):
    """A model folder's small files (its index: tests/model/test_hostile_weights.py) were read up to 1 GiB: a
    100 MB config.json took 39 s and 2.3 GB to plan, and its carried keys went into every checkpoint. lcft.json
    too, by each of its readers (the model's config reads its attention block)."""
    path = folders / PLACES[name] / name
    path.write_text(json.dumps({"blob": "x" * (16 << 20)}))
    one_line(lambda: READERS[name](folders), str(path), "over the limit of 16777216")
    if name == "lcft.json":
        one_line(lambda: read_config(folders / "model"), str(path), "over the limit of 16777216")


def _published_tokenizer(tmp_path: Path, name: str, value: object, decided: bool) -> Path:
    """metagene-1's tokenizer files with `name`'s bos_token set to `value` (special_tokens_map.json's removed
    unless `decided`: it is read first), as the path of that file."""
    published = SHARED_PUBLISHED / "metagene-1"
    if not published.is_dir():
        pytest.skip(f"published files not found at {published}")
    shutil.copytree(published, tmp_path / "tok")
    first = tmp_path / "tok" / "special_tokens_map.json"
    roles = json.loads(first.read_text())
    first.write_text(json.dumps(roles if decided else {k: v for k, v in roles.items() if k != "bos_token"}))
    path = tmp_path / "tok" / name
    path.write_text(json.dumps({**json.loads(path.read_text()), "bos_token": value}))
    return path


@pytest.mark.parametrize("name", ["special_tokens_map.json", "tokenizer_config.json"])
@pytest.mark.parametrize("value", [5, {"content": ["x"]}, ["[BOS]"]], ids=str)
def test_a_role_that_is_not_a_token_is_one_line_naming_the_file_and_role(tmp_path, name, value):
    """transformers refuses to load such a file; lcft passed over the role, and the manifest and export lost BOS.
    Where special_tokens_map.json, read first, names the role, tokenizer_config.json's value is read by neither."""
    transformers = pytest.importorskip("transformers")
    path = _published_tokenizer(tmp_path, name, value, decided=False)
    with pytest.raises(TypeError):  # the oracle: transformers does not load it either
        transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    one_line(lambda: load_tokenizer(str(tmp_path / "tok")), f"{path}: bos_token is ", "not a token")
    if name == "tokenizer_config.json":
        shutil.rmtree(tmp_path / "tok")
        _published_tokenizer(tmp_path, name, value, decided=True)
        assert transformers.AutoTokenizer.from_pretrained(tmp_path / "tok").bos_token == "[BOS]"
        assert load_tokenizer(str(tmp_path / "tok")).roles["bos_token"] == "[BOS]"


@pytest.mark.parametrize("name", ["special_tokens_map.json", "tokenizer_config.json"])
def test_a_null_role_is_no_role_as_transformers_reads_it(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    _published_tokenizer(tmp_path, name, None, decided=False)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "tok").bos_token is None
    assert "bos_token" not in load_tokenizer(str(tmp_path / "tok")).roles


def test_nesting_up_to_the_limit_reads(tmp_path):
    assert json.loads(nested(LIMIT + 1))  # Python's parser reads 101 levels: lcft's limit refuses them above
    p = tmp_path / "x.json"
    p.write_text(nested(LIMIT))
    assert read_json(p)["a"] == json.loads(nested(LIMIT))["a"]
    p.write_text(json.dumps([[1]]))
    assert read_json(p, want=list) == [[1]]
    one_line(lambda: read_json(p), str(p), "not a JSON object")


def test_tokenizer_nested_within_pythons_parser_is_refused(tmp_path):
    """A normalizer nesting 300 Sequences (600 JSON levels): Python's JSON parser reads it, the walk for regexes
    recursed past Python's limit; the tokenizers library itself refuses it (the oracle), so lcft refuses it too."""
    from tokenizers import Tokenizer, models

    tk = Tokenizer(models.WordLevel({"A": 0, "C": 1, "G": 2, "T": 3, "[UNK]": 4}, unk_token="[UNK]"))
    seq = '{"type": "Sequence", "normalizers": [' * 300 + '{"type": "Lowercase"}' + "]}" * 300
    text = tk.to_str().replace('"normalizer":null', '"normalizer":' + seq)
    assert json.loads(text)["normalizer"]["type"] == "Sequence"
    with pytest.raises(Exception, match="recursion limit"):
        Tokenizer.from_str(text)
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    one_line(lambda: load_tokenizer(str(path)), str(path))
    # the copy kept with prepared windows is read from its text
    one_line(lambda: tokenizer_from_json_text(text, str(path)), str(path))
    one_line(lambda: tokenizer_from_json_text(nested(DEEP), str(path)), str(path))


def test_deep_metrics_line_is_dropped_like_a_garbled_one(tmp_path):
    """Resuming at step 2 keeps the records of steps 1 and 2; a line nested 200,000 deep is not a step record."""
    path = tmp_path / "metrics.jsonl"
    records = [json.dumps({"step": s, "loss": 1.0}) for s in (1, 2)]
    path.write_text("\n".join([records[0], nested(DEEP), records[1], json.dumps({"step": 3})]) + "\n")
    one_line(lambda: read_metrics(tmp_path), f"{path} line 2")
    MetricsLog(path, resume_step=2).close()
    assert path.read_text().splitlines() == records
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_metrics_file_this_user_cannot_read_is_one_line_naming_it(tmp_path):
    """A resume cuts metrics.jsonl to its checkpoint's step: one of mode 0 (another owner's, say) was read whole and
    raised PermissionError, a traceback; the file is left as it was."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n")
    path.chmod(0)
    tmp_path.chmod(0o777)
    r = unprivileged([sys.executable, "-c", "from lcft.errors import LcftError\n"
                      "from lcft.train.metrics import MetricsLog\n"
                      f"try: MetricsLog({str(path)!r}, resume_step=1)\n"
                      "except LcftError as e: raise SystemExit(f'error: {e}')"])
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.strip() == f"error: {path}: cannot read it to resume the run (Permission denied)", r.stderr[-2000:]
    assert path.stat().st_mode & 0o777 == 0


@pytest.mark.parametrize("data", [("a = " + "[" * DEEP + "]" * DEEP + "\n").encode(),
                                  ("a = " + "[" * LIMIT + "]" * LIMIT + "\n").encode(),
                                  b'length = "\xff\xfe"\n', ("length = " + HUGE_INT + "\n").encode()],
                         ids=["200000-deep", "101-deep", "not-utf8", "5000-digit-int"])
def test_hostile_toml_is_one_line_naming_the_file(tmp_path, data):
    path = tmp_path / "c.toml"
    path.write_bytes(data)
    one_line(lambda: load_toml(path), str(path), error=ConfigError)
    prepare = ["prepare", "windows", "--fasta", str(sample_fasta()), "--length", "1024", "--train", "chr2",
               "--eval", "chr22", "--out", str(tmp_path / "out")]
    cli_fails([*prepare, "--config", str(path)], str(path))
    assert not (tmp_path / "out").exists()


def test_nested_toml_up_to_the_limit_reads(tmp_path):
    path = tmp_path / "c.toml"
    text = "a = " + "[" * (LIMIT - 1) + "]" * (LIMIT - 1) + "\n"  # the table and 99 lists
    path.write_text(text)
    assert load_toml(path) == tomllib.loads(text)


def test_a_toml_over_the_limit_is_one_line_before_it_is_read(tmp_path):
    """A config of MAX_TOML_BYTES + 1 bytes (valid TOML: one long string) is refused by its size; one at the limit
    reads. A checkpoint's config.toml comes with folders others hand over: read whole, one of gigabytes was a
    MemoryError (or all the machine's memory) under `lcft eval`."""
    path = tmp_path / "c.toml"
    head = 'note = "'
    for size, refused in ((MAX_TOML_BYTES + 1, True), (MAX_TOML_BYTES, False)):
        path.write_text(head + "x" * (size - len(head) - 2) + '"\n')
        assert path.stat().st_size == size
        if refused:
            one_line(lambda: load_toml(path), str(path), f"over the limit of {MAX_TOML_BYTES}", error=ConfigError)
        else:
            assert len(load_toml(path)["note"]) == size - len(head) - 2


def test_deep_json_on_the_command_line(tmp_path, init_dir, data_dir):  # noqa: F811
    """`lcft export` (config.json), `lcft eval --data` (manifest.json), `lcft prepare windows --tokenizer`."""
    model = _model(tmp_path, init_dir)
    (model / "config.json").write_text(nested(DEEP))
    cli_fails(["export", str(model), "--out", str(tmp_path / "hf")], str(model / "config.json"))
    assert not (tmp_path / "hf").exists()
    windows = tmp_path / "windows"
    shutil.copytree(data_dir, windows)
    (windows / "manifest.json").write_text(nested(DEEP))
    cli_fails(["eval", "--data", str(windows), "--checkpoint", str(init_dir), "--out", str(tmp_path / "ev")],
              str(windows / "manifest.json"))
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(nested(DEEP))
    cli_fails(["prepare", "windows", "--fasta", str(sample_fasta()), "--length", "1024", "--train", "chr2",
               "--eval", "chr22", "--out", str(tmp_path / "out"), "--tokenizer", str(tok)], str(tok / "tokenizer.json"))
