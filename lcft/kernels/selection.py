"""Block-mean top-k key-block selection in chunked PyTorch (never the full score matrix); the `Selector`
interface and registry that use it live in `lcft.kernels.selectors`.

Block-mean definitions (docs/design.md, Sparse attention), for query block i (global id) and key block j:
- summary(j) = mean of the keys of block j, per KV head;
- score(i, j) = sum over the query heads h of the KV group of mean(q_h of block i) · summary(j);
- mandatory blocks: own (i), the `local` blocks before it (i-1 .. i-local), the `sink` first blocks (0 .. sink-1);
- the `top_k` best-scoring earlier blocks that are not mandatory (ties -> lower index); never a future block.
Output rows hold the chosen global key-block ids in ascending order, padded with -1 to spec.budget.
"""

from __future__ import annotations

import torch

from lcft.kernels.spec import SparseSpec

# Target number of score entries per selection chunk (query blocks x key blocks), ~16 MiB in fp32.
_SELECT_CHUNK_ELEMS = 1 << 22


def block_means(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mean over each block of tokens, in fp32: (B, H, L, D) -> (B, H, L/block, D). A 2-byte x is upcast one head
    at a time (the same sums): a whole fp32 copy of q would be 8 GiB at 1M tokens for 32 heads of 64."""
    b, h, length, d = x.shape
    blocks = x.reshape(b, h, length // block_size, block_size, d)  # (B, H, nB, block, D)
    if x.dtype == torch.float32:
        return blocks.mean(dim=3)  # (B, H, nB, D)
    out = torch.empty(b, h, length // block_size, d, dtype=torch.float32, device=x.device)  # (B, H, nB, D)
    for i in range(h):
        out[:, i] = blocks[:, i].float().mean(dim=2)  # (B, nB, D)
    return out


def group_query_sums(q: torch.Tensor, num_kv_heads: int, block_size: int) -> torch.Tensor:
    """Block means of q summed over the query heads of each KV group: (B, Hq, L, D) -> (B, Hkv, nQ, D).

    score(i, j) = sum_h mean_h(i) · summary(j) = (sum_h mean_h(i)) · summary(j), so one dot product per pair.
    """
    b, hq, _, d = q.shape
    qm = block_means(q, block_size)  # (B, Hq, nQ, D)
    return qm.reshape(b, num_kv_heads, hq // num_kv_heads, -1, d).sum(dim=2)  # (B, Hkv, nQ, D)


def topk_rows(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Column ids of the k largest finite entries of each row, ties -> lower column, -1 padded.

    scores: (R, N) fp32 with -inf for excluded columns. Returns (R, k) int64 (order within a row unspecified).
    torch.topk's choice among equal values is unspecified, so rows where the k-th value also occurs outside
    the chosen set (a tie across the boundary) are recomputed by the exact, slower `_topk_rows_exact`.
    """
    r, n = scores.shape
    if k == 0 or n == 0:
        return torch.full((r, k), -1, dtype=torch.long, device=scores.device)
    kk = min(k, n)
    vals, ids = scores.topk(kk, dim=1, sorted=False)  # (R, kk)
    kth = vals.amin(dim=1, keepdim=True)  # (R, 1)
    ids = torch.where(vals > float("-inf"), ids, -1)  # excluded columns are not chosen
    straddle = (kth.squeeze(1) > float("-inf")) & ((scores == kth).sum(1) > (vals == kth).sum(1))  # (R,)
    if bool(straddle.any()):
        ids[straddle] = _topk_rows_exact(scores[straddle], kk)
    if kk < k:
        ids = torch.cat([ids, ids.new_full((r, k - kk), -1)], dim=1)
    return ids


def _topk_rows_exact(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Exact tie-breaking top-k: only the k-th value is taken from torch.topk; (R, N) -> (R, k) ids, -1 padded."""
    r, n = scores.shape
    out = torch.full((r, k + 1), -1, dtype=torch.long, device=scores.device)
    kth = scores.topk(k, dim=1).values[:, -1:]  # (R, 1) the k-th largest value
    finite = scores > float("-inf")  # (R, N)
    above = (scores > kth) & finite  # (R, N)
    n_above = above.sum(dim=1, keepdim=True)  # (R, 1)
    tie = (scores == kth) & finite  # (R, N)
    take_tie = tie & (tie.cumsum(dim=1) <= (k - n_above))  # lowest-index ties fill the remaining slots
    chosen = above | take_tie  # (R, N), at most k per row
    # Compact each row's chosen ids into the first slots; the rest go to a dump column k.
    slot = torch.where(chosen, chosen.cumsum(dim=1) - 1, torch.full_like(n_above, k))  # (R, N)
    cols = torch.arange(n, device=scores.device).expand(r, n)  # (R, N)
    out.scatter_(1, slot, torch.where(chosen, cols, -1))
    return out[:, :k]


def assemble_indices(
    topk_ids: torch.Tensor, q_block_ids: torch.Tensor, local_blocks: int, sink_blocks: int
) -> torch.Tensor:
    """Merge top-k ids with the mandatory blocks into ascending, -1 padded rows of width budget.

    topk_ids: (..., nQ, top_k) ids (-1 = none), disjoint from the mandatory blocks;
    q_block_ids: (nQ,) global query-block ids. Returns (..., nQ, budget) int32.
    """
    dev = topk_ids.device
    own = q_block_ids.to(dev).long()[:, None]  # (nQ, 1)
    local = own - torch.arange(1, local_blocks + 1, device=dev)  # (nQ, local)
    sink = torch.arange(sink_blocks, device=dev).expand(own.shape[0], sink_blocks)  # (nQ, sink)
    sink = torch.where(sink <= own, sink, -1)  # a sink block after the own block does not exist yet
    mandatory = torch.cat([own, local.clamp(min=-1), sink], dim=1)  # (nQ, 1 + local + sink)
    rows = torch.cat([mandatory.expand(*topk_ids.shape[:-1], -1), topk_ids.long()], dim=-1)  # (..., nQ, S)
    big = torch.iinfo(torch.long).max
    rows = torch.where(rows < 0, big, rows).sort(dim=-1).values
    dup = torch.zeros_like(rows, dtype=torch.bool)
    dup[..., 1:] = rows[..., 1:] == rows[..., :-1]  # sink and local blocks may coincide near the start
    rows = torch.where(dup, big, rows).sort(dim=-1).values
    return torch.where(rows == big, -1, rows).to(torch.int32)


def candidate_mask(
    q_ids: torch.Tensor, n_k: int, local_blocks: int, sink_blocks: int
) -> torch.Tensor:
    """(nQ, nK) bool: key blocks eligible for top-k (earlier than the own block and not mandatory)."""
    kb = torch.arange(n_k, device=q_ids.device)[None, :]  # (1, nK)
    own = q_ids[:, None]  # (nQ, 1)
    return (kb < own - local_blocks) & (kb >= sink_blocks)


def select_blocks_torch(q: torch.Tensor, summary: torch.Tensor, spec: SparseSpec, q_block_offset: int = 0
                        ) -> torch.Tensor:
    """Chunked block-mean top-k in PyTorch: queries (B, Hq, Lq, D) and key-block means (B, Hkv, nK, D) ->
    (B, Hkv, nQ, budget) int32 global key-block ids."""
    top_k, local_blocks, sink_blocks = spec.top_k, spec.local_blocks, spec.sink_blocks
    with torch.no_grad():
        summary = summary.float()  # (B, Hkv, nK, D)
        b, hkv, n_k, d = summary.shape
        qs = group_query_sums(q, hkv, spec.block_size)  # (B, Hkv, nQ, D)
        n_q = qs.shape[2]
        q_ids = torch.arange(q_block_offset, q_block_offset + n_q, device=q.device)  # (nQ,)
        topk_ids = torch.full((b, hkv, n_q, top_k), -1, dtype=torch.long, device=q.device)
        if top_k > 0:
            chunk = max(1, _SELECT_CHUNK_ELEMS // max(1, n_k * b * hkv))
            for i0 in range(0, n_q, chunk):
                i1 = min(n_q, i0 + chunk)
                ids = q_ids[i0:i1]
                # Only key blocks before the chunk's last own block can be candidates.
                hi = max(0, min(n_k, int(ids[-1]) - local_blocks))
                if hi <= sink_blocks:
                    continue
                s = qs[:, :, i0:i1] @ summary[:, :, :hi].transpose(-1, -2)  # (B, Hkv, C, hi)
                s = s.masked_fill(~candidate_mask(ids, hi, local_blocks, sink_blocks), float("-inf"))
                topk_ids[:, :, i0:i1] = topk_rows(s.reshape(-1, hi), top_k).reshape(b, hkv, i1 - i0, top_k)
        return assemble_indices(topk_ids, q_ids, local_blocks, sink_blocks)  # (B, Hkv, nQ, budget)
