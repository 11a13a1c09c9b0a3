"""The model's parameters in HuggingFace weight files: their HF names, loaded tensor by tensor from a folder's
weights (single file or shards with an index, fp32/bf16/fp16; pytorch_model.bin where a folder has no safetensors,
read by lcft.model.hf_weights without unpickling anything but plain data), and grouped into safetensors shards to
save."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from lcft.errors import LcftError, reason, shown
from lcft.model.config import LlamaConfig
from lcft.model.hf_weights import aligned, weight_tensors
from lcft.model.llama import parameter_shapes
from lcft.model.weight_files import INDEX, WEIGHTS, index_map, weight_files

MAX_SHARD_BYTES = 5 * 1024**3  # 5 GiB a weights shard (transformers' classic max_shard_size "5GB" is 5·10^9 bytes)


# Our parameter names -> HF's (the block-level names differ: attn vs self_attn, norms, Mixtral's experts).
_BLOCK_RENAMES = ((r"attn\.", "self_attn."), (r"attn_norm\.", "input_layernorm."),
                  (r"mlp_norm\.", "post_attention_layernorm."), (r"mlp\.gate\.", "block_sparse_moe.gate."),
                  (r"mlp\.experts\.(\d+)\.gate_proj\.", r"block_sparse_moe.experts.\1.w1."),
                  (r"mlp\.experts\.(\d+)\.down_proj\.", r"block_sparse_moe.experts.\1.w2."),
                  (r"mlp\.experts\.(\d+)\.up_proj\.", r"block_sparse_moe.experts.\1.w3."))
IGNORED_HF = re.compile(r"rotary_emb\.inv_freq$")  # buffers some old HF checkpoints stored
_HEAD = "lm_head.weight"  # stored beside a tied embedding by torch.save (it shares its storage there)
_EMBED = "embed_tokens.weight"  # our name of the embedding a tied head is
_COMPARE_ELEMENTS = 1 << 20  # per block of rows the tied-head check casts and compares: 4 MiB in fp32


def to_hf_name(name: str) -> str:
    """'layers.0.attn.q_proj.weight' -> 'model.layers.0.self_attn.q_proj.weight'."""
    if name.startswith("lm_head."):
        return name
    m = re.match(r"layers\.(\d+)\.(.*)$", name)
    if m:
        rest = m.group(2)
        for ours, theirs in _BLOCK_RENAMES:
            new = re.sub("^" + ours, theirs, rest)
            if new != rest:
                rest = new
                break
        return f"model.layers.{m.group(1)}.{rest}"
    return "model." + name


def check_weights(cfg: LlamaConfig, directory: Path) -> None:
    """The tensors the folder's weight files declare (names and shapes, from their headers: nothing is read)
    against the parameters config.json implies, before any model is built (`check_declared`)."""
    _check_index_names(cfg, directory)
    check_declared(cfg, directory, _headers(directory))


def _check_index_names(cfg: LlamaConfig, directory: Path) -> None:
    """An index naming more tensors than a checkpoint of config.json can hold (its parameters, a stored tied head,
    the rotary buffers old checkpoints kept: one a layer, one for the model) is refused in one line naming one
    that is not a weight of the model. Fewer is no error: transformers reads only the shards an index names and
    takes the tensors from them, passing over a stale name (so does the check of the shards that follows)."""
    found = index_map(directory)
    if found is None:
        return
    index, weight_map = found
    expected = {to_hf_name(n) for n in parameter_shapes(cfg)}
    most = len(expected) + int(cfg.tie_word_embeddings) + cfg.num_hidden_layers + 1
    if len(weight_map) > most:
        unknown = [n for n in weight_map if n not in expected]
        foreign = next((n for n in unknown if not _passed_over(n, cfg)), unknown[0])  # a name no checkpoint holds
        raise LcftError(f"{index}: names {len(weight_map):,} tensors, more than the {most:,} a checkpoint of this "
                        f"config.json can hold ({shown(foreign, 120, quoted=True)} is not a weight of the model)")


def check_declared(cfg: LlamaConfig, where: Path, declared: Iterable[tuple[Path, str, tuple[int, ...]]],
                   stored_name: Callable[[str], str] = to_hf_name) -> None:
    """The tensors a checkpoint declares, (file, name as stored, shape) from a weight file's header or a sharded
    checkpoint's metadata (`stored_name`: our parameter name as stored there), against the parameters config.json
    implies (lcft.model.llama.parameter_shapes: a one-block template), before any model is built: building one on
    the meta device costs ~0.3 ms a module, so a config.json of a million experts beside a small weight file took
    half an hour to be told they differ. The first difference (a tensor config.json has not, one of another shape,
    stored twice, or missing from `where`) is one line naming the tensor, as load_weights says it."""
    expected = {stored_name(n): (n, shape) for n, shape in parameter_shapes(cfg).items()}
    seen: set[str] = set()
    for f, key, shape in declared:
        name = _declared(f, key, shape, expected, cfg, seen)
        if name is not None:
            seen.add(name)
    _check_missing(where, expected, seen)


def _headers(directory: Path) -> Iterator[tuple[Path, str, tuple[int, ...]]]:
    """(file, HF name, shape) of every tensor the folder's weight files declare, as their headers say."""
    for f in weight_files(directory):
        with _reading(f):
            for key, shape, _ in weight_tensors(f):
                yield f, key, shape


def load_weights(model: torch.nn.Module, directory: Path, dtype: torch.dtype | None = None) -> None:
    """Assign every parameter of a model built on the meta device from the folder's weights, one tensor at a
    time (as stored, or cast to dtype as it is read), so the peak is about one copy of the model plus one tensor."""
    params = dict(model.named_parameters())
    expected = {to_hf_name(n): (n, tuple(p.shape)) for n, p in params.items()}
    loaded: set[str] = set()
    # stored heads beside a tied embedding, held only until the embedding is read (from safetensors, a mapping of
    # the file that takes memory only as the check reads it)
    tied_heads: list[tuple[Path, torch.Tensor]] = []
    for f in weight_files(directory):
        with _reading(f):
            for key, shape, read in weight_tensors(f):
                name = _declared(f, key, shape, expected, model.config, loaded)
                if name is None:
                    if key == _HEAD:
                        tied_heads.append((f, read()))
                else:
                    _assign(model, name, _read_weight(f, key, read, dtype, tied_heads if name == _EMBED else []))
                    loaded.add(name)
                if _EMBED in loaded:
                    embed = model.get_parameter(_EMBED).detach()
                    while tied_heads:
                        _check_tied_head(*tied_heads.pop(), embed, embed.dtype)
    _check_missing(directory, expected, loaded)


def _read_weight(f: Path, key: str, read: Callable[[], torch.Tensor], dtype: torch.dtype | None,
                 tied_heads: list[tuple[Path, torch.Tensor]]) -> torch.Tensor:
    """The weight `key` of file `f` as the model holds it (cast to dtype, aligned). `tied_heads`, read before the
    embedding this is, are checked against it as read and let go first, as is the tensor as read on return: only
    then does the cast copy or the next weight take more memory."""
    tensor = read()  # of a dtype lcft reads: its header's checked first (lcft.model.weight_files.header_dtypes)
    while tied_heads:
        _check_tied_head(*tied_heads.pop(), tensor, dtype or tensor.dtype)
    return aligned(tensor if dtype is None else tensor.to(dtype))


def _check_tied_head(f: Path, head: torch.Tensor, embed: torch.Tensor, dtype: torch.dtype) -> None:
    """A stored lm_head.weight beside tie_word_embeddings true must be the embedding itself (torch.save writes a
    tied model's head so): a different one is refused, not dropped. transformers 5 loads such a folder untied,
    with that head (its warning: the config is wrong), 4.x tied it to the embedding: either way lcft would train
    another model than the one the folder holds. Compared as the model holds them (both cast to the loaded
    `dtype`), NaN at the same place equal: whether the weights are finite is not this check's question, and a
    diverged tied model saved by torch.save would otherwise be refused as holding another head."""
    if not _same_values(head, embed, dtype):
        raise LcftError(f"{f}: holds an {_HEAD} unlike model.embed_tokens.weight, but config.json has "
                        "tie_word_embeddings true (the head is the embedding): set it to false to train that "
                        f"head, or remove {_HEAD} to tie them")


def _same_values(head: torch.Tensor, embed: torch.Tensor, dtype: torch.dtype) -> bool:
    """`head` and `embed`, each cast to `dtype`, equal value by value (NaN equal to NaN), compared a block of rows
    at a time: a cast copy of a whole 128K-token embedding would take another 2 GiB in fp32."""
    if head.shape != embed.shape:
        return False
    rows = max(1, _COMPARE_ELEMENTS // max(1, embed[:1].numel()))
    return all(_same_block(head[i:i + rows], embed[i:i + rows], dtype) for i in range(0, embed.shape[0], rows))


def _same_block(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    # a function of its own: its cast copies are let go on return, before the next block's are made
    a, b = a.to(dtype), b.to(dtype)
    return torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())


@contextmanager
def _reading(f: Path) -> Iterator[None]:
    """A weight file that cannot be read (corrupt, cut short) is one line naming it."""
    try:
        yield
    except (SafetensorError, OSError, ValueError, RuntimeError, MemoryError) as e:
        raise LcftError(f"{f}: cannot read weights ({reason(e)})") from None


def _declared(f: Path, key: str, shape: tuple[int, ...], expected: dict[str, tuple[str, tuple[int, ...]]],
              cfg: LlamaConfig, seen: set[str]) -> str | None:
    """Our name of the weight `key` of file `f` (None: an entry to skip), refused where config.json has no such
    weight, has it in another shape, or an earlier file already held it (`seen`, our names)."""
    if key not in expected:
        if _passed_over(key, cfg):
            return None
        raise LcftError(f"{f}: unexpected weight {key!r} (not a {cfg.model_type} checkpoint of this config.json?)")
    name, want = expected[key]
    if name in seen:  # a second copy, in another shard: which one the model is would be chance
        raise LcftError(f"{f}: weight {key} is stored twice (in two shard files of {f.parent})")
    if shape != want:
        raise LcftError(f"{f}: weight {key} has shape {shape}, config.json implies {want}")
    return name


def _passed_over(key: str, cfg: LlamaConfig) -> bool:
    """A stored name that is not a parameter yet loads: an old rotary buffer, a tied model's stored head."""
    return bool(IGNORED_HF.search(key)) or (key == _HEAD and cfg.tie_word_embeddings)


def _check_missing(directory: Path, expected: dict[str, tuple[str, tuple[int, ...]]], seen: set[str]) -> None:
    missing = sorted((n, stored) for stored, (n, _) in expected.items() if n not in seen)  # in our names' order
    if missing:
        names = ", ".join(stored for _, stored in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise LcftError(f"{directory}: {len(missing)} weight(s) missing: {names}")


def _assign(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=getattr(module, leaf).requires_grad))


def shards(model: torch.nn.Module, dtype: torch.dtype | None, max_bytes: int = MAX_SHARD_BYTES,
           read: Callable[[list[str]], dict[str, torch.Tensor]] | None = None
           ) -> dict[str, Callable[[], dict[str, torch.Tensor]] | bytes]:
    """{file name: tensors to write (built when called, so only one shard is ever copied at a time)}, plus the
    index as bytes when there is more than one shard (transformers' names: model-00001-of-0000N.safetensors).
    read(names) -> {name: tensor}: where a shard's tensors come from (default: the model's parameters; a model
    on the meta device with `read` streams them from elsewhere, e.g. a sharded checkpoint)."""
    groups: list[list[tuple[str, torch.nn.Parameter]]] = [[]]
    size = 0
    for name, p in model.named_parameters():
        nbytes = p.numel() * (dtype or p.dtype).itemsize
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, p))
        size += nbytes

    def tensors(group: list[tuple[str, torch.nn.Parameter]]) -> Callable[[], dict[str, torch.Tensor]]:
        def build() -> dict[str, torch.Tensor]:
            got = read([n for n, _ in group]) if read else {n: p.detach() for n, p in group}
            return {to_hf_name(n): (t.to(dtype) if dtype else t).cpu().contiguous() for n, t in got.items()}
        return build

    if len(groups) == 1:
        return {WEIGHTS: tensors(groups[0])}
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    total = sum(p.numel() * (dtype or p.dtype).itemsize for _, p in model.named_parameters())
    index = {"metadata": {"total_size": total},
             "weight_map": {to_hf_name(n): f for f, g in zip(names, groups, strict=True) for n, _ in g}}
    out: dict[str, Any] = {f: tensors(g) for f, g in zip(names, groups, strict=True)}
    out[INDEX] = json.dumps(index, indent=2).encode()
    return out


def stale_weight_files(directory: Path, keep: Iterator[str] | set[str]) -> list[Path]:
    """Weight files of an earlier save in `directory` that a new save with files `keep` must remove (else the
    folder would mix two models: model.safetensors is read before an index)."""
    keep = set(keep)
    if not directory.is_dir():
        return []
    old = [directory / WEIGHTS, directory / INDEX, *directory.glob("model-*-of-*.safetensors")]
    return [p for p in old if p.name not in keep and p.exists()]
