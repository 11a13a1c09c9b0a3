"""`lcft plan`: the layout a train config describes, its per-rank memory, a verdict, and changes that would fit."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lcft.cpus import usable_cpus
from lcft.errors import LcftError
from lcft.model.config import LlamaConfig
from lcft.plan.config import PlanConfig
from lcft.plan.estimate import (
    GIB,
    HOST_PROCESS,
    Estimate,
    Layout,
    estimate,
    moves_to_host,
    residual_bytes,
    with_changes,
)
from lcft.plan.explain import sources
from lcft.plan.shape import Shape
from lcft.shapes import check_seq_len, length_unit

LABELS = {
    "parameters": "parameters (fp32 master)",
    "gradients": "gradients (fp32)",
    "optimizer": "optimizer state (AdamW, fp32)",
    "weight_copies": "weight working copies",
    "activations": "activations held",
    "kv": "K/V from other cp ranks",
    "transient": "block transient (backward)",
    "runtime": "runtime (context, allocator)",
    "margin": "safety margin",
}


@dataclass(frozen=True)
class InitModel:
    """What a plan reads of --init, all of one checkpoint folder: its model config (config.json, lcft.json's
    attention), what loading config.json has to say (a custom class loaded as its model_type's, carried keys), and
    whether it is sharded (DCP), which fsdp reads shard by shard."""

    config: LlamaConfig
    notes: list[str]
    sharded: bool


def read_init(cfg: PlanConfig) -> InitModel | None:
    """--init (a run folder means its latest checkpoint; verified against its checksums), or None for a preset.
    Its files are read as one folder (lcft.checkpoint.layout.unchanged): a run pruning or saving it again meanwhile
    has its latest resolved again and read once more, and a checkpoint named itself is one line (read_checkpoint),
    never one checkpoint's config beside another's notes. With --data, the model must read the data's vocabulary,
    checked as `lcft train` checks it (lcft.checkpoint.layout.check_tokenizer: tokenizer files and config.json, no
    weights). Read it once and hand it to the functions below: each verification hashes the weights."""
    if not cfg.init:
        return None
    from lcft.checkpoint.hf_folder import read_config
    from lcft.checkpoint.layout import check_tokenizer, read_checkpoint, read_model_config, unchanged
    from lcft.checkpoint.model_files import is_sharded_checkpoint
    from lcft.genomics.shards import read_manifest
    from lcft.model.hf import config_notes

    tokenizer = read_manifest(cfg.data)["tokenizer"] if cfg.data else None

    def read(folder: Path) -> InitModel:
        with unchanged(folder):
            if tokenizer is not None:
                check_tokenizer(folder, tokenizer)
            return InitModel(read_config(folder), config_notes(read_model_config(folder)),
                             is_sharded_checkpoint(folder))

    return read_checkpoint(cfg.init, read, weights=False)


def model_config(cfg: PlanConfig, init: InitModel | None = None) -> LlamaConfig:
    """The model of the plan: --init's (default: read_init(cfg)), else the preset (with --data, over its
    tokenizer's vocabulary, as `lcft train` builds it); with the attention options applied. No weights are read."""
    from lcft.genomics.shards import read_manifest
    from lcft.model import preset
    from lcft.train.model_setup import attention_override, preset_config

    init = init or read_init(cfg)
    if init:
        model = dataclasses.replace(init.config)
    else:
        model = preset_config(cfg.preset, read_manifest(cfg.data)["tokenizer"]) if cfg.data else preset(cfg.preset)
    model.attention = attention_override(cfg.model, model.attention)
    return model


def _seq_len(cfg: PlanConfig, model: LlamaConfig) -> int:
    """--seq-len, else --data's window length; refused as `lcft train` refuses it (whole attention blocks, cp
    chunks, no longer than the data's windows)."""
    window = None
    if cfg.data:
        from lcft.genomics.shards import read_manifest

        window = read_manifest(cfg.data)["length"]  # checked there: a whole number of tokens
    seq = int(cfg.seq_len) if cfg.seq_len else window
    if seq is None:
        raise LcftError("give --seq-len (or --data, whose window length is the default)")
    attn = model.attention
    check_seq_len(seq, cfg.cp, attn.backend == "sparse", attn.sparse.block_size, window)
    return seq


def layout(cfg: PlanConfig, model: LlamaConfig, init: InitModel | None = None) -> Layout:
    """The Layout of a plan config (precision auto = bf16 on CUDA; on CPU as `lcft train` would choose); `init`:
    as for model_config, to tell a sharded (DCP) --init, which fsdp reads shard by shard."""
    from lcft.train.precision import choose_precision, offload_dtype
    from lcft.train.run_dir import check_launch

    world = cfg.world
    check_launch(cfg, world)  # what `lcft train` refuses before it starts: cp groups, the batch's split
    seq = _seq_len(cfg, model)
    precision = choose_precision(cfg.precision, cfg.device == "cpu")[0]
    shard = "fsdp" if cfg.parallel.sharded(world) else "none"
    init = init or read_init(cfg)
    return Layout(seq_len=seq, world=world, cp=cfg.cp, micro_batch=cfg.micro_batch, shard=shard,
                  offload_params=cfg.offload_params and shard == "fsdp",
                  checkpointing=cfg.checkpointing, offload_activations=cfg.offload_activations,
                  offload_bf16=offload_dtype(cfg.offload_bf16, precision) is not None, cp_kv=cfg.cp_kv,
                  precision=precision, device=cfg.device, loss_chunk=cfg.loss_chunk,
                  threads=cpu_threads(cfg.ranks_per_node, world) if cfg.device == "cpu" else 1, sharded_source=init is not None and init.sharded)


def cpu_threads(ranks_per_node: int, world: int | None = None) -> int:
    """Compute threads a CPU rank gets by default here: torch's count alone (a world of one process, not launched),
    else the launcher's share on its node (the CPUs this process may use / the node's ranks). `world`: all nodes'
    ranks, by default one node's."""
    import torch

    alone = (world or ranks_per_node) == 1
    return torch.get_num_threads() if alone else max(1, usable_cpus() // ranks_per_node)


@dataclass(frozen=True)
class Budget:
    """What a plan must fit in: `device` bytes per GPU (None: a CPU plan, no GPU) and, when `host` is given, one
    node's host memory for its `ranks_per_node` processes (on CUDA each the larger of what it offloads and of the
    weights it reads at start, plus HOST_PROCESS; on CPU all each holds)."""

    device: int | None
    host: int | None = None
    ranks_per_node: int = 1

    @classmethod
    def of(cls, cfg: PlanConfig) -> Budget:
        return cls(cfg.gpu_bytes, cfg.host_bytes, cfg.ranks_per_node)

    def host_need(self, est: Estimate) -> int:
        """Host bytes the node's ranks need under `est`."""
        if self.device is None:  # a CPU rank's memory is the host's, its runtime term the process's own
            return self.ranks_per_node * est.total
        return self.ranks_per_node * (max(est.host, est.load) + HOST_PROCESS)

    def admits(self, est: Estimate) -> bool:
        return ((self.device is None or est.total <= self.device)
                and (self.host is None or self.host_need(est) <= self.host))


@dataclass(frozen=True)
class Option:
    """One change to a layout, as the flags that make it."""

    flags: str
    changes: dict


def single_changes(lay: Layout, model: LlamaConfig) -> Iterator[Option]:
    """The single changes that shrink `lay`, in the order `lcft plan` prefers them, least step time lost first:
    one sequence per micro-batch, one block recomputed, the smallest cp that divides the world (K/V traffic
    grows with cp), streamed K/V, parameters all-gathered per block, then host offloads (PCIe every block): block
    inputs exact, then in bf16 under bf16 autocast (half the host memory; backward taken at rounded inputs; on a
    CPU run the only offload that frees anything), then parameters."""
    block = model.attention.sparse.block_size
    if lay.micro_batch > 1:
        yield Option("--micro-batch 1", {"micro_batch": 1})
    if lay.checkpointing == "none":
        yield Option("--checkpointing block", {"checkpointing": "block"})
    cp = lay.cp * 2
    while cp <= lay.world:
        if lay.world % cp == 0 and lay.seq_len % length_unit(cp, block) == 0:
            yield Option(f"--cp {cp}", {"cp": cp})
        cp *= 2
    if lay.cp_kv != "stream":
        yield Option("--cp-kv stream", {"cp_kv": "stream"})
    if lay.shard == "none" and lay.world > 1:
        yield Option("--shard fsdp", {"shard": "fsdp"})
    block_flag = "--checkpointing block " if lay.checkpointing == "none" else ""
    offload = {"offload_activations": True, "checkpointing": "block"}
    if not lay.offload_activations and moves_to_host(lay):
        yield Option(f"{block_flag}--offload-activations", offload)
    if not lay.offload_bf16 and lay.precision == "bf16" and residual_bytes(lay) > 2:
        also = "" if lay.offload_activations else "--offload-activations "
        yield Option(f"{block_flag}{also}--offload-bf16", offload | {"offload_bf16": True})
    if not lay.offload_params and lay.world > 1 and moves_to_host(lay):
        shard_flag = "--shard fsdp " if lay.shard == "none" else ""
        yield Option(f"{shard_flag}--offload-params", {"offload_params": True, "shard": "fsdp"})


def _valid(lay: Layout) -> bool:
    return not (lay.cp_kv == "stream" and lay.cp == 1)  # stream only changes a cp run


def fitting_layouts(model: LlamaConfig, lay: Layout, budget: Budget, limit: int = 5
                    ) -> list[tuple[str, Layout, Estimate]]:
    """Up to `limit` sets of at most three changes under which `lay` fits `budget`, as (flags,
    changed layout, estimate), cheapest first: sets are compared by their costliest change (`single_changes`' order),
    then by the next, so `--cp 8 --shard fsdp` comes before a host offload and a set before itself plus more; a
    set containing a smaller fitting set is not listed."""
    opts = list(single_changes(lay, model))
    found: list[tuple[tuple[int, ...], str, Layout, Estimate]] = []
    for size in (1, 2, 3):
        for combo in itertools.combinations(range(len(opts)), size):
            keys_set = [k for i in combo for k in opts[i].changes]
            if len(keys_set) != len(set(keys_set)):
                continue  # two options setting the same thing (two --cp values; offload implying a mode)
            if any(set(prev) <= set(combo) for prev, _, _, _ in found):
                continue
            changed = with_changes(lay, **{k: v for i in combo for k, v in opts[i].changes.items()})
            if not _valid(changed):
                continue
            est = estimate(model, changed)
            if budget.admits(est):
                found.append((combo[::-1], " ".join(opts[i].flags for i in combo), changed, est))
    found.sort(key=lambda f: f[0])  # costliest change first, then the next (a prefix sorts first)
    return [(flags, changed, est) for _, flags, changed, est in found[:limit]]


def fitting_changes(model: LlamaConfig, lay: Layout, budget: Budget, limit: int = 5
                    ) -> list[tuple[str, Estimate]]:
    """`fitting_layouts` as (flags, estimate): what `lcft plan` lists under "it would fit with"."""
    return [(flags, est) for flags, _, est in fitting_layouts(model, lay, budget, limit)]


def pick(model: LlamaConfig, lay: Layout, budget: Budget) -> tuple[str, Layout, Estimate] | None:
    """What `lcft plan` advises for `lay`: ('', lay, its estimate) when it fits as given, else the first change
    set it lists (flags, changed layout, estimate); None when no set of up to three changes fits."""
    est = estimate(model, lay)
    if budget.admits(est):
        return "", lay, est
    options = fitting_layouts(model, lay, budget, limit=1)
    return options[0] if options else None


# Below the sets that would fit, when the host is not checked and two of them show the same GPU figure but offload
# different amounts: an offload frees GPU memory by moving it to the host, where --offload-bf16 halves it
OFFLOAD_NOTE = ("note: host memory is not checked without --host-memory (one node's, e.g. 256GiB): sets that differ "
                "only in what they offload to it show the same GPU figure")


def parameters(n: int) -> str:
    """A parameter count as models are named: 0.992B, 4.2M (a small model in billions read 0.004B)."""
    return f"{n / 1e9:.3f}B" if n >= 100_000_000 else f"{n / 1e6:.1f}M"


def _gib(n: int) -> str:
    return f"{n / GIB:8.2f} GiB"


def _host_lines(budget: Budget, est: Estimate, why: str) -> list[str]:
    """What offloading puts in host memory per rank and, when the node's is given, what its ranks need of it."""
    lines = [f"  {'host memory (offloaded)':<32}{_gib(est.host)}"] if est.host else []
    if budget.device is None:  # a CPU plan: its ranks hold the host's memory
        lines.append(f"host, one node: {budget.ranks_per_node} rank(s) x {est.total / GIB:.2f} GiB = "
                     f"{budget.host_need(est) / GIB:.2f} GiB" + ("" if budget.host is None else
                                                                 f"   of {budget.host / GIB:.2f} GiB"))
    elif budget.host is not None:
        lines.append(f"host, one node: {budget.ranks_per_node} rank(s) x (max({est.host / GIB:.2f} GiB offloaded, "
                     f"{est.load / GIB:.2f} GiB of weights read at start) + {HOST_PROCESS / GIB:.2f} GiB process) "
                     f"= {budget.host_need(est) / GIB:.2f} GiB   of {budget.host / GIB:.2f} GiB")
        lines += [f"      {line}" for line in why.splitlines()]
    return lines


def _verdict(budget: Budget, est: Estimate) -> str:
    if budget.device is None and budget.host is None:
        return "verdict: not checked (a CPU plan compares its node's ranks with --host-memory)"
    over = 0 if budget.device is None else est.total - budget.device
    host_over = None if budget.host is None else budget.host_need(est) - budget.host
    if over <= 0 and (host_over is None or host_over <= 0):
        if budget.device is None:  # a CPU plan: the host is all it is checked against
            return f"verdict: fits ({-host_over / GIB:.2f} GiB of host memory to spare)"
        spare = f"{-over / GIB:.2f} GiB to spare" + ("" if host_over is None else
                                                     f", {-host_over / GIB:.2f} GiB of host memory")
        return f"verdict: fits ({spare})"
    why = ([f"{over / GIB:.2f} GiB over"] if over > 0 else []) + (
        [f"host memory {host_over / GIB:.2f} GiB over"] if host_over is not None and host_over > 0 else [])
    return f"verdict: does not fit ({'; '.join(why)})"


def report(cfg: PlanConfig) -> tuple[str, bool]:
    """(the text `lcft plan` prints, whether the layout fits)."""
    init = read_init(cfg)
    model = model_config(cfg, init)
    lay = layout(cfg, model, init)
    est = estimate(model, lay)
    budget = Budget.of(cfg)
    shape = Shape.of(model)
    dp = lay.world // lay.cp
    lines = [f"note: {n}" for n in (init.notes if init else [])] + cfg.parallel.idle(lay.world)
    lines += [f"model: {parameters(shape.params)} parameters ({shape.layers} blocks, hidden {shape.hidden}, "
             f"{model.attention.backend} attention)",
             f"layout: {lay.world} {cfg.device} rank(s) = dp {dp} x cp {lay.cp}; shard {lay.shard}"
             f"{' + offload-params' if lay.offload_params else ''}; {lay.seq_len:,} tokens x micro-batch "
             f"{lay.micro_batch}; checkpointing {lay.checkpointing}"
             f"{' + offload' if lay.offload_activations else ''}{' (bf16)' if lay.bf16_copies else ''}; "
             f"cp-kv {lay.cp_kv}; {lay.precision}",
             "per rank:"]
    why = sources(shape, lay) if cfg.explain else {}
    for name, value in est.rows():
        if value or name != "margin":
            lines.append(f"  {LABELS[name]:<32}{_gib(value)}")
            lines += [f"      {line}" for line in why.get(name, "").splitlines()]
    lines.append(f"  {'total':<32}{_gib(est.total)}" + ("" if budget.device is None else
                                                       f"   of {budget.device / GIB:.2f} GiB"))
    lines += _host_lines(budget, est, why.get("host", ""))
    lines.append(_verdict(budget, est))
    if budget.admits(est):
        return "\n".join(lines), True
    options = fitting_changes(model, lay, budget)
    if options:
        lines.append("it would fit with:")
        lines += [f"  {flags:<60}{_gib(e.total)}" + ("" if budget.host is None else
                                                     f"   host {budget.host_need(e) / GIB:.2f} GiB")
                  for flags, e in options]
        offloads = [e for _, e in options if e.host]
        if budget.host is None and len({(e.total, e.host) for e in offloads}) > len({e.total for e in offloads}):
            lines.append(OFFLOAD_NOTE)  # two sets alike on the GPU, apart in what they offload
    else:
        lines.append("no combination of up to three of --checkpointing block, --cp, --cp-kv stream, --shard fsdp, "
                     "--offload-activations, --offload-bf16, --offload-params, --micro-batch 1 fits: more GPUs or a "
                     "shorter --seq-len" + ("" if budget.host is None else ", or more host memory"))
    return "\n".join(lines), False
