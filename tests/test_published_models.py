"""Each published genome model end to end through the CLI, from its files as published (METAGENE-1's config and
tokenizer, GENERator-eukaryote-3b's config and special tokens with its `TOKEN ID` 6-mer vocab.txt, a
GenomeOcean-like Mistral with a BPE tokenizer.json): a copy scaled to 2 layers with random weights written by
transformers -> prepare -> train 2 steps -> eval -> export; transformers loads the export without remote code and
gives lcft's logits, the published special tokens and tokenization, and every published config key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, trainers
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.cli.app import app
from lcft.genomics import open_windows, sample_fasta
from tests.genomics.conftest import bio_records
from tests.genomics.test_published_tokenizers import PUBLISHED, ROLES, generator_folder, generator_rule
from tests.model.test_hf_config import GENOMEOCEAN

transformers = pytest.importorskip("transformers")
runner = CliRunner()
SEQ = 512  # tokens a window and a training sequence
# (layers, hidden, intermediate, heads) of each scaled copy. Heads are cut where they are a multiple of the KV
# heads (METAGENE-1: 32 = 32 -> 4 = 4, its explicit head_dim 128 kept: 512 query dims over a hidden of 128);
# GENERator keeps 32 heads over 4 KV heads (head_dim 8), GenomeOcean 12 over 4. Every other field as published.
SCALE = {"metagene-1": (2, 128, 344, 4), "generator-eukaryote-3b": (2, 256, 704, 32),
         "genomeocean-like": (2, 96, 384, 12)}
STRIDE = {"metagene-1": "128K", "generator-eukaryote-3b": "96K", "genomeocean-like": "80K"}  # 3-5 train windows
# What export changes on purpose: the standard class for a custom one, no auto_map (no file's code runs), the
# stored dtype under transformers 5's key, no file metadata
CHANGED = {"architectures", "auto_map", "torch_dtype", "dtype", "transformers_version", "_name_or_path"}
CARRIED = {"metagene-1": {"mask_token_id", "max_sequence_length", "sep_token_id", "unk_token_id"},
           "generator-eukaryote-3b": set(), "genomeocean-like": {"classifier_dropout", "is_causal"}}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LCFT_CACHE", str(tmp_path_factory.getbasetemp() / "lcft-cache"))


@pytest.fixture(scope="module")
def sample() -> dict[str, str]:
    return bio_records(sample_fasta())


def lcft(*args: object) -> str:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


def genomeocean_tokenizer(folder: Path, seq: str) -> None:
    """A BPE of 4096 trained with `tokenizers` on the sample, saved by transformers with Mistral's special tokens at
    the ids the config names (unk 0, bos 1, eos 2, pad 3)."""
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.train_from_iterator((seq[i : i + 1000].upper() for i in range(20_000, 620_000, 1000)),
                           trainers.BpeTrainer(vocab_size=4096, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                               show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(folder))


def published_folder(name: str, path: Path, sample: dict[str, str]) -> tuple[Path, dict]:
    """The model's published files (config.json scaled to SCALE) and random weights written by transformers."""
    if not PUBLISHED.is_dir():
        pytest.skip(f"published model files not found at {PUBLISHED}")
    if name == "metagene-1":
        shutil.copytree(PUBLISHED / name, path)
    elif name == "generator-eukaryote-3b":
        generator_folder(path)
        shutil.copy(PUBLISHED / "generator-eukaryote-3b-base" / "config.json", path)
    else:
        path.mkdir()
        (path / "config.json").write_text(json.dumps(GENOMEOCEAN))
        genomeocean_tokenizer(path, sample["chr2"])
    layers, hidden, inter, heads = SCALE[name]
    config = json.loads((path / "config.json").read_text())
    kv = heads if config["num_key_value_heads"] == config["num_attention_heads"] else config["num_key_value_heads"]
    config.update(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                  num_key_value_heads=kv)
    (path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(str(path)),
                                                          dtype=torch.float32)
    model.save_pretrained(str(path))  # model.safetensors, and files of its own put back as published below
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").unlink()
    return path, config


def published_tokens(folder: Path) -> tuple[dict[str, tuple[str, int]], dict[str, int], object]:
    """(each special-token role the published files name with the id their vocabulary gives it, that vocabulary,
    the published tokenizer's own algorithm: DNA -> ids)."""
    roles: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            d = json.loads((folder / name).read_text())
            roles = {r: d[r] for r in ROLES if isinstance(d.get(r), str)} | roles  # the map first, as lcft reads
    if (folder / "tokenizer.json").is_file():
        tk = Tokenizer.from_file(str(folder / "tokenizer.json"))
        index, encode = tk.get_vocab(), lambda s: tk.encode(s, add_special_tokens=False).ids
    else:
        index = {t: int(i) for t, i in (line.split() for line in (folder / "vocab.txt").read_text().splitlines())}
        encode = lambda s: generator_rule(s)[0]  # noqa: E731
    return {r: (t, index[t]) for r, t in roles.items()}, index, encode


@pytest.mark.parametrize("name", list(SCALE))
def test_published_model_end_to_end(name, tmp_path, sample):
    """Train's bits per base are compared with eval's on the training windows: each step's batch is all of them,
    and the learning rate is too small to move the weights between the last step and its checkpoint."""
    folder, published = published_folder(name, tmp_path / name, sample)
    data, run, export = tmp_path / "data", tmp_path / "run", tmp_path / "export"
    lcft("prepare", "windows", "--fasta", sample_fasta(), "--out", data, "--length", SEQ, "--stride", STRIDE[name],
         "--train", "chr2", "--eval", "chr22", "--tokenizer", folder)
    n = len(open_windows(data, "train"))
    assert 3 <= n <= 6, n
    out = lcft("train", "--data", data, "--init", folder, "--out", run, "--seq-len", SEQ, "--steps", 2,
               "--global-batch", n, "--micro-batch", n, "--warmup", 0, "--lr", 1e-12, "--precision", "fp32",
               "--save-every", 0, "--no-progress")
    assert ("own code" in out) == (name == "generator-eukaryote-3b")  # the custom class's one-line note
    assert all(k in out for k in CARRIED[name])  # the one-line note naming the carried keys
    lcft("eval", "--data", data, "-c", run, "--split", "train", "--out", tmp_path / "rep", "--bins", 4,
         "--bootstrap", 10, "-q")
    lcft("export", run, "--out", export)
    summary = json.loads((run / "summary.json").read_text())
    ck = json.loads((tmp_path / "rep" / "eval.json").read_text())["checkpoints"][0]
    assert 0 < ck["tokens"] < ck["bases"]  # each token covers several bases: a figure per base is not per token
    assert summary["bits_per_base"] == pytest.approx(ck["bits_per_base"], rel=0.05)

    exported = json.loads((export / "config.json").read_text())
    standard = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}[published["model_type"]]
    assert exported["architectures"] == [standard] and "auto_map" not in exported
    assert {k: exported.get(k, "absent") for k in published if k not in CHANGED} == \
        {k: v for k, v in published.items() if k not in CHANGED}  # CARRIED among them
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(export)).eval()
    assert type(hf).__name__ == standard
    ids = torch.from_numpy(np.asarray(open_windows(data, "eval")[0], dtype=np.int64))[None]  # (1, SEQ)
    with torch.no_grad():
        theirs = hf(ids).logits  # (1, SEQ, V)
        ours = from_pretrained(Path(summary["checkpoint"])).eval()(ids)  # (1, SEQ, V)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)

    auto = transformers.AutoTokenizer.from_pretrained(str(export))
    roles, index, encode = published_tokens(folder)
    assert {r: (getattr(auto, r), getattr(auto, f"{r}_id")) for r in ROLES if getattr(auto, r) is not None} == roles
    assert len(auto) == len(index)  # no special token added under a new id
    for split in ("train", "eval"):  # the export tokenizes DNA as the published tokenizer does
        chrom, start, end = open_windows(data, split).coords(0)
        seq = sample[chrom][start:end].upper()
        assert auto(seq, add_special_tokens=False).input_ids == encode(seq)
