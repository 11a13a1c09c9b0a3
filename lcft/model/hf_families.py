"""The config.json table of the five HuggingFace families lcft trains (Llama, Mistral, Qwen2, Qwen3, Mixtral): the
keys every family reads, and per class its own fields, the values lcft honours, the LlamaConfig fields it fixes, its
sliding-window scheme and transformers' defaults. One table, used both ways by lcft.model.hf (read and export)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# config.json keys that every family reads and writes under the same name as the LlamaConfig field.
COMMON = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
          "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache")
# The network's shape: a config.json must give it (transformers would fall back to its 7B default shape).
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Keys that describe the file, its own code or generation, not the network: read past, never written back (an
# export names the standard class, so transformers needs no remote code).
METADATA = frozenset({"architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype",
                      "dtype", "output_attentions", "output_hidden_states", "return_dict",
                      "tokenizer_class", "max_length", "min_length", "do_sample", "temperature", "top_p",
                      "top_k", "num_beams", "_attn_implementation_autoset", "bad_words_ids", "auto_map",
                      "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type"})
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
             "original_max_position_embeddings")  # the last: read into a llama3 / yarn table, as transformers does
QWEN_WINDOW_KEYS = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")
# Other config.json spellings of a fixed value that transformers reads as that value: its ACT2FN maps "swish" to
# nn.SiLU as it maps "silu" to SiLUActivation, both torch's silu.
FIXED_SPELLINGS: dict[str, tuple[Any, ...]] = {"hidden_act": ("swish",)}
# The JSON types of the fixed keys that transformers' config classes declare and its models train with: its config
# refuses null hidden_act and router_jitter_noise, an integer router_jitter_noise, a float or boolean
# pretraining_tp, a boolean attention_dropout; Llama's takes a null attention_dropout, which its training then
# hands to dropout as the rate, and Mixtral's block compares a jitter with `> 0` in training. Checked before the
# value, as a boolean equals 0 or 1 in Python; mlp_bias is a BOOL_KEYS key.
FIXED_TYPES: dict[str, tuple[type, ...]] = {"hidden_act": (str,), "attention_dropout": (int, float),
                                            "pretraining_tp": (int, type(None)), "router_jitter_noise": (float,)}
# config.json keys read as true or false (where the family reads them): each must be a JSON boolean.
BOOL_KEYS = ("tie_word_embeddings", "use_cache", "attention_bias", "output_router_logits", "use_sliding_window",
             "mlp_bias")


@dataclass(frozen=True)
class Family:
    """How one HF architecture class maps onto LlamaConfig."""

    model_type: str
    architecture: str
    fields: tuple[str, ...] = ()
    """Family-specific keys stored under the LlamaConfig field's own name."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """config.json keys whose only value lcft honours (written on export, checked on load)."""
    implied: dict[str, Any] = field(default_factory=dict)
    """LlamaConfig fields the class fixes (set on load; a model with other values cannot be exported as it)."""
    shared_bias: bool = False
    """config.json `attention_bias` puts a bias on q, k, v and o_proj (Llama, Qwen3)."""
    window: str | None = None
    """'plain' = `sliding_window` for every layer (Mistral, Mixtral); 'qwen' = use_sliding_window +
    max_window_layers / layer_types."""
    null_refused: tuple[str, ...] = ()
    """COMMON keys whose null transformers' class builds no model of (Qwen2 and Qwen3 take a null head_dim as
    the head width, where Llama and Mistral derive it)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """transformers' defaults of this class (its __init__'s) for keys a config.json leaves out; None for
    num_key_value_heads / head_dim = derived (num_attention_heads; hidden_size / num_attention_heads)."""


_NO_MOE = {"num_local_experts": 0, "output_router_logits": False}
_PLAIN_ATTN = {"attention_bias": False, "o_proj_bias": False, "qk_norm": False}
_BASE_FIXED = {"hidden_act": "silu", "attention_dropout": 0.0}
_SHAPE = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": None,
          "initializer_range": 0.02, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "use_cache": True}
_MISTRAL = {**_SHAPE, "vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
            "max_position_embeddings": 131072}
_QWEN = {**_SHAPE, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
         "max_position_embeddings": 32768, "bos_token_id": None, "eos_token_id": None, "sliding_window": 4096}

FAMILIES: dict[str, Family] = {f.architecture: f for f in (
    Family("llama", "LlamaForCausalLM", fixed={**_BASE_FIXED, "mlp_bias": False, "pretraining_tp": 1},
           implied={**_NO_MOE, "qk_norm": False, "sliding_window": None}, shared_bias=True,
           defaults={**_SHAPE, "vocab_size": 32000, "intermediate_size": 11008, "num_key_value_heads": None,
                     "max_position_embeddings": 2048}),
    Family("mistral", "MistralForCausalLM", fixed=dict(_BASE_FIXED), implied={**_NO_MOE, **_PLAIN_ATTN},
           window="plain", defaults={**_MISTRAL, "sliding_window": 4096}),
    Family("qwen2", "Qwen2ForCausalLM", fixed=dict(_BASE_FIXED),
           implied={**_NO_MOE, "attention_bias": True, "o_proj_bias": False, "qk_norm": False}, window="qwen",
           null_refused=("head_dim",), defaults=_QWEN),
    Family("qwen3", "Qwen3ForCausalLM", fixed=dict(_BASE_FIXED), implied={**_NO_MOE, "qk_norm": True},
           shared_bias=True, window="qwen", null_refused=("head_dim",), defaults={**_QWEN, "head_dim": 128}),
    Family("mixtral", "MixtralForCausalLM",
           fields=("num_local_experts", "num_experts_per_tok", "output_router_logits", "router_aux_loss_coef"),
           fixed={**_BASE_FIXED, "router_jitter_noise": 0.0}, implied=dict(_PLAIN_ATTN), window="plain",
           defaults={**_MISTRAL, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
                     "router_aux_loss_coef": 0.001}),
)}
BY_TYPE = {f.model_type: f for f in FAMILIES.values()}
