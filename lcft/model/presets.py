"""Named model shapes: tiny (~3.2M, CPU tests and benchmarks), small (~25M), base (~145M), 1b (~0.99B)."""

from __future__ import annotations

import copy

from lcft.errors import LcftError
from lcft.model.config import LlamaConfig

# rope_theta 1e6 in every preset: the slowest RoPE frequency then has a wavelength of ~4M tokens, longer than
# the 1M-token windows, so no two positions of a window alias.
PRESETS: dict[str, LlamaConfig] = {
    # ~3.2M parameters (hidden 256 x 4 blocks): the shape of the model-step benchmark (BENCHMARKS.md).
    "tiny": LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=4, rope_theta=1e6),
    # ~25M parameters.
    "small": LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=4, rope_theta=1e6),
    # ~145M parameters.
    "base": LlamaConfig(hidden_size=1024, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=16,
                        num_key_value_heads=4, rope_theta=1e6),
    # ~0.99B parameters (TinyLlama's shape with 8 KV heads).
    "1b": LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                      num_key_value_heads=8, rope_theta=1e6),
}


def preset(name: str) -> LlamaConfig:
    """A fresh copy of a named preset (callers may modify it)."""
    if name not in PRESETS:
        raise LcftError(f"unknown model preset {name!r} (choose from {', '.join(PRESETS)})")
    return copy.deepcopy(PRESETS[name])
