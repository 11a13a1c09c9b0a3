"""Kernels: block-sparse attention (reference, chunked CPU, Triton), pluggable block selection, chunked cross-entropy.

Names are resolved lazily so `import lcft` never imports triton (or anything heavy) by itself.
"""

from __future__ import annotations

from lcft.lazy import lazy_exports

_EXPORTS = {
    "sparse_attention": "lcft.kernels.sparse",
    "sparse_attention_with_indices": "lcft.kernels.sparse",
    "select_blocks": "lcft.kernels.sparse",
    "SparseSpec": "lcft.kernels.spec",
    "Selector": "lcft.kernels.selectors",
    "register_selector": "lcft.kernels.selectors",
    "get_selector": "lcft.kernels.selectors",
    "chunked_cross_entropy": "lcft.kernels.loss",
    "per_token_loss": "lcft.kernels.loss",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
