"""A sharded (`--shard fsdp`, 2 gloo ranks) checkpoint of a k-mer run keeps the data's tokenizer: lcft.json records
its spec and the folder carries its tokenizer files, which transformers.AutoTokenizer loads to the trained ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from lcft.checkpoint.model_files import is_sharded_checkpoint
from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.launch import run
from lcft.train import TrainConfig

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # one 2-rank run of one step


def test_sharded_checkpoint_keeps_the_kmer_tokenizer(tmp_path: Path) -> None:
    data = tmp_path / "data"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=1024, train="chr2", eval="chr22",
                    tokenizer="kmer:3")
    s = run("train", TrainConfig(data=str(data), preset="tiny", out=str(tmp_path / "run"), seq_len=512, steps=1,
                                 global_batch=2, micro_batch=1, precision="fp32", save_every=0, progress=False,
                                 nproc=2, shard="fsdp"))
    ckpt = Path(s["checkpoint"])
    assert is_sharded_checkpoint(ckpt) and not list(ckpt.glob("*.safetensors"))
    ws = open_windows(data, "eval")
    assert json.loads((ckpt / "lcft.json").read_text())["tokenizer"] == ws.manifest["tokenizer"]
    auto = transformers.AutoTokenizer.from_pretrained(str(ckpt))  # reads tokenizer.json + tokenizer_config.json
    assert auto(ws.sequence(0), add_special_tokens=False)["input_ids"] == ws[0].tolist()
