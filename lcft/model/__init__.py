"""The Llama-style decoder and its HF families as flags (Mistral, Qwen2, Qwen3, Mixtral); single-process,
parallelism is applied from outside by lcft.parallel. Model folders are read and written by lcft.checkpoint."""

from lcft.model.config import AttentionConfig, LlamaConfig
from lcft.model.llama import Block, Llama
from lcft.model.presets import PRESETS, preset

__all__ = ["AttentionConfig", "Block", "Llama", "LlamaConfig", "PRESETS", "preset"]
