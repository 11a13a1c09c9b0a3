"""Weight files written to attack the reader: an index whose shard names leave the folder or are not names, one
naming a flood of missing shards, and pytorch_model.bin pickles that name constructors, allocate for sizes they
declare, or hold meta tensors. Each is a one-line LcftError naming the file (`error: ...` from the CLI), nothing
outside the folder is read, nothing in a pickle runs, and a declared size allocates nothing."""

from __future__ import annotations

import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.model import Llama, LlamaConfig
from lcft.model.hf_params import to_hf_name
from lcft.train import TrainConfig, train
from tests.one_line import one_line
from tests.probes import peak_growth
from tests.test_files import plant
from tests.train.conftest import data_dir, init_dir  # noqa: F401  (fixtures, by name)

EMBED = "model.embed_tokens.weight"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    return save_pretrained(Llama(cfg), tmp_path / "model")


def one_line_error(f: Path, tmp_path: Path, *names: str) -> str:
    """The LcftError loading `f` raises, also what `lcft export` prints: one line naming the file."""
    with pytest.raises(LcftError) as e:
        from_pretrained(f)
    r = CliRunner().invoke(app, ["export", str(f), "--out", str(tmp_path / "export")])
    lines = r.output.strip().splitlines()
    assert isinstance(r.exception, SystemExit) and r.exit_code == 1, (r.exception, r.output)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    assert not (tmp_path / "export").exists()
    message = str(e.value)
    assert "\n" not in message and len(message) < 600 and all(n in message for n in names), message
    return message


# --- model.safetensors.index.json -------------------------------------------------------------------------------

def as_index(folder: Path, weight_map_of) -> None:
    """The folder's model.safetensors moved to a shard named by an index whose weight_map is weight_map_of(keys)."""
    keys = list(load_file(folder / "model.safetensors"))
    os.replace(folder / "model.safetensors", folder / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": weight_map_of(keys)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def outside(folder: Path) -> Path:
    """The whole model's weights moved outside the folder: the old reader loaded them and exported (exit 0)."""
    stolen = folder.parent / "outside" / "stolen.safetensors"
    stolen.parent.mkdir()
    os.replace(folder / "model-00001-of-00001.safetensors", stolen)
    return stolen


@pytest.mark.parametrize("shard", ["relative", "absolute", "/proc/self/environ", ".", "", 5, ["a"], None])
def test_index_shards_must_be_plain_files_of_the_folder(folder, tmp_path, shard):
    as_index(folder, lambda keys: {k: "model-00001-of-00001.safetensors" for k in keys})
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    if shard in ("relative", "absolute"):  # every tensor from there
        stolen = outside(folder)
        name = os.path.relpath(stolen, folder) if shard == "relative" else str(stolen)
        index["weight_map"] = dict.fromkeys(index["weight_map"], name)
    else:
        index["weight_map"][EMBED] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    message = one_line_error(folder, tmp_path, "model.safetensors.index.json")
    assert "not a file of its folder" in message


def test_a_weight_map_that_is_not_an_object_is_one_line(folder, tmp_path):
    as_index(folder, lambda keys: list(keys))
    assert "'weight_map' is not an object" in one_line_error(folder, tmp_path, "model.safetensors.index.json")


@pytest.mark.parametrize("count", [5000, 200_000])
def test_a_flood_of_missing_shards_is_a_short_line_naming_the_count(folder, tmp_path, count):
    as_index(folder, lambda keys: {f"w{i}": f"model-{i:06d}.safetensors" for i in range(count)})
    message = one_line_error(folder, tmp_path, str(count))
    assert message.count(".safetensors") <= 4  # the index and at most three shards


def test_an_index_over_16_mib_is_refused_before_it_is_parsed(folder, tmp_path):
    """A model folder's index is small (DeepSeek-V3's, 9 MB): one of 183 MB took 1.4 GB and 90 s to export."""
    as_index(folder, lambda keys: {k: "model-00001-of-00001.safetensors" for k in keys})
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "metadata": {"pad": "x" * (16 << 20)}}))
    assert "over the limit of 16777216" in one_line_error(folder, tmp_path, "model.safetensors.index.json")


@pytest.mark.parametrize("extra", [2, 3, 100_000])
def test_an_index_naming_more_tensors_than_the_model_can_hold_is_refused(folder, tmp_path, extra):
    """12 parameters (an untied head among them) + one rotary buffer a layer + one for the model: an index of this
    config.json names at most 14 tensors. A stale name or two load, as transformers loads them (it takes the tensors from
    the shards); more cannot be this model's index."""
    shard = "model-00001-of-00001.safetensors"
    as_index(folder, lambda keys: {**dict.fromkeys(keys, shard), **{f"w{i}": shard for i in range(extra)}})
    if extra == 2:
        stored = load_file(folder / shard)
        got = {to_hf_name(k): v for k, v in from_pretrained(folder).state_dict().items()}
        assert got.keys() == stored.keys() and all(torch.equal(v, stored[k]) for k, v in got.items())
        return
    message = one_line_error(folder, tmp_path, "model.safetensors.index.json")
    assert f"names {12 + extra:,} tensors, more than the 14" in message and "'w0' is not a weight" in message


def test_the_name_an_oversized_index_shows_is_one_no_checkpoint_holds(tmp_path):
    """A tied model's stored head and a rotary buffer load, and sort first: the refusal names a junk name."""
    cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    folder = save_pretrained(Llama(cfg), tmp_path / "model")
    shard = "model-00001-of-00001.safetensors"
    extras = ["a.rotary_emb.inv_freq", "lm_head.weight", "zz0", "zz1", "zz2", "zz3"]
    as_index(folder, lambda keys: dict.fromkeys(sorted([*keys, *extras]), shard))
    message = one_line_error(folder, tmp_path, "model.safetensors.index.json")
    assert "names 17 tensors, more than the 14" in message and "('zz0' is not a weight" in message, message


def test_an_export_parses_the_index_once(folder, tmp_path, monkeypatch):
    """The check before the work, the header check, the load and the dtype of the source each asked for the
    shards: the index was parsed four times an export."""
    import lcft.files

    as_index(folder, lambda keys: {k: "model-00001-of-00001.safetensors" for k in keys})
    parsed: list[str] = []
    real = lcft.files.parse_json
    monkeypatch.setattr(lcft.files, "parse_json", lambda text, where: parsed.append(where) or real(text, where))
    r = CliRunner().invoke(app, ["export", str(folder), "--out", str(tmp_path / "export")])
    assert r.exit_code == 0, r.output
    assert parsed.count(str(folder / "model.safetensors.index.json")) == 1, parsed


def test_a_config_of_16k_experts_beside_a_small_weight_file_is_refused_before_the_model_is_built(
        folder, tmp_path, monkeypatch):
    """config.json says Mixtral, 16 layers x 1024 experts (each count within its limit; ~150K tensors), beside the
    1-layer model's weights: the model was built on the meta device before the file was compared with it (41 s
    for 8 layers here, half an hour for 1024). Now the headers are compared first: one line, and no model of
    the config is built (a model of more than one block, the template's one, fails the test at once)."""
    import lcft.model.llama as llama

    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_hidden_layers=16,
                  num_local_experts=1024, num_experts_per_tok=1)
    (folder / "config.json").write_text(json.dumps(config))
    built = llama.Llama.__init__

    def one_block_only(self, cfg):
        assert cfg.num_hidden_layers == 1, f"a model of {cfg.num_hidden_layers} blocks was built"
        built(self, cfg)

    monkeypatch.setattr(llama.Llama, "__init__", one_block_only)
    message = one_line_error(folder, tmp_path, "model.safetensors", "unexpected weight")
    assert "model.layers.0.mlp" in message and "mixtral" in message


# --- pytorch_model.bin ------------------------------------------------------------------------------------------

def to_bin(folder: Path) -> dict[str, torch.Tensor]:
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return state



def test_a_safetensors_that_is_no_file_is_refused_not_passed_over_for_the_bin(folder):
    """model.safetensors there but no regular file (a FIFO) beside a pytorch_model.bin: the .bin was loaded in its
    place, without a word."""
    to_bin(folder)
    plant(folder / "model.safetensors", "FIFO")
    one_line(lambda: from_pretrained(folder), f"{folder / 'model.safetensors'} is a FIFO, not a regular file")

def with_pickle(folder: Path, pkl: bytes, storage: bytes | None = bytes(512 * 4)) -> None:
    """The folder's pytorch_model.bin with its data.pkl replaced and, for torch's records of its storages, one
    storage '0' of `storage` (512 float32 zeros: the embedding's size) or none."""
    path = folder / "pytorch_model.bin"
    with zipfile.ZipFile(path) as z:
        items = [(i.filename, z.read(i)) for i in z.infolist() if "/data/" not in i.filename]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in items:
            z.writestr(name, pkl if name.endswith("/data.pkl") else data)
            if storage is not None and name.endswith("/data.pkl"):
                z.writestr(name.replace("data.pkl", "data/0"), storage)


def glob_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s.encode())) + s.encode()


def long(n: int) -> bytes:
    b = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(b)]) + b


def state_pickle(value: bytes) -> bytes:
    """A protocol-2 pickle of {EMBED: <value>}."""
    return b"\x80\x02}" + text(EMBED) + value + b"s."


def rebuilt(numel: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    """torch's own record of a float32 tensor of storage '0' (what torch.save writes)."""
    pid = b"(" + text("storage") + glob_("torch", "FloatStorage") + text("0") + text("cpu") + long(numel) + b"tQ"
    tup = b"(" + b"".join(long(n) for n in size) + b"t" + b"(" + b"".join(long(n) for n in stride) + b"t"
    return glob_("torch._utils", "_rebuild_tensor_v2") + b"(" + pid + long(offset) + tup + b"\x89" + \
        glob_("collections", "OrderedDict") + b")R" + b"tR"


def own_memory(model: torch.nn.Module) -> None:
    """Every parameter contiguous, in memory no other parameter shares."""
    params = list(model.parameters())
    assert all(p.is_contiguous() for p in params)
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params)


def test_a_torch_saved_state_dict_loads_into_memory_of_its_own(folder):
    state = to_bin(folder)
    model = from_pretrained(folder)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), state[to_hf_name(name)]) and p.device.type == "cpu", name
    own_memory(model)

    state = {k: v.clone() for k, v in state.items()}  # two weights sharing one storage, one of them an offset view
    both = torch.cat([state[EMBED].flatten(), state["lm_head.weight"].flatten()])
    state[EMBED], state["lm_head.weight"] = both[:512].view(16, 32), both[512:].view(16, 32)
    torch.save(state, folder / "pytorch_model.bin")
    model = from_pretrained(folder)
    assert torch.equal(model.lm_head.weight.detach(), state["lm_head.weight"])
    own_memory(model)


Q, K = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
ALIASED = {  # what torch.save writes for a state dict whose tensors share memory
    "shared-storage": lambda s: {**s, K: s[Q]},  # k_proj is q_proj: one storage for both
    "zero-stride": lambda s: {**s, Q: s[Q][0].clone().expand_as(s[Q])},  # every row of q_proj one stored row
}


def as_bin(init: Path, state: dict[str, torch.Tensor], out: Path) -> Path:
    shutil.copytree(init, out, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(state, out / "pytorch_model.bin")
    return out


@pytest.mark.parametrize("kind", list(ALIASED))
def test_tensors_sharing_memory_load_and_train_as_separately_stored_copies(
        init_dir, data_dir, tmp_path, kind):  # noqa: F811
    """The oracle: the same values saved as separate contiguous tensors. Loaded as views of one storage, a step
    updated the shared memory once per parameter, the final save (safetensors refuses shared tensors) and export
    were tracebacks, and a zero-stride weight failed in the optimizer's first step."""
    state = ALIASED[kind](load_file(init_dir / "model.safetensors"))
    aliased = as_bin(init_dir, state, tmp_path / "aliased")
    separate = as_bin(init_dir, {k: v.clone(memory_format=torch.contiguous_format) for k, v in state.items()},
                      tmp_path / "separate")
    model, oracle = from_pretrained(aliased), from_pretrained(separate)
    own_memory(model)
    assert all(torch.equal(p, o) for p, o in zip(model.parameters(), oracle.parameters(), strict=True))

    r = CliRunner().invoke(app, ["export", str(aliased), "--out", str(tmp_path / "export")])
    assert r.exit_code == 0, r.output
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert all(torch.equal(exported[to_hf_name(n)], p) for n, p in oracle.named_parameters())

    cfg = dict(data=str(data_dir), seq_len=512, steps=2, global_batch=2, micro_batch=1, warmup=1, lr=1e-3,
               precision="fp32", save_every=0, progress=False)
    runs = [train(TrainConfig(init=str(init), out=str(tmp_path / f"run-{init.name}"), **cfg))
            for init in (aliased, separate)]
    assert runs[0]["loss"] == runs[1]["loss"]
    trained = [load_file(Path(r["checkpoint"]) / "model.safetensors") for r in runs]
    assert trained[0].keys() == trained[1].keys()
    assert all(torch.equal(trained[0][k], trained[1][k]) for k in trained[0])


def test_a_hand_written_record_of_the_right_size_is_read(folder):
    """The crafted pickles below are torch's own format: with their fault taken out, they are read."""
    from lcft.model.hf_weights import weight_tensors

    to_bin(folder)
    with_pickle(folder, state_pickle(rebuilt(512, 0, (16, 32), (32, 1))), storage=struct.pack("<512f", *range(512)))
    [(key, shape, read)] = list(weight_tensors(folder / "pytorch_model.bin"))
    assert key == EMBED and shape == (16, 32) and torch.equal(read(), torch.arange(512.0).view(16, 32))


@pytest.mark.parametrize("value, why", [
    (glob_("builtins", "bytearray") + long(2**62) + b"\x85R", "refused global builtins.bytearray"),
    (glob_("torch", "FloatStorage") + long(2**40) + b"\x85R", "corrupt"),  # a storage type is never called
    (glob_("torch._utils", "_rebuild_meta_tensor_no_storage") + b"(" + glob_("torch", "float32") + b"(" + long(16)
     + long(32) + b"t(" + long(32) + long(1) + b"t\x89tR", "refused global"),
    (rebuilt(2**40, 0, (16, 32), (32, 1)), "does not match the file's record"),
    (rebuilt(512, 1, (16, 32), (32, 1)), "reaches past its storage"),
    (rebuilt(512, 0, (16, 32), (-32, 1)), "not a plain strided tensor"),
    (b"N", "not a state dict of tensors"),
])
def test_a_bin_pickle_builds_nothing_it_declares(folder, tmp_path, value, why):
    to_bin(folder)
    with_pickle(folder, state_pickle(value))
    assert why in one_line_error(folder, tmp_path, "pytorch_model.bin")


def test_a_zip_directory_placing_a_record_before_the_file_is_one_line(folder, tmp_path):
    """A crafted zip: the storage records first, the end record's directory offset raised by 64 (zipfile takes
    it as 64 bytes before the archive and moves every record's header by -64) and every other record's entry by
    64, so data.pkl reads as it is while the first storage record's header lies before the file's start."""
    to_bin(folder)
    path = folder / "pytorch_model.bin"
    with zipfile.ZipFile(path) as z:
        items = sorted(((i.filename, z.read(i)) for i in z.infolist()), key=lambda it: "/data/" not in it[0])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:  # small: no zip64 record
        for name, blob in items:
            z.writestr(name, blob)
    data = bytearray(path.read_bytes())
    end = data.rindex(b"PK\x05\x06")
    (at,) = struct.unpack_from("<I", data, end + 16)
    struct.pack_into("<I", data, end + 16, at + 64)
    while data[at:at + 4] == b"PK\x01\x02":  # each directory entry: 46 bytes, then name, extra, comment
        n, extra, comment = struct.unpack_from("<3H", data, at + 28)
        if b"/data/" not in data[at + 46:at + 46 + n]:  # data.pkl, byteorder, version: where they are
            struct.pack_into("<I", data, at + 42, struct.unpack_from("<I", data, at + 42)[0] + 64)
        at += 46 + n + extra + comment
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as z:  # the oracle: what zipfile itself makes of it
        assert min(i.header_offset for i in z.infolist()) == -64
        z.read(next(i for i in z.infolist() if i.filename.endswith("/data.pkl")))
    assert "no local header" in one_line_error(folder, tmp_path, "pytorch_model.bin")


def test_a_saved_meta_tensor_is_refused_before_export(folder, tmp_path):
    state = to_bin(folder)
    state[EMBED] = torch.empty(16, 32, device="meta")  # the right shape: the old reader passed it to export
    torch.save(state, folder / "pytorch_model.bin")
    one_line_error(folder, tmp_path, "pytorch_model.bin")


def test_a_bin_that_is_not_torch_zip_is_one_line(folder, tmp_path):
    to_bin(folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x02}.")
    assert "not a zip archive" in one_line_error(folder, tmp_path, "pytorch_model.bin")


@pytest.mark.parametrize("value", [
    # torch.FloatTensor(2**28) moved to float64: 1 GiB, then 2 GiB, allocated by a 1 KB file
    glob_("torch._utils", "_rebuild_device_tensor_from_cpu_tensor") + b"(" + glob_("torch", "FloatTensor")
    + long(2**28) + b"\x85R" + glob_("torch", "float64") + text("cpu") + b"\x89tR",
    b"N" + b"r" + struct.pack("<I", 2**28) + b"0" + rebuilt(512, 0, (16, 32), (32, 1)),  # a memo index of 2**28
])
def test_a_declared_size_allocates_nothing(folder, value):
    to_bin(folder)
    with_pickle(folder, state_pickle(value), storage=None)
    lines, grown = peak_growth("lcft.checkpoint.hf_folder.from_pretrained", folder)
    assert len(lines) == 1 and lines[0].startswith("LcftError") and "pytorch_model.bin" in lines[0], lines
    assert grown < 256, (grown, lines)  # MiB above the peak before loading


def test_a_header_longer_than_its_file_reserves_nothing(tmp_path):
    """A 16-byte model.safetensors declaring a header of 90 MB (under safetensors' own 100 MB limit): one line, and
    its read no longer asked Python for a buffer of the declared 90 MB (a MemoryError where memory is not
    overcommitted)."""
    import tracemalloc

    from lcft.errors import LcftError
    from lcft.model.weight_files import header_dtypes

    f = tmp_path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 90_000_000) + b"{}      ")
    tracemalloc.start()
    try:
        with pytest.raises(LcftError, match="no safetensors header"):
            header_dtypes(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
