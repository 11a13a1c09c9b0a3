"""Checkpoint I/O: round trips, lcft.json, atomic writes, transformers' sharded folders, clear errors for bad
folders, and the `lcft export` command."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.checkpoint.layout import read_model_meta, resolve_checkpoint
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.genomics.tokenizer import tokenizer_spec
from lcft.kernels.spec import SparseSpec
from lcft.model import AttentionConfig, Llama, LlamaConfig
from tests.one_line import cli_fails, one_line, refused
from tests.test_files import NON_FILES, plant

runner = CliRunner()


def small(tied: bool = False, seed: int = 0, **kw) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, tie_word_embeddings=tied, **kw))


def same_weights(a: Llama, b: Llama) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_is_exact_and_layout_is_hf(tmp_path, tied):
    m = small(tied, rope_scaling={"rope_type": "linear", "factor": 2.0},
              attention=AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=32, top_k=4)))
    save_pretrained(m, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "lcft.json", "model.safetensors"]
    keys = set(load_file(tmp_path / "ckpt" / "model.safetensors"))
    assert "model.embed_tokens.weight" in keys and "model.layers.1.self_attn.q_proj.weight" in keys
    assert "model.layers.0.input_layernorm.weight" in keys and "model.layers.0.post_attention_layernorm.weight" in keys
    assert ("lm_head.weight" in keys) == (not tied)
    extra = json.loads((tmp_path / "ckpt" / "lcft.json").read_text())
    assert extra["tokenizer"] == tokenizer_spec() and extra["attention"]["backend"] == "sparse"
    back = from_pretrained(tmp_path / "ckpt")
    assert back.config == m.config and same_weights(back, m)
    dense = from_pretrained(tmp_path / "ckpt", attention=AttentionConfig())  # override the recorded backend
    assert dense.config.attention.backend == "dense" and same_weights(dense, m)



@pytest.mark.parametrize("kind", NON_FILES)
def test_an_lcft_json_that_is_no_file_is_refused_not_read_as_dense(tmp_path, kind):
    """A sparse model folder whose lcft.json is there but no regular file loaded as a folder transformers wrote
    (dense attention, no tokenizer record), so it was evaluated and exported as dense without a word: one line
    naming it now. None there is still such a folder."""
    m = small(attention=AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=32, top_k=4)))
    folder = save_pretrained(m, tmp_path / "ckpt")
    meta = plant(folder / "lcft.json", kind)
    one_line(lambda: from_pretrained(folder), str(meta))
    one_line(lambda: read_model_meta(folder), str(meta))
    cli_fails(["export", str(folder), "--out", str(tmp_path / "hf")], str(meta))
    assert not (tmp_path / "hf").exists()
    (meta.rmdir if kind == "folder" else meta.unlink)()
    assert from_pretrained(folder).config.attention == AttentionConfig() and read_model_meta(folder) == {}

def test_bf16_save_and_save_into_existing_folder_keeps_other_files(tmp_path):
    m = small()
    folder = tmp_path / "step-1"
    folder.mkdir()
    (folder / "trainer_state").mkdir()  # the trainer writes its state beside the model
    save_pretrained(m, folder, dtype=torch.bfloat16)
    assert (folder / "trainer_state").is_dir() and not list(folder.glob(".*tmp*"))
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    back = from_pretrained(folder)
    assert back.embed_tokens.weight.dtype == torch.bfloat16
    torch.testing.assert_close(back.embed_tokens.weight.float(), m.embed_tokens.weight.bfloat16().float())


def test_reads_transformers_sharded_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    m = small()
    save_pretrained(m, tmp_path / "ours")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    back = from_pretrained(tmp_path / "sharded")
    assert same_weights(back, m) and back.config.attention == AttentionConfig()


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    import lcft.checkpoint.hf_folder as io

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(io, "save_file", boom)
    with pytest.raises(OSError):
        save_pretrained(small(), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_new_model_folder_where_the_file_system_will_not_rename_it_is_one_line(tmp_path, monkeypatch):
    """save_pretrained to a new folder writes a temp sibling and renames it: a file system that refuses (EXDEV, as
    some FUSE mounts) is one line naming the remedy, and nothing stays (it was the OS's traceback); another
    error of that rename (EIO) is still the OS's."""
    import errno
    import os

    real = os.replace

    def fuse(src, dst, err=errno.EXDEV):
        if os.path.isdir(src):
            raise OSError(err, os.strerror(err))
        real(src, dst)

    monkeypatch.setattr(os, "replace", fuse)
    msg = one_line(lambda: save_pretrained(small(), tmp_path / "m"))
    assert msg == f"cannot write the model folder {tmp_path / 'm'}: {refused(tmp_path, errno.EXDEV)}"
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(os, "replace", lambda src, dst: fuse(src, dst, errno.EIO))
    with pytest.raises(OSError, match="Input/output error"):
        save_pretrained(small(), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_a_save_into_a_folder_that_fails_midway_leaves_it_unloadable(tmp_path, monkeypatch):
    """A sharded save over an earlier one that fails at its second shard: the folder held the old config.json
    beside the first new shard and the old others (it loaded, a mix of two models); now no config.json until
    the save is whole."""
    import lcft.checkpoint.hf_folder as io

    folder = tmp_path / "m"
    save_pretrained(small(), folder, max_shard_size=20_000)
    assert len(list(folder.glob("model-*.safetensors"))) > 2
    real, calls = io.save_file, []

    def second_shard_fails(tensors, path, **kw):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(tensors, path, **kw)

    monkeypatch.setattr(io, "save_file", second_shard_fails)
    with pytest.raises(OSError):
        save_pretrained(small(seed=1), folder, max_shard_size=20_000)
    assert not (folder / "config.json").exists()
    with pytest.raises(LcftError):
        from_pretrained(folder)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "model-00002-of-00009.safetensors"])
def test_a_save_over_a_folder_named_like_a_model_file_changes_nothing(tmp_path, name):
    """A save into an existing folder where a folder stands under a name it writes (or removes: an earlier
    save's shard): a one-line error naming it, before any file there is replaced or removed."""
    folder = tmp_path / "m"
    save_pretrained(small(), folder)
    (folder / name).unlink(missing_ok=True)
    (folder / name).mkdir()
    before = {p.name: p.is_dir() or p.read_bytes() for p in folder.iterdir()}
    one_line(lambda: save_pretrained(small(seed=1), folder), str(folder / name), "is a folder")
    assert {p.name: p.is_dir() or p.read_bytes() for p in folder.iterdir()} == before


def write_ok(tmp_path):
    save_pretrained(small(), tmp_path / "ok")
    return tmp_path / "ok"


def test_a_weight_stored_in_two_shards_is_refused(tmp_path):
    """transformers' sharded folder with lm_head.weight also planted in another shard (all 7.0): which copy the
    model got would depend on the order the shards are read; refused with one line instead."""
    transformers = pytest.importorskip("transformers")
    save_pretrained(small(), tmp_path / "ours")
    transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").save_pretrained(tmp_path / "sh",
                                                                                     max_shard_size="20KB")
    index = json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())["weight_map"]
    other = next(f for f in sorted(set(index.values())) if f != index["lm_head.weight"])
    tensors = load_file(tmp_path / "sh" / other)
    head = load_file(tmp_path / "sh" / index["lm_head.weight"])["lm_head.weight"]
    save_file({**tensors, "lm_head.weight": torch.full_like(head, 7.0)}, str(tmp_path / "sh" / other))
    with pytest.raises(LcftError, match=r"lm_head.weight is stored twice"):
        from_pretrained(tmp_path / "sh")


def test_the_weight_check_and_hash_read_only_the_files_a_load_reads(tmp_path):
    """A FIFO named like a weight file blocked eval's check forever, and any stray *.safetensors entered the
    weights' hash: both now take the files a load reads (model.safetensors, or the shards its index names)."""
    import os
    import signal

    from lcft.checkpoint.weights import check_weights_readable, weights_sha256
    from lcft.hashing import file_hash

    save_pretrained(small(), tmp_path / "ck")
    os.mkfifo(tmp_path / "ck" / "zz.safetensors")
    (tmp_path / "ck" / "old.safetensors").write_bytes(b"a stray file")

    def stuck(*_):
        raise TimeoutError("the check blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        check_weights_readable(tmp_path / "ck")
        assert weights_sha256(tmp_path / "ck") == file_hash(tmp_path / "ck" / "model.safetensors").hexdigest()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(LcftError, match="not found"):
        from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LcftError, match="no config.json"):
        from_pretrained(tmp_path / "empty")

    ok = write_ok(tmp_path)
    weights = load_file(ok / "model.safetensors")

    (ok / "model.safetensors").unlink()
    with pytest.raises(LcftError, match="no model.safetensors"):
        from_pretrained(ok)

    save_file({k: v for k, v in weights.items() if "layers.1.mlp" not in k}, str(ok / "model.safetensors"))
    with pytest.raises(LcftError, match=r"3 weight\(s\) missing: model.layers.1.mlp"):
        from_pretrained(ok)

    save_file({**weights, "model.layers.0.self_attn.q_proj.weight": torch.zeros(5, 5)}, str(ok / "model.safetensors"))
    with pytest.raises(LcftError, match="has shape"):
        from_pretrained(ok)

    save_file({**weights, "model.extra.weight": torch.zeros(2)}, str(ok / "model.safetensors"))
    with pytest.raises(LcftError, match="unexpected weight"):
        from_pretrained(ok)

    (ok / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(LcftError, match="cannot read weights"):
        from_pretrained(ok)

    cfg = json.loads((ok / "config.json").read_text())
    (ok / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(LcftError, match="not a Llama checkpoint"):
        from_pretrained(ok)
    (ok / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(LcftError, match="hidden_act"):
        from_pretrained(ok)
    (ok / "config.json").write_text("{not json")
    with pytest.raises(LcftError, match="not valid JSON"):
        from_pretrained(ok)


def make_run(tmp_path):
    run = tmp_path / "run"
    for step, seed in ((8, 1), (16, 2)):
        save_pretrained(small(seed=seed), run / "checkpoints" / f"step-{step:08d}")
    (run / "checkpoints" / ".step-00000024.tmp").mkdir()  # an interrupted save: not a checkpoint
    return run


def test_resolve_checkpoint_picks_highest_step(tmp_path):
    run = make_run(tmp_path)
    assert resolve_checkpoint(run).name == "step-00000016"
    assert resolve_checkpoint(run / "checkpoints" / "step-00000008").name == "step-00000008"


def test_export_cli_writes_hf_folder_of_latest_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    run = make_run(tmp_path)
    r = runner.invoke(app, ["export", str(run), "--out", str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    assert same_weights(from_pretrained(tmp_path / "hf"), small(seed=2))
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    ids = torch.randint(0, 16, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, small(seed=2)(ids), rtol=1e-5, atol=1e-5)

    r = runner.invoke(app, ["export", str(run), "--out", str(tmp_path / "hf")])  # the same export: nothing to write
    assert r.exit_code == 0 and "already exported to" in r.output, r.output
    r = runner.invoke(app, ["export", str(run), "--out", str(tmp_path / "hf"), "--dtype", "bfloat16"])  # another one
    assert r.exit_code == 1 and "--force" in r.output
    r = runner.invoke(app, ["export", str(run), "--out", str(tmp_path / "hf"), "--force", "--dtype", "bfloat16"])
    assert r.exit_code == 0, r.output
    assert from_pretrained(tmp_path / "hf").embed_tokens.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("args,message", [
    (["missing-folder"], "not found"),
    (["{empty}"], "not a run folder, a checkpoint folder or an HF model folder"),
    (["{run}", "--dtype", "int8"], "--dtype"),
])
def test_export_cli_bad_input_is_one_line_error(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    run = make_run(tmp_path)
    args = [a.format(empty=tmp_path / "empty", run=run) for a in args]
    r = runner.invoke(app, ["export", *args, "--out", str(tmp_path / "out")])
    assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


def test_export_of_a_sparse_model_says_transformers_reads_it_dense(tmp_path):
    """transformers' class has no block-sparse attention: it reads a sparse model's export dense, which the export
    said nothing of. It names that and the length up to which transformers' logits (the oracle) are lcft's."""
    transformers = pytest.importorskip("transformers")
    m = small(attention=AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=32, top_k=4))).eval()
    save_pretrained(m, tmp_path / "ckpt")
    r = runner.invoke(app, ["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")])
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "transformers reads" in said and "with dense attention" in said, r.output
    assert "up to 224 tokens" in said and "keep it sparse" in said, r.output  # 7 blocks of 32: 4 + local + sink + own
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 16, (1, 320))
    with torch.no_grad():
        theirs, ours = hf(ids).logits, m(ids)
    torch.testing.assert_close(theirs[:, :224], ours[:, :224], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(theirs[:, 224:], ours[:, 224:], rtol=1e-3, atol=1e-3)
    save_pretrained(small(), tmp_path / "dense")
    r = runner.invoke(app, ["export", str(tmp_path / "dense"), "--out", str(tmp_path / "hf2")])
    assert r.exit_code == 0 and "note" not in r.output, r.output
