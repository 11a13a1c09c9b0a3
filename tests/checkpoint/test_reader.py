"""lcft.checkpoint.load: one reader of plain and sharded folders, giving each caller what it asks for; only lcft.json's
"weights": "dcp" makes a folder sharded."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from lcft.checkpoint import load, save_pretrained
from lcft.checkpoint.layout import check_tokenizer
from lcft.errors import LcftError
from lcft.model import Llama, LlamaConfig
from lcft.vocab import tokenizer_spec
from tests.one_line import one_line


def tiny(tmp_path: Path) -> tuple[Llama, Path]:
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=2))
    spec = {"name": "test", "vocab_size": 16}
    return model, save_pretrained(model, tmp_path / "m", tokenizer=spec)


def test_a_plain_folder_gives_config_meta_tokenizer_and_the_saved_weights(tmp_path):
    model, folder = tiny(tmp_path)
    got = load(folder)
    assert not got.sharded and got.trainer is None
    assert got.config == json.loads((folder / "config.json").read_text())
    assert got.tokenizer == {"name": "test", "vocab_size": 16} == got.meta["tokenizer"]
    ours, saved = got.model.state_dict(), model.state_dict()
    assert ours.keys() == saved.keys() and all(torch.equal(ours[k], saved[k]) for k in saved)
    assert load(folder, model=False).model is None


def test_a_stray_dcp_folder_does_not_make_a_folder_sharded(tmp_path):
    model, folder = tiny(tmp_path)
    (folder / "dcp").mkdir()
    (folder / "dcp" / ".metadata").write_bytes(b"not read")
    got = load(folder)
    assert not got.sharded
    assert torch.equal(got.model.state_dict()["embed_tokens.weight"], model.state_dict()["embed_tokens.weight"])


def test_trainer_state_of_a_model_folder_is_a_one_line_error(tmp_path):
    _, folder = tiny(tmp_path)
    with pytest.raises(LcftError, match="not a trainer checkpoint"):
        load(folder, model=False, trainer_state=True)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_sharded_checkpoint_reads_as_torch_reads_its_shards(ckpt):
    got = load(ckpt, trainer_state=True)
    assert got.sharded and got.meta["weights"] == "dcp"
    state, optim, _, _ = got.trainer
    assert state.step == 2 and optim is None  # the optimizer state is in dcp/, read with the weights on resume
    ours = got.model.state_dict()
    theirs = {f"model.{k}": torch.empty_like(v) for k, v in ours.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP says it reads in one process: what no_dist asks
        dcp.load(theirs, checkpoint_id=str(ckpt / "dcp"), no_dist=True)  # torch's own reader: the oracle
    assert all(torch.equal(ours[k], theirs[f"model.{k}"]) for k in ours)
    assert all(p.is_meta for p in load(ckpt, materialize=False).model.parameters())


def test_lcft_plan_counts_no_whole_model_copy_for_a_sharded_init_under_fsdp(ckpt):
    """`lcft plan --host-memory`: under fsdp each rank reads its own shards of a sharded --init onto its device
    (lcft.train.sharded), so no rank holds the whole model in host memory; one process reads it whole (4 B x P,
    P the loaded model's)."""
    from lcft.config_build import resolve
    from lcft.plan.config import PlanConfig
    from lcft.plan.estimate import estimate
    from lcft.plan.plan import layout, model_config

    def weights_read(**opts) -> int:
        cfg = resolve(PlanConfig, None, {"init": str(ckpt), "seq_len": 1024, "host_memory": "100GiB", **opts})
        model = model_config(cfg)
        return estimate(model, layout(cfg, model)).load

    assert weights_read(nproc=2, shard="fsdp") == 0
    assert weights_read(nproc=1) == 4 * load(ckpt).model.num_parameters() > 0


@pytest.mark.parametrize("spec", [["dna-char"], {"name": "x"}, {"name": "x", "vocab_size": "16"},
                                  {"name": 7, "vocab_size": 16}, {"name": "x", "vocab_size": 16, "sha256": 5},
                                  {"name": "x", "vocab_size": 16, "roles": ["<pad>"]}])
def test_a_tokenizer_record_of_other_kinds_is_one_line(tmp_path, spec):
    """lcft.json's tokenizer record is compared with the data's and shown in errors (its sha256 cut, its name and
    vocab_size printed): a field of another kind was an AttributeError or TypeError there."""
    _, folder = tiny(tmp_path)
    meta = json.loads((folder / "lcft.json").read_text())
    (folder / "lcft.json").write_text(json.dumps({**meta, "tokenizer": spec}))
    for read in (lambda: load(folder), lambda: check_tokenizer(folder, tokenizer_spec())):
        one_line(read, str(folder / "lcft.json"), "corrupt tokenizer record")


def test_running_out_of_memory_reading_a_sharded_model_is_one_line(ckpt, monkeypatch):
    """The allocator failing while a sharded model is laid out in memory (a model larger than this host) was
    torch's traceback; it is one line naming the folder and the model's size. The failure is torch's own
    message, raised where the allocation happens."""
    def no_memory(self, *args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 137438953472 bytes. Error code 12")

    monkeypatch.setattr(torch.nn.Module, "to_empty", no_memory)
    one_line(lambda: load(ckpt), f"{ckpt}: not enough memory to read the model (", " parameters)")


def test_a_generation_config_is_read_as_stored(tmp_path):
    """A model folder's generation_config.json is given as its bytes, whatever their spacing (the checkpoints and
    exports of the model carry it unchanged); a folder without one gives None."""
    _, folder = tiny(tmp_path)
    assert load(folder, model=False).generation is None
    text = '{"eos_token_id": [2, 3],\n  "max_length": 4096, "temperature": 0.7, "note": "\u00e9"}\n'.encode()
    (folder / "generation_config.json").write_bytes(text)
    assert load(folder, model=False).generation == text


@pytest.mark.parametrize("bad, said", [("[1, 2]", "generation_config.json: not a JSON object"),
                                       ('{"max_length": ', "generation_config.json: not valid JSON")])
def test_a_generation_config_that_is_no_json_object_is_one_line(tmp_path, bad, said):
    """generation_config.json is a file handed with the model: a JSON object, else one line naming it (deep, huge,
    no regular file: tests/test_hostile_readers.py)."""
    _, folder = tiny(tmp_path)
    path = folder / "generation_config.json"
    path.write_text(bad)
    one_line(lambda: load(folder, model=False), str(path), said)
