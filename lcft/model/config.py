"""Model configuration: HuggingFace config field names (Llama, Mistral, Qwen2/3, Mixtral) plus lcft's attention block."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from lcft.config import check_choice, check_choices
from lcft.errors import LcftError
from lcft.kernels.spec import AttentionImpl, SparseSpec
from lcft.shapes import MAX_BATCH
from lcft.vocab import BOS, EOS, MAX_VOCAB, VOCAB_SIZE

ScaledRopeType = Literal["linear", "dynamic", "yarn", "llama3"]  # the kinds that take a factor
RopeType = Literal["default", ScaledRopeType]  # "default": plain RoPE
AttentionBackend = Literal["dense", "sparse"]
ModelType = Literal["llama", "mistral", "qwen2", "qwen3", "mixtral"]  # the HF families lcft reads and writes
# Upper limits of the counts a config declares, checked before anything is sized from them (a config.json is a
# file we are handed): each is well above every published model (largest hidden 16384, head_dim 256, 126
# layers, 256 experts, vocabularies of 256K) and low enough that no single count can ask for an absurd tensor.
COUNT_LIMITS = {"vocab_size": MAX_VOCAB, "hidden_size": 1 << 16, "intermediate_size": 1 << 19,
                "num_hidden_layers": 1024, "num_attention_heads": 1024, "num_key_value_heads": 1024,
                "head_dim": 2048, "num_local_experts": 1024, "num_experts_per_tok": 1024,
                "max_position_embeddings": 1 << 34, "sliding_window": 1 << 34}
# SwiGLU MLPs a model has (one a layer; under MoE one an expert a layer, three weight tensors each), bounded before
# a model is built from a config, even on the meta device (~0.3 ms a module there): with each count within its own
# limit, 1024 layers x 1024 experts would be a million, half an hour of building before its weights are compared.
# The largest of the families lcft reads has 56 x 8 = 448 (Mixtral 8x22B); DeepSeek-V3, 61 x 256 = 15,616.
MAX_MLPS = 1 << 14
POSITIVE_REALS = {"rope_theta", "rms_norm_eps"}
# Reals that may be 0: Mixtral's load-balancing coefficient (0 = the loss is computed but adds nothing), and the
# standard deviation of fresh weights (transformers takes 0; a loaded checkpoint never uses it).
NONNEGATIVE_REALS = {"router_aux_loss_coef", "initializer_range"}
# float32, the dtype lcft computes norms, losses and fresh weights in: its largest finite and smallest normal values
# (torch.finfo(torch.float32).max and .tiny, written out so that this module needs no torch).
F32_MAX = (2 - 2**-23) * 2**127
F32_TINY = 2**-126
# The range of each of those reals that keeps what lcft computes from it finite in float32:
# rms_norm_eps is added to a float32 mean of squares: below F32_TINY it is lost (0 where subnormals flush to zero),
#   and a row of zeros (an embedding's zeroed padding row) normalises to 0 x inf = NaN; above F32_MAX it is inf and
#   every norm outputs 0. transformers computes the same in float32, to the same NaN or zeros.
# initializer_range is the standard deviation of a fresh model's weights: 1e308 is inf in float32, every weight
#   then +-inf. transformers' LlamaConfig refuses it above 1 (a config.json lcft writes must load there).
# router_aux_loss_coef multiplies the load-balancing loss, at most num_local_experts (E x sum_e f_e x p_e with each
#   f_e <= 1 and the p_e summing to 1), and the tokens of a micro-batch (at most MAX_BATCH sequences of the largest
#   max_position_embeddings): the product must stay within F32_MAX (at 1e308 every step's loss is inf).
REAL_RANGES = {"rms_norm_eps": (F32_TINY, F32_MAX), "initializer_range": (0.0, 1.0),
               "router_aux_loss_coef": (0.0, F32_MAX / (COUNT_LIMITS["num_local_experts"] * MAX_BATCH
                                                        * COUNT_LIMITS["max_position_embeddings"]))}
# Token ids config.json records (eos_token_id may be a list of them): each null or a row of the embedding.
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# What each rope_scaling type reads (transformers' _compute_*_parameters), and what each field must be: "positive"
# a number in (0, ROPE_LIMIT] (each is divided by or goes into a log), "off-or-positive" one in [0, ROPE_LIMIT]
# (yarn's mscale: 0 switches it off, a negative one can zero the attention factor's denominator), "positions" a
# whole number of positions, "bool" true or false. ROPE_LIMIT is far above every published value (factors of 4 to
# 64, beta_fast 32) and keeps every frequency formula finite. ROPE_OPTIONAL: null = transformers' default.
ROPE_FIELDS = {"linear": ("factor",), "dynamic": ("factor",),
               "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                        "mscale", "mscale_all_dim", "truncate"),
               "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")}
ROPE_KINDS = {"original_max_position_embeddings": "positions", "truncate": "bool", "mscale": "off-or-positive",
              "mscale_all_dim": "off-or-positive"}  # every other field: "positive"
ROPE_OPTIONAL = {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}
ROPE_LIMIT = 1 << 20
# Fields that are true or false: a config.json must give a JSON boolean (transformers 5 refuses anything else; a
# string "false" or a 0 would otherwise be read by truthiness, the opposite of what the file says).
BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "o_proj_bias", "qk_norm", "output_router_logits", "use_cache")


@dataclass
class AttentionConfig:
    """Which attention runs inside each block (not part of HF's config; saved in lcft.json)."""

    backend: AttentionBackend = "dense"
    """dense = causal scaled-dot-product attention (flash-attn on CUDA when installed); sparse = block-sparse
    attention from lcft.kernels."""
    sparse: SparseSpec = field(default_factory=SparseSpec)
    """Sparse backend: block size, top-k, local and sink blocks, selector (its block size is also the unit
    context parallelism cuts a window into, for either backend)."""
    impl: AttentionImpl = "auto"
    """Sparse backend implementation: auto, reference, cpu or triton."""

    def __post_init__(self) -> None:
        check_choices(self)  # backend and impl: lcft.json is a file we are handed, read into this class
        if isinstance(self.sparse, dict):
            self.sparse = SparseSpec(**self.sparse)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttentionConfig:
        """From lcft.json's flat attention object ({backend, impl, block_size, top_k, ...}; older checkpoints
        lack `selector`). Unknown keys raise TypeError."""
        spec_keys = {f.name for f in fields(SparseSpec)}
        spec = {k: v for k, v in d.items() if k in spec_keys}
        rest = {k: v for k, v in d.items() if k not in spec_keys}
        if spec:
            rest["sparse"] = SparseSpec(**spec)
        return cls(**rest)

    def to_dict(self) -> dict[str, Any]:
        """The flat object lcft.json stores (read back by `from_dict`)."""
        return {"backend": self.backend, "impl": self.impl, **asdict(self.sparse)}


@dataclass
class LlamaConfig:
    """A Llama decoder's shape; field names and meanings follow HuggingFace's `LlamaConfig`."""

    vocab_size: int = VOCAB_SIZE
    """Rows of the token embedding and of the LM head (the DNA vocabulary padded to 16)."""
    hidden_size: int = 256
    """Width of the residual stream."""
    intermediate_size: int = 704
    """Width of the SwiGLU MLP's hidden layer."""
    num_hidden_layers: int = 4
    """Number of decoder blocks."""
    num_attention_heads: int = 4
    """Query heads per block."""
    num_key_value_heads: int = 4
    """Key/value heads per block (grouped-query attention when fewer than the query heads)."""
    rope_theta: float = 10000.0
    """RoPE base period."""
    rope_scaling: dict[str, Any] | None = None
    """HF-style RoPE scaling, e.g. {'rope_type': 'yarn', 'factor': 8.0, 'original_max_position_embeddings':
    8192}; types linear, dynamic, yarn, llama3; None = plain RoPE."""
    max_position_embeddings: int = 1 << 20
    """Longest sequence the model is meant for (used by the dynamic and yarn/llama3 defaults)."""
    rms_norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    tie_word_embeddings: bool = False
    """Share the LM head's weight with the token embedding."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of linear and embedding weights."""
    model_type: ModelType = "llama"
    """HF architecture family (llama, mistral, qwen2, qwen3, mixtral): the class export writes back."""
    head_dim: int | None = None
    """Width of one attention head; None = hidden_size / num_attention_heads (Qwen3 and others set it
    explicitly, any even width, e.g. 96)."""
    attention_bias: bool = False
    """Bias on the q, k and v projections (Qwen2; Llama and Qwen3 put it on o_proj too, see o_proj_bias)."""
    o_proj_bias: bool = False
    """Bias on the attention output projection (HF Llama/Qwen3 `attention_bias` sets both)."""
    qk_norm: bool = False
    """RMSNorm over each head of q and of k before RoPE (Qwen3)."""
    sliding_window: int | None = None
    """Causal attention limited to the last `sliding_window` tokens (the token itself included), in every
    layer (Mistral, Mixtral, Qwen with use_sliding_window); None = full causal attention. It shapes the dense
    backend only: with the sparse backend the block-sparse pattern (sink + local + top-k blocks over the whole
    causal past) replaces the window, which is what extending such a model's context asks for."""
    num_local_experts: int = 0
    """Mixtral MoE: experts per block (0 = a plain SwiGLU MLP)."""
    num_experts_per_tok: int = 2
    """Mixtral MoE: experts each token is routed to (softmax router, top-k, weights renormalised to sum 1)."""
    output_router_logits: bool = False
    """Mixtral MoE: add the router load-balancing loss (Switch Transformer, as transformers computes it over all
    layers) times router_aux_loss_coef to the training loss."""
    router_aux_loss_coef: float = 0.001
    """Mixtral MoE: coefficient of the load-balancing loss."""
    bos_token_id: int | None = BOS
    """Beginning-of-sequence id recorded in config.json (lcft's vocabulary: BOS)."""
    eos_token_id: int | list[int] | None = EOS
    """End-of-sequence id(s) recorded in config.json (lcft's vocabulary: EOS)."""
    pad_token_id: int | None = None
    """Padding id recorded in config.json. None for lcft's vocabulary: transformers would make it the
    embedding's padding_idx (a row that never gets a gradient), so its continued training would differ."""
    use_cache: bool = True
    """Whether transformers keeps a key/value cache when generating, as config.json records it (METAGENE-1 ships
    false): kept through every config.json lcft saves; lcft's own forward never reads it."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """Attention backend and sparse parameters (lcft's own; saved in lcft.json, not config.json)."""
    carried: dict[str, Any] = field(default_factory=dict)
    """config.json keys the model's transformers class does not read (a published model's extra token ids,
    its own bookkeeping): unused here, written back unchanged into every config.json lcft saves."""

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig.from_dict(self.attention)
        check_counts({f.name: getattr(self, f.name) for f in fields(self)})
        mlps = self.num_hidden_layers * max(1, self.num_local_experts)
        if mlps > MAX_MLPS:
            raise LcftError(f"model config: {self.num_hidden_layers} layers x {max(1, self.num_local_experts)} "
                            f"experts = {mlps} MLPs, more than lcft's limit of {MAX_MLPS}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise LcftError(f"hidden_size {self.hidden_size} is not a multiple of "
                                f"num_attention_heads {self.num_attention_heads} (give head_dim)")
            self.head_dim = self.hidden_size // self.num_attention_heads
            check_count("head_dim", self.head_dim)  # derived: hidden_size / num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise LcftError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                            f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise LcftError(f"head_dim {self.head_dim} must be even for RoPE")
        for name in BOOL_FIELDS:  # use_cache is written back into config.json, where transformers takes it as is
            check_bool(name, getattr(self, name))
        check_token_ids(self.vocab_size, {name: getattr(self, name) for name in TOKEN_ID_FIELDS})
        self._check_rope()
        self._check_variant()

    def _check_rope(self) -> None:
        if self.rope_scaling is not None:
            self.rope_scaling = normalize_rope_scaling(self.rope_scaling)
        kind = self.rope_scaling["rope_type"] if self.rope_scaling is not None else "default"
        if kind in ("yarn", "llama3"):
            # Spelled out with the defaults lcft.model.rope applies: transformers refuses a llama3 dict without them.
            defaults = {"original_max_position_embeddings": self.max_position_embeddings}
            if kind == "llama3":
                defaults.update(low_freq_factor=1.0, high_freq_factor=4.0)
            self.rope_scaling = {**defaults, **self.rope_scaling}
        if kind == "yarn" and self.rope_theta <= 1:
            raise LcftError(f"rope_theta {self.rope_theta} must be above 1 for yarn RoPE scaling (its ramp divides "
                            "by log(rope_theta))")
        if kind == "dynamic" and self.head_dim <= 2:
            raise LcftError(f"head_dim {self.head_dim} must be above 2 for dynamic RoPE scaling (its base is raised "
                            "to head_dim / (head_dim - 2))")
        from lcft.model.rope import check_frequencies  # (here: it needs torch, the checks above do not)

        check_frequencies(self)

    def _check_variant(self) -> None:
        check_choice(self.model_type, ModelType, "model_type")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise LcftError(f"sliding_window must be a positive number of tokens, got {self.sliding_window}")
        if self.num_local_experts < 0 or (
                self.num_local_experts and not 1 <= self.num_experts_per_tok <= self.num_local_experts):
            raise LcftError(f"num_experts_per_tok {self.num_experts_per_tok} must be between 1 and "
                            f"num_local_experts {self.num_local_experts}")


def check_counts(values: dict[str, Any]) -> None:
    """Every count of `values` within its COUNT_LIMITS range, every POSITIVE_REALS entry a positive number and every
    NONNEGATIVE_REALS one a number >= 0, each within its REAL_RANGES range, before any tensor is sized or any loss
    computed from them: one line naming the field and the limit."""
    for name in COUNT_LIMITS.keys() & values.keys():
        if values[name] is not None or name not in ("head_dim", "sliding_window"):  # None: derived / off
            check_count(name, values[name])
    for name in (POSITIVE_REALS | NONNEGATIVE_REALS) & values.keys():
        v, positive = values[name], name in POSITIVE_REALS
        if not is_real(v) or v < 0 or (positive and v == 0):
            want = "a positive number" if positive else "a number >= 0"
            raise LcftError(f"model config: {name} must be {want}, got {v!r}")
        low, high = REAL_RANGES.get(name, (v, v))  # rope_theta: bounded by the frequencies it gives (rope.py)
        if not low <= v <= high:
            raise LcftError(f"model config: {name}={v!r} is outside {low:g}..{high:g} (lcft's limit for {name})")


def check_token_ids(vocab_size: int, ids: dict[str, Any]) -> None:
    """Each token id config.json records as transformers builds the model from it: null or a whole number of 64 bits
    (eos_token_id also a list of them); pad_token_id, the embedding's padding row, an index torch's Embedding takes
    (-vocab_size..vocab_size-1: published configs hold -1). transformers only warns of a bos/eos id outside the
    vocabulary, and lcft, which never feeds them to the model, writes them back as they are."""
    for name, v in ids.items():
        for one in v if isinstance(v, list) and name == "eos_token_id" else [v]:
            if one is not None and (isinstance(one, bool) or not isinstance(one, int) or not -2**63 <= one < 2**63):
                raise LcftError(f"model config: {name}={v!r} is not null or a whole number (a token id)")
            if name == "pad_token_id" and one is not None and not -vocab_size <= one < vocab_size:
                raise LcftError(f"model config: pad_token_id={one} is outside {-vocab_size}..{vocab_size - 1}, the "
                                f"rows of the embedding (vocab_size {vocab_size}) it pads")


def is_real(v: Any) -> bool:
    """A finite JSON number that a float holds (an int of 400 digits does not), not a bool."""
    return isinstance(v, int | float) and not isinstance(v, bool) and -sys.float_info.max <= v <= sys.float_info.max


def check_count(name: str, v: Any) -> None:
    """One count: a whole number in 1..COUNT_LIMITS[name] (num_local_experts from 0, a plain MLP)."""
    low, limit = (0 if name == "num_local_experts" else 1), COUNT_LIMITS[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise LcftError(f"model config: {name} must be a whole number, got {v!r}")
    if not low <= v <= limit:
        raise LcftError(f"model config: {name}={v} is outside {low}..{limit} (lcft's limit for {name})")


def check_bool(name: str, v: Any) -> None:
    """One boolean field: a real true or false, not a string, number or null."""
    if not isinstance(v, bool):
        raise LcftError(f"model config: {name} must be true or false, got {v!r}")


def normalize_rope_scaling(scaling: dict[str, Any], where: str = "rope_scaling") -> dict[str, Any] | None:
    """HF accepts both `type` (v4) and `rope_type`; keep `rope_type` only, and None for plain RoPE. Every field
    the type reads is checked here (ROPE_FIELDS), whether a config.json or a --rope-scaling flag gave it: one line
    naming `where` (the key it came from) and the field."""
    out = {k: v for k, v in scaling.items() if k not in ("type", "rope_theta")}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    check_choice(rope_type, RopeType, f"{where} type")
    if rope_type == "default":
        return None
    if "factor" not in out:
        raise LcftError(f"{where} type {rope_type!r} needs a 'factor'")
    for name in ROPE_FIELDS[rope_type]:
        if name in out:
            _check_rope_field(where, rope_type, name, out[name])
    low, high = out.get("low_freq_factor", 1.0), out.get("high_freq_factor", 4.0)  # lcft.model.rope's defaults
    if rope_type == "llama3" and low == high:
        raise LcftError(f"{where} low_freq_factor and high_freq_factor are both {low!r} (llama3 divides by their "
                        "difference)")
    out["rope_type"] = rope_type
    return out


def _check_rope_field(where: str, rope_type: str, name: str, v: Any) -> None:
    if v is None and (name in ROPE_OPTIONAL or (name, rope_type) == ("factor", "yarn")):  # yarn: from the lengths
        return
    kind = ROPE_KINDS.get(name, "positive")
    if kind == "bool":
        ok, want = isinstance(v, bool), "true or false"
    elif kind == "positions":
        limit = COUNT_LIMITS["max_position_embeddings"]
        ok, want = isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= limit, f"a whole number in 1..{limit}"
    else:
        off = kind == "off-or-positive"
        ok = is_real(v) and (0 <= v if off else 0 < v) and v <= ROPE_LIMIT
        want = f"a number in {'[' if off else '('}0, {ROPE_LIMIT}]"
    if not ok:
        raise LcftError(f"{where} {name}={v!r} (must be {want})")
