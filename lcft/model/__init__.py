"""The Llama-style decoder and its HF families as flags (Mistral, Qwen2, Qwen3, Mixtral); single-process,
parallelism is applied from outside by lcft.parallel."""

from lcft.model.config import AttentionConfig, LlamaConfig
from lcft.model.io import from_pretrained, save_pretrained
from lcft.model.llama import Block, Llama
from lcft.model.presets import PRESETS, preset

__all__ = ["AttentionConfig", "Block", "Llama", "LlamaConfig", "PRESETS", "from_pretrained", "preset",
           "save_pretrained"]
