"""Triton kernel bodies of block-sparse attention (imported only when a Triton kernel is first launched).

Group-centric: a program covers a tile of rows from all query heads of one KV group (GP heads x M tokens of a
query block), which share their block selection, so each chosen K/V tile is loaded once for all of them.
All offsets are int64 (1M tokens x heads x head_dim overflows int32).
"""

import triton
import triton.language as tl


@triton.jit
def _rows(bkv, qb, m0, n_heads, group, lq, q_block_offset,
          BLOCK: tl.constexpr, M: tl.constexpr, GP: tl.constexpr):
    """Row ids into (B·Hq·Lq), global positions and validity of a tile of GP heads x M tokens."""
    r = tl.arange(0, GP * M)
    head = r // M  # head within the group (GP >= group: padded heads are masked)
    tok = qb * BLOCK + m0 + r % M  # (R,) token within the local query sequence
    ok = head < group
    n_kv = n_heads // group
    bh = (bkv // n_kv) * n_heads + (bkv % n_kv) * group + tl.where(ok, head, 0)
    return bh * lq + tok, q_block_offset * BLOCK + tok, ok

@triton.jit
def fwd_kernel(Q, K, V, Out, LSE, IDX, n_heads, group, lq, lk, n_slots, q_block_offset, scale,
               BLOCK: tl.constexpr, M: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
               D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    bkv = tl.program_id(1).to(tl.int64)  # flat (b, kv head)
    qb = pid // (BLOCK // M)
    m0 = (pid % (BLOCK // M)) * M
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BD)
    q_rows, q_pos, ok = _rows(bkv, qb, m0, n_heads, group, lq, q_block_offset, BLOCK, M, GP)  # (R,)
    rmask = ok[:, None] & (offs_d[None, :] < D)  # (R, BD)
    dmask = offs_d[None, :] < D
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)  # (R, BD)
    m_i = tl.full((GP * M,), float("-inf"), tl.float32)
    l_i = tl.zeros((GP * M,), tl.float32)
    acc = tl.zeros((GP * M, BD), tl.float32)
    idx_row = IDX + (bkv * (lq // BLOCK) + qb) * n_slots
    for slot in range(n_slots):
        kb = tl.load(idx_row + slot).to(tl.int64)
        if kb >= 0:
            for sub in range(BLOCK // BLOCK_N):
                k_pos = kb * BLOCK + sub * BLOCK_N + offs_n  # (BLOCK_N,)
                kv_off = (bkv * lk + k_pos)[:, None] * D + offs_d[None, :]
                k = tl.load(K + kv_off, mask=dmask, other=0.0)  # (BLOCK_N, BD): once for all heads
                v = tl.load(V + kv_off, mask=dmask, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale  # (R, BLOCK_N)
                s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
                alpha = tl.exp(m_i - m_safe)
                p = tl.exp(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(Out + q_rows[:, None] * D + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=rmask)
    tl.store(LSE + q_rows, m_i + tl.log(l_i), mask=ok)

@triton.jit
def dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, IDX, n_heads, group, lq, lk, n_slots, q_block_offset, scale,
              BLOCK: tl.constexpr, M: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
              D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    bkv = tl.program_id(1).to(tl.int64)
    qb = pid // (BLOCK // M)
    m0 = (pid % (BLOCK // M)) * M
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BD)
    q_rows, q_pos, ok = _rows(bkv, qb, m0, n_heads, group, lq, q_block_offset, BLOCK, M, GP)
    rmask = ok[:, None] & (offs_d[None, :] < D)
    dmask = offs_d[None, :] < D
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)  # (R, BD)
    do = tl.load(DO + q_rows[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    lse = tl.load(LSE + q_rows, mask=ok, other=0.0)
    delta = tl.load(DELTA + q_rows, mask=ok, other=0.0)
    dq = tl.zeros((GP * M, BD), tl.float32)
    idx_row = IDX + (bkv * (lq // BLOCK) + qb) * n_slots
    for slot in range(n_slots):
        kb = tl.load(idx_row + slot).to(tl.int64)
        if kb >= 0:
            for sub in range(BLOCK // BLOCK_N):
                k_pos = kb * BLOCK + sub * BLOCK_N + offs_n
                kv_off = (bkv * lk + k_pos)[:, None] * D + offs_d[None, :]
                k = tl.load(K + kv_off, mask=dmask, other=0.0)
                v = tl.load(V + kv_off, mask=dmask, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
                p = tl.where(k_pos[None, :] <= q_pos[:, None], tl.exp(s - lse[:, None]), 0.0)
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)  # (R, BLOCK_N)
                ds = p * (dp - delta[:, None])
                dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    tl.store(DQ + q_rows[:, None] * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=rmask)

@triton.jit
def dkv_kernel(Q, K, V, DO, DK, DV, PK, PV, LSE, DELTA, SEG_ROW, SEG_START, SEG_END, SEG_OUT, COL,
               n_heads, group, lq, lk, n_kb, q_block_offset, scale,
               BLOCK: tl.constexpr, KN: tl.constexpr, M: tl.constexpr, GP: tl.constexpr,
               D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
    pid = tl.program_id(0)
    seg = pid // (BLOCK // KN)
    k0 = (pid % (BLOCK // KN)) * KN  # this program's keys within the key block
    row = tl.load(SEG_ROW + seg).to(tl.int64)  # flat (b, kv head, key block)
    start = tl.load(SEG_START + seg)
    end = tl.load(SEG_END + seg)
    out_slot = tl.load(SEG_OUT + seg).to(tl.int64)  # -1: write dK/dV directly; else a partial-sum slot
    bkv = row // n_kb
    kb = row % n_kb
    offs_k = tl.arange(0, KN)
    offs_d = tl.arange(0, BD)
    dmask = offs_d[None, :] < D
    k_pos = kb * BLOCK + k0 + offs_k  # (KN,) keys of this program
    kv_off = (bkv * lk + k_pos)[:, None] * D + offs_d[None, :]
    k = tl.load(K + kv_off, mask=dmask, other=0.0)  # (KN, BD)
    v = tl.load(V + kv_off, mask=dmask, other=0.0)
    dk = tl.zeros((KN, BD), tl.float32)
    dv = tl.zeros((KN, BD), tl.float32)
    for e in range(start, end):
        qb = tl.load(COL + e).to(tl.int64)  # a query block (local id) that chose this key block
        for m0 in range(0, BLOCK, M):  # tiles of all the group's heads x M tokens (not unrolled: one buffer set)
            q_rows, q_pos, ok = _rows(bkv, qb, m0, n_heads, group, lq, q_block_offset, BLOCK, M, GP)
            rmask = ok[:, None] & dmask
            q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)  # (R, BD)
            do = tl.load(DO + q_rows[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
            lse = tl.load(LSE + q_rows, mask=ok, other=0.0)
            delta = tl.load(DELTA + q_rows, mask=ok, other=0.0)
            st = tl.dot(k, tl.trans(q), input_precision=PREC) * scale  # (keys, rows)
            vis = (k_pos[:, None] <= q_pos[None, :]) & ok[None, :]
            pt = tl.where(vis, tl.exp(st - lse[None, :]), 0.0)
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
            dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
    dk = dk * scale
    if out_slot < 0:
        tl.store(DK + kv_off, dk.to(DK.dtype.element_ty), mask=dmask)
        tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=dmask)
    else:
        p_off = (out_slot * BLOCK + k0 + offs_k)[:, None] * D + offs_d[None, :]
        tl.store(PK + p_off, dk, mask=dmask)
        tl.store(PV + p_off, dv, mask=dmask)
