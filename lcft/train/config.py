"""`TrainConfig`: every `lcft train` option (flat flags and TOML keys), declared and validated by section."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

from lcft.config import (
    ConfigError,
    Size,
    at_least_one,
    at_most,
    check_choice,
    check_choices,
    check_seed,
    doc,
    finite,
    not_negative,
)
from lcft.config_build import build, resolve
from lcft.config_toml import absolute_paths, load_toml, to_dict
from lcft.files import parse_text
from lcft.kernels.spec import AttentionImpl
from lcft.model.config import COUNT_LIMITS, AttentionBackend, ScaledRopeType
from lcft.parallel.config import (
    Checkpointing,
    CpConfig,
    LaunchConfig,
    PrecisionChoice,
    Shard,
    shards_parameters,
)
from lcft.shapes import MAX_BATCH, check_batch
from lcft.train.guard import GuardConfig


@dataclass
class DataOptions:
    """The training data: which prepared windows, how long a sequence, how tokens are weighted and flipped."""

    data: str = ""
    """Prepared data folder (from `lcft prepare`); its train split is used."""
    seq_len: Size | None = None
    """Tokens per training sequence (e.g. 512K); shorter than the data's windows takes aligned sub-windows;
    default: the window length."""
    softmask_loss_weight: float = 1.0
    """Loss weight of tokens whose base is soft-masked (lower case, repeats) in the FASTA; Evo 2 used 0.1."""
    rc_augment: float = 0.0
    """Reverse-complement each training sample with this probability (decided by seed and sample id: a resumed run flips the same samples). Cost per flipped sample: char none (ids reversed and complemented); kmer:K one numpy pass over its bases; a tokenizer.json one tokenizer call over its bases (BPE: a few Mbp/s, about 0.1 s for 64K tokens)."""
    seed: int = 0
    """Seed of the model initialisation and of the data order (a function of seed, epoch and sample index)."""

    def __post_init__(self) -> None:
        at_least_one(self, "seq_len")
        at_most(self, COUNT_LIMITS["max_position_embeddings"], "lcft's limit of positions", "seq_len")
        check_seed(self)
        finite(self, "softmask_loss_weight")
        not_negative(self, "softmask_loss_weight")
        if isinstance(self.rc_augment, bool) or not 0 <= self.rc_augment <= 1:
            raise ConfigError(f"rc_augment must be a probability within [0, 1] (got {self.rc_augment!r})")


@dataclass
class CheckpointOptions:
    """Where the run lives, when it writes checkpoints, how many it keeps, and where it continues from."""

    out: str = ""
    """Run folder: config.toml, metrics.jsonl, summary.json (how the latest run ended), the checkpoints (in
    checkpoints/, a step-NNNNNNNN folder each)."""
    stop_after: int | None = None
    """End this invocation after this many steps, with a checkpoint (for time-limited jobs); resume later
    (default: run to --steps)."""
    save_every: int = 50
    """Write a checkpoint every this many steps (0 = only at the end and on SIGTERM/SIGINT)."""
    keep_last: int = 3
    """Keep only this many newest checkpoints (0 = keep all)."""
    resume: str | None = None
    """Continue a run: 'auto' = the latest checkpoint in --out, or a checkpoint folder."""

    def __post_init__(self) -> None:
        at_least_one(self, "stop_after")
        not_negative(self, "save_every", "keep_last")


@dataclass
class ModelOverrides:
    """The model to start from (a checkpoint or a preset) and what of its shape and attention to change."""

    init: str | None = None
    """Continue from this HF-format checkpoint folder (ours or one transformers wrote), a run folder (its latest
    checkpoint) or Hub id ORG/NAME[@REVISION]; default: a fresh model from --preset."""
    preset: str = "tiny"
    """Model shape for a fresh model: tiny, small, base or 1b (ignored with --init or --resume)."""
    rope_theta: float | None = None
    """Override the model's RoPE base period (e.g. to extend --init's context); default: the model's own."""
    rope_scaling: str | None = None
    """Override the model's RoPE scaling: TYPE:FACTOR[:LENGTH] (types linear, dynamic, yarn, llama3; FACTOR at
    least 1; LENGTH the original context; e.g. yarn:8:65536), 'none', or an HF JSON object; default: the model's own."""
    attention: AttentionBackend | None = None
    """Attention backend: dense or sparse (block top-k); default: the model's own, dense for a preset."""
    block_size: int | None = None
    """Sparse attention: tokens per block (default: the model's own, 64)."""
    top_k: int | None = None
    """Sparse attention: selected earlier key blocks per query block (default: the model's own)."""
    local_blocks: int | None = None
    """Sparse attention: always-attended key blocks right before each query block (default: the model's own)."""
    sink_blocks: int | None = None
    """Sparse attention: always-attended first key blocks (default: the model's own)."""
    attention_impl: AttentionImpl | None = None
    """Sparse attention implementation: auto, reference, cpu or triton (default: the model's own)."""

    def __post_init__(self) -> None:
        check_choices(self)
        at_least_one(self, "block_size", "top_k")
        not_negative(self, "local_blocks", "sink_blocks")
        finite(self, "rope_theta")
        if self.rope_theta is not None and self.rope_theta <= 0:
            raise ConfigError(f"rope_theta must be positive (got {self.rope_theta})")
        if self.rope_scaling is not None:
            parse_rope_scaling(self.rope_scaling)


@dataclass
class OptimConfig:
    """AdamW, its schedule and the loss: what one optimizer step does and how many there are."""

    steps: int = 80
    """Total optimizer steps of the run (the learning-rate schedule spans them)."""
    global_batch: int = 8
    """Sequences per optimizer step over all processes; = micro_batch x data-parallel ranks x accumulation."""
    micro_batch: int = 1
    """Sequences per forward/backward on one process."""
    lr: float = 3e-4
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr x this ratio."""
    warmup: int = 10
    """Linear warm-up steps (counted in applied updates)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (matrices only; norms are not decayed)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping; the norm is still logged)."""
    z_loss: float = 1e-4
    """PaLM z-loss coefficient: adds z_loss x logsumexp^2 per counted token."""
    loss_chunk: int = 8192
    """Tokens per chunk of the chunked cross-entropy (never L x vocab logits at once)."""

    def __post_init__(self) -> None:
        for name in ("steps", "global_batch", "micro_batch", "loss_chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        at_most(self, MAX_BATCH, "lcft's limit of sequences in a batch", "global_batch", "micro_batch")
        not_negative(self, "warmup")
        finite(self, "lr", "min_lr_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "grad_clip",
               "z_loss")
        not_negative(self, "lr", "weight_decay", "grad_clip", "z_loss")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must be within [0, 1] (got {self.min_lr_ratio})")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be within [0, 1) (got {getattr(self, name)})")
        if self.adam_eps <= 0:
            raise ConfigError(f"adam_eps must be positive (got {self.adam_eps})")
        check_batch(self.global_batch, self.micro_batch)


@dataclass
class TrainParallelConfig(CpConfig):
    """How one window is split over ranks (cp, cp_layout, cp_kv from CpConfig), how the ranks hold the weights,
    and what trades compute for memory."""

    precision: PrecisionChoice = "auto"
    """Mixed precision: bf16 autocast or fp32; auto = bf16 on CUDA and on CPUs with native bf16 (AVX-512 BF16,
    AMX, Arm BF16), fp32 on other CPUs (emulated bf16 is far slower there). Weights stay fp32."""
    compile: bool = False
    """Regional torch.compile of every decoder block's token-wise work (norms, projections, RoPE, MLP; the
    attention core stays eager); CPU (inductor, needs a C++ compiler) and CUDA. Compiling costs time once."""
    checkpointing: Checkpointing = "none"
    """Activation checkpointing: none, or block (recompute each decoder block in backward)."""
    offload_activations: bool = False
    """With block checkpointing: keep the saved block inputs in CPU memory."""
    offload_bf16: bool = False
    """With --offload-activations under bf16: keep the offloaded block inputs in bf16, half the host memory of
    the fp32 residual stream. The forward and the loss are the plain model's; backward recomputes each block
    from its input rounded to bf16, so gradients differ from the exact ones (on a test model by about half of
    what bf16 autocast's own rounding moves them from fp32)."""
    shard: Shard = "none"
    """How ranks hold the weights: 'none' = every rank holds the whole model and its AdamW state (DDP; fastest
    while it fits, checkpoints as plain safetensors); 'fsdp' = FSDP2 shards parameters, gradients and optimizer
    state over every rank of the dp x cp layout (per-rank model state / world size; checkpoints written
    shard by shard through torch's distributed checkpoint, DCP). One process holds the whole model: a warning says so."""
    offload_params: bool = False
    """With --shard fsdp: keep the sharded parameters, gradients and optimizer state in CPU memory (FSDP2's
    CPU offload; the optimizer step runs on the CPU). Nothing to move on a CPU-only run."""

    def __post_init__(self) -> None:
        CpConfig.__post_init__(self)  # cp, and every Literal of this section
        if self.offload_activations and self.checkpointing != "block":
            raise ConfigError("offload_activations needs checkpointing = 'block'")
        if self.offload_bf16 and not self.offload_activations:
            raise ConfigError("offload_bf16 needs offload_activations")
        if self.offload_params and self.shard != "fsdp":
            raise ConfigError("offload_params needs shard = 'fsdp'")

    def sharded(self, world: int) -> bool:
        """Whether --shard fsdp shards anything on `world` processes: one process holds the whole model."""
        return shards_parameters(self.shard == "fsdp", world)

    def idle(self, world: int) -> list[str]:
        """A warning for each option given that changes nothing on `world` processes (a shared config, or a
        flag meant for a launch of several): --shard fsdp (with --offload-params) on one process, the window
        split's options (--cp-kv, --cp-layout other than their defaults) without cp."""
        warnings = []
        if self.shard == "fsdp" and not self.sharded(world):
            flags = "--shard fsdp --offload-params have" if self.offload_params else "--shard fsdp has"
            warnings.append(f"warning: {flags} no effect on one process: nothing to shard across, it holds the whole "
                            "model (start several with --nproc N)")
        return warnings + self.idle_split()


@dataclass
class LoggingOptions:
    """Where the metrics go besides metrics.jsonl, and what the terminal shows."""

    tensorboard: bool = False
    """Also log the metrics to TensorBoard (Accelerate tracker) under <out>/tensorboard."""
    progress: bool = True
    """Show progress on rank 0: a live view on a terminal, else plain lines on stderr (each of the first 5 steps,
    then one a minute, and the last)."""


# TrainConfig's sections: attribute, `lcft train --help` panel, dataclass; in the order the panels are listed.
_SECTIONS: tuple[tuple[str, str, type], ...] = (
    ("dataset", "Data", DataOptions), ("checkpoint", "Checkpoint", CheckpointOptions),
    ("model", "Model overrides", ModelOverrides), ("optim", "Optimizer", OptimConfig),
    ("parallel", "Parallel and memory", TrainParallelConfig), ("logging", "Logging", LoggingOptions),
    ("launch", "Launch", LaunchConfig), ("guard", "Guard", GuardConfig))
# Options that do not change the training trajectory: a run folder may be continued with different values. Whole
# sections: where the run is checkpointed and logged, where and how it is launched, how a sequence is split over
# ranks (cp, cp_layout, cp_kv: the same trajectory up to rounding); and where the weights live (shard,
# offload_params: up to rounding) and compile (the same numbers up to rounding).
RUN_NEUTRAL = frozenset({f.name for cls in (CheckpointOptions, LoggingOptions, LaunchConfig, CpConfig)
                         for f in dataclasses.fields(cls)} | {"compile", "shard", "offload_params"})
# The panels of `lcft train --help` (one per section): every option in exactly one.
SECTIONS: dict[str, tuple[str, ...]] = {title: tuple(f.name for f in dataclasses.fields(cls))
                                         for _, title, cls in _SECTIONS}


@dataclass
class TrainConfig(DataOptions, CheckpointOptions, ModelOverrides, OptimConfig, TrainParallelConfig, LoggingOptions,
                  LaunchConfig, GuardConfig):
    """Everything `lcft train` needs; defaults < `--config run.toml` < command-line flags. One flat set of
    options (flags and TOML keys), declared and checked by section: `cfg.optim`, `cfg.guard`, ... are the
    section dataclasses, built (and so validated) once when the config is; a component takes its section.
    Change a config with dataclasses.replace (a new config, its sections built again)."""

    sections: ClassVar[tuple[tuple[str, str, type], ...]] = _SECTIONS

    def __post_init__(self) -> None:
        """Each section validates its own options once, when it is built here (no files: those are checked when
        training starts); no check spans two sections."""
        self._sections = {name: cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})
                          for name, _, cls in self.sections}

    @property
    def dataset(self) -> DataOptions:
        return self._sections["dataset"]

    @property
    def checkpoint(self) -> CheckpointOptions:
        return self._sections["checkpoint"]

    @property
    def model(self) -> ModelOverrides:
        return self._sections["model"]

    @property
    def optim(self) -> OptimConfig:
        return self._sections["optim"]

    @property
    def parallel(self) -> TrainParallelConfig:
        return self._sections["parallel"]

    @property
    def logging(self) -> LoggingOptions:
        return self._sections["logging"]

    @property
    def launch(self) -> LaunchConfig:
        return self._sections["launch"]

    @property
    def guard(self) -> GuardConfig:
        return self._sections["guard"]

    def stops_after(self, start: int = 0) -> int | None:
        """--stop-after as the run takes it, resuming after step `start`: None where it stops no earlier than
        --steps (no invocation runs past them), as when left unset."""
        return self.stop_after if self.stop_after is not None and self.stop_after < self.steps - start else None

    def run_defining(self) -> dict[str, Any]:
        """The options that shape the trajectory: two runs with equal values are the same run."""
        return {k: v for k, v in to_dict(self).items() if k not in RUN_NEUTRAL}


def parse_rope_scaling(text: str) -> dict[str, Any] | None:
    """'yarn:8:65536' -> {'rope_type': 'yarn', 'factor': 8.0, 'original_max_position_embeddings': 65536};
    'none' -> None (plain RoPE); a JSON object is taken as HF's dict."""
    s = text.strip()
    if s.lower() in ("none", "default", ""):
        return None
    if s.startswith("{"):
        out = parse_text(json.loads, "JSON", s, "rope_scaling", ConfigError)  # nesting bounded, one line
        if not isinstance(out, dict):
            raise ConfigError("rope_scaling: the JSON must be an object")
        _check_factor(out)
        return out
    parts = s.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"rope_scaling: {text!r} is not TYPE:FACTOR[:ORIGINAL_LENGTH] (e.g. yarn:8:65536)")
    kind = parts[0].strip().lower()
    if kind == "default":  # plain RoPE takes no factor
        raise ConfigError(f"rope_scaling: {text!r} is plain RoPE, written 'none'")
    check_choice(kind, ScaledRopeType, "rope_scaling type")  # only what takes a factor is listed
    try:
        out = {"rope_type": kind, "factor": float(parts[1])}
        if len(parts) == 3:
            from lcft.config import parse_size

            out["original_max_position_embeddings"] = parse_size(parts[2])
    except (ValueError, ConfigError):
        raise ConfigError(f"rope_scaling: {text!r} has a bad number") from None
    _check_factor(out)
    return out


def _check_factor(scaling: dict[str, Any]) -> None:
    """A scaling type's factor is how many times it stretches the context the model knew: below 1 it would shrink
    it, which transformers warns of for each type (its factor "must be a float or int >= 1"). A JSON factor that is
    no number is left to lcft.model.config.normalize_rope_scaling, which refuses it as config.json's."""
    kind, factor = scaling.get("rope_type", scaling.get("type")), scaling.get("factor")
    number = isinstance(factor, int | float) and not isinstance(factor, bool)
    if kind in get_args(ScaledRopeType) and number and not factor >= 1:  # (not >=: NaN too)
        raise ConfigError(f"rope_scaling: the factor must be at least 1, got {factor:g} (how many times {kind} "
                          "stretches the model's context; 'none' is plain RoPE)")


def resolve_config(config_file: str | os.PathLike | None = None, flags: dict[str, Any] | None = None) -> TrainConfig:
    """defaults < TOML file < flags (None in flags = not given); unknown keys are an error naming the key."""
    return resolve(TrainConfig, config_file, flags, where="train config", table="train")


def load_run_config(path: str | os.PathLike) -> TrainConfig:
    """Read a resolved config.toml written by the trainer (next to a checkpoint or at <run>/config.toml)."""
    return build(TrainConfig, load_toml(path), where=str(path))


_UNSET = re.compile(r"default: ([^.;)]+)")  # a field docstring's 'default: ...' clause: what None stands for


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys of two TrainConfig dicts whose values differ, as 'key: old -> new' lines; an option left unset
    (None) is worded as the default its help names ('the default (the window length)'), never as None."""
    def shown(k: str, v: Any) -> str:
        if v is not None:
            return repr(v)
        m = _UNSET.search(doc(TrainConfig, k))
        return f"the default ({m.group(1).strip()})" if m else "the default"

    keys = sorted(set(a) | set(b))
    return [f"{k}: {shown(k, a.get(k))} -> {shown(k, b.get(k))}" for k in keys if a.get(k) != b.get(k)]


def resolve_folders(cfg: TrainConfig) -> TrainConfig:
    """cfg with its folders given and made absolute (the same in every process of a launch)."""
    if not cfg.data:
        raise ConfigError("data: give the prepared data folder (--data)")
    if not cfg.out:
        raise ConfigError("out: give the run folder (--out)")
    return absolute_paths(cfg)  # (lcft.config_toml: the one rule for every command's paths)
