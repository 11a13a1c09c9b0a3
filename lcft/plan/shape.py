"""`Shape`: the sizes of a model that `lcft plan`'s formulas read (docs/plan.md), and its parameter count."""

from __future__ import annotations

from dataclasses import dataclass

from lcft.model.config import LlamaConfig


@dataclass(frozen=True)
class Shape:
    """The sizes of a model the formulas need (per block unless named otherwise)."""

    hidden: int
    inter: int
    layers: int
    q_width: int
    kv_width: int
    vocab: int
    head_dim: int
    experts: int
    top_experts: int
    qk_norm: bool
    tied: bool
    sparse: bool
    block: int
    budget: int
    qkv_bias: bool = False
    o_bias: bool = False

    @classmethod
    def of(cls, cfg: LlamaConfig) -> Shape:
        spec = cfg.attention.sparse
        d = int(cfg.head_dim)
        return cls(cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads * d,
                   cfg.num_key_value_heads * d, cfg.vocab_size, d, cfg.num_local_experts, cfg.num_experts_per_tok,
                   cfg.qk_norm, cfg.tie_word_embeddings, cfg.attention.backend == "sparse", spec.block_size,
                   spec.budget, cfg.attention_bias, cfg.o_proj_bias)

    @property
    def block_matrices(self) -> int:
        """Weights of the matrices of one block: q/k/v/o projections and the MLP (every expert, + router)."""
        attn = 2 * self.hidden * self.q_width + 2 * self.hidden * self.kv_width
        mlp = 3 * self.hidden * self.inter * max(1, self.experts) + self.hidden * self.experts
        return attn + mlp

    @property
    def block_params(self) -> int:
        """One block's parameters: its matrices, two norms, (Qwen3) the q/k norms, the q/k/v and o_proj biases
        (Qwen2; Llama and Qwen3 with attention_bias): few, but the count is printed and must be the model's."""
        biases = (self.q_width + 2 * self.kv_width if self.qkv_bias else 0) + (self.hidden if self.o_bias else 0)
        return self.block_matrices + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0) + biases

    @property
    def root_params(self) -> int:
        """Parameters outside the blocks: embedding, final norm, LM head (unless tied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params

    @property
    def saved_per_token(self) -> int:
        """Values one block saves for backward per token (plain path): its input and the attention norm's
        input to the fused qkv matmul (2H), q, k, v and the core output (2 q + 2 kv widths), the output
        projection's contiguous input (q width), the residual and the MLP norm's output (2H), the fused
        gate|up output and silu(gate) and their product (4I, per routed expert under MoE); Qwen3 adds the
        q/k norm inputs."""
        inter = self.inter * (self.top_experts if self.experts else 1)
        qk = self.q_width + self.kv_width if self.qk_norm else 0
        return 4 * self.hidden + 3 * self.q_width + 2 * self.kv_width + 4 * inter + qk

    def saved_bytes(self, a: int, r: int) -> int:
        """Bytes one block saves per token: saved_per_token at `a` bytes, its 2H of residual stream at `r`; under
        MoE, per routed expert, the expert's gathered input (fp32, or its two bf16 casts for gate and up: 4 B
        either way), its output (a) and the router-weighted output that index_add_ keeps (fp32, as the router's
        weights are): measured against autograd's saved tensors (tests/plan/test_plan_oracles.py)."""
        routed = self.top_experts * self.hidden * (4 + a + 4) if self.experts else 0
        return self.saved_per_token * a + 2 * self.hidden * (r - a) + routed

    def saved_buffers(self, a: int, r: int) -> list[tuple[int, int]]:
        """saved_bytes split into the buffers one block saves: (bytes per token of one buffer, how many). Under
        MoE an expert's buffers hold its share of the tokens (top_experts / experts of them, on average)."""
        out = [(self.hidden * r, 2), (self.hidden * a, 2), (self.q_width * a, 3), (self.kv_width * a, 2)]
        if self.qk_norm:
            out += [(self.q_width * a, 1), (self.kv_width * a, 1)]
        if not self.experts:
            return out + [(2 * self.inter * a, 1), (self.inter * a, 2)]
        share = self.top_experts / self.experts  # (a float: these buffers are per expert, of its tokens)
        per_expert = [(2 * self.inter * a, 1), (self.inter * a, 2), (self.hidden * 4, 2), (self.hidden * a, 1)]
        return out + [(round(w * share), n * self.experts) for w, n in per_expert]

    def copied_weights(self, cast: bool) -> int:
        """Weight values one block copies and saves for backward: the fused qkv matrix and (dense) the fused
        gate|up one; under bf16 autocast over fp32 weights (`cast`) also the cast copy of every weight a matmul
        reads unfused: o_proj and (dense) down, or every expert's gate, up and down and the router."""
        qkv = self.hidden * (self.q_width + 2 * self.kv_width)
        if self.experts:
            mlp = 3 * self.hidden * self.inter * self.experts + self.hidden * self.experts if cast else 0
        else:
            mlp = 2 * self.hidden * self.inter + (self.hidden * self.inter if cast else 0)
        return qkv + mlp + (self.hidden * self.q_width if cast else 0)
