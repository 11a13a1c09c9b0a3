"""Training samples: order is a function of (seed, epoch, global index) only; aligned sub-windows; labels and
soft-mask weights checked against the FASTA read independently by Biopython."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from Bio import SeqIO

from lcft.errors import LcftError
from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.genomics.dataset import (
    IGNORE_INDEX,
    DataConfig,
    TrainSamples,
    counted_tokens,
    sample_dtypes,
    step_indices,
)

WINDOW, SEQ = 2048, 512
CODE = {"A": 4, "C": 5, "G": 6, "T": 7}


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "w"
    # max_n_frac 0.9 keeps the window at the end of the N telomere, so N labels are exercised
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=WINDOW, train=("chr2",), eval=("chr22",),
                    max_n_frac=0.9)
    return open_windows(out, "train")


@pytest.fixture(scope="module")
def chr2() -> str:
    """The sample's chr2 record, as Biopython reads it (case kept)."""
    with gzip.open(Path(sample_fasta()), "rt") as fh:
        return str(next(r for r in SeqIO.parse(fh, "fasta") if r.id == "chr2").seq)


def test_order_depends_only_on_seed_epoch_index(windows):
    a = TrainSamples(windows, DataConfig(SEQ, seed=3))
    b = TrainSamples(windows, DataConfig(SEQ, seed=3))
    n = a.num_samples
    assert n == len(windows) * (WINDOW // SEQ)
    # queried in different orders (as different ranks / a resumed run do): the same answers
    idx = list(range(0, 3 * n, 7))
    fwd = [a.sample_id(g) for g in idx]
    back = [b.sample_id(g) for g in reversed(idx)][::-1]
    assert fwd == back
    for epoch in range(3):  # each epoch visits every sample once, in its own order
        ep = [a.sample_id(epoch * n + i) for i in range(n)]
        assert sorted(ep) == list(range(n))
    assert [a.sample_id(i) for i in range(n)] != [a.sample_id(n + i) for i in range(n)]
    c = TrainSamples(windows, DataConfig(SEQ, seed=4))
    assert [a.sample_id(i) for i in range(50)] != [c.sample_id(i) for i in range(50)]


def test_samples_against_biopython(windows, chr2):
    """input_ids = the aligned sub-window; labels = next base (ignored at N and at the end); weights =
    softmask_loss_weight where the label's base is lower case in the FASTA."""
    ds = TrainSamples(windows, DataConfig(SEQ, seed=0, softmask_loss_weight=0.1))
    rng = np.random.default_rng(0)
    checked_soft = checked_n = 0
    with_n = [w * (WINDOW // SEQ) + k for w in range(len(windows)) if (windows[w] == 8).any() for k in range(4)]
    for sid in list(rng.choice(ds.num_samples, 12, replace=False)) + with_n:
        w, off = ds.locate(int(sid))
        assert off % SEQ == 0 and w == sid // (WINDOW // SEQ)
        chrom, start, _ = windows.coords(w)
        assert chrom == "chr2"
        ref = chr2[start + off : start + off + SEQ]
        ex = ds.example(int(sid))
        up = ref.upper()
        assert ex["input_ids"].tolist() == [CODE.get(ch, 8) for ch in up]
        expect_labels = [CODE.get(ch, IGNORE_INDEX) for ch in up[1:]] + [IGNORE_INDEX]
        assert ex["labels"].tolist() == expect_labels
        expect_w = [np.float32(0.1) if ch.islower() else np.float32(1.0) for ch in ref[1:]] + [1.0]
        np.testing.assert_array_equal(ex["weights"], np.array(expect_w, dtype=np.float32))
        checked_soft += sum(ch.islower() for ch in ref)
        checked_n += up.count("N")
    assert checked_soft > 0 and checked_n > 0  # soft-masked repeats and N runs were really exercised


def test_batch_and_counts(windows):
    ds = TrainSamples(windows, DataConfig(SEQ))
    b = ds.batch([0, 5, 9])
    assert b["input_ids"].shape == b["labels"].shape == (3, SEQ) and "weights" not in b
    assert counted_tokens(b) == int((b["labels"] != IGNORE_INDEX).sum()) <= 3 * (SEQ - 1)


def test_batch_keeps_narrow_ids_and_the_loss_is_the_int64_loss(windows):
    """A char batch reaches the model as uint8 ids and int16 labels (1 + 2 bytes a token, not 8 + 8), with the
    values of the int64 batch rebuilt from the window's ids; the model and its loss on it give bit for bit the
    loss and gradients of that int64 batch."""
    import torch

    from lcft.model import Llama, LlamaConfig
    from lcft.train.step import LossModel, compute_loss

    ds = TrainSamples(windows, DataConfig(SEQ, softmask_loss_weight=0.5))
    sids = [0, 5, 9]
    b = ds.batch(sids)
    assert (b["input_ids"].dtype, b["labels"].dtype, b["weights"].dtype) == (torch.uint8, torch.int16, torch.float32)
    ids = np.stack([windows.ids(w, o, o + SEQ) for w, o in map(ds.locate, sids)]).astype(np.int64)  # (B, L)
    nxt = ids[:, 1:]
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    labels[:, :-1] = np.where(np.isin(nxt, list(CODE.values())), nxt, IGNORE_INDEX)  # the bases carry loss
    wide = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels), "weights": b["weights"]}
    assert torch.equal(b["input_ids"].long(), wide["input_ids"]) and torch.equal(b["labels"].long(), wide["labels"])
    torch.manual_seed(0)
    lm = LossModel(Llama(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)), 1e-4, 200)
    got = []
    for batch in (b, wide):
        lm.zero_grad(set_to_none=True)
        loss_sum, count, ce_sum = compute_loss(lm, batch)
        loss_sum.backward()
        got.append([loss_sum.detach(), count, ce_sum, *(p.grad.clone() for p in lm.parameters())])
    assert all(torch.equal(x, y) for x, y in zip(*got, strict=True))


class _Uint16Windows:
    """Two windows of uint16 ids up to 65535, every id a counted label: a model tokenizer's widest case."""

    length, dtype, counted = 8, np.dtype(np.uint16), np.ones(65536, dtype=bool)
    data = np.array([[65535, 0, 65534, 300, 65535, 1, 2, 65533], [7] * 8], dtype=np.uint16)

    def __len__(self) -> int:
        return 2

    def ids(self, i: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.data[i, start:stop].copy()


def test_sample_dtypes_hold_every_id():
    """Labels hold IGNORE_INDEX and the largest id of the stored dtype; ids torch has no full type for widen."""
    expect = {np.uint8: (np.uint8, np.int16), np.uint16: (np.int32, np.int32), np.uint32: (np.int64, np.int64)}
    for stored, want in expect.items():
        assert sample_dtypes(np.dtype(stored)) == tuple(np.dtype(d) for d in want)
        labels = sample_dtypes(np.dtype(stored))[1]
        assert np.iinfo(labels).min <= IGNORE_INDEX and np.iinfo(labels).max >= np.iinfo(stored).max
    ex = TrainSamples(_Uint16Windows(), DataConfig(8)).example(0)
    row = _Uint16Windows.data[0].astype(np.int64)
    assert ex["input_ids"].tolist() == row.tolist() and ex["labels"].tolist() == [*row[1:].tolist(), IGNORE_INDEX]


def test_step_indices_partition_the_global_batch():
    for dp, micro in [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)]:
        got = [g for r in range(dp) for grp in step_indices(40, 8, micro, r, dp) for g in grp]
        assert sorted(got) == list(range(40, 48))
    # 2 ranks x micro 1 and 1 rank x 2 micro-steps read the same samples in each round
    assert step_indices(0, 2, 1, 0, 2) + step_indices(0, 2, 1, 1, 2) == step_indices(0, 2, 1, 0, 1)
    with pytest.raises(LcftError, match="not a multiple"):
        step_indices(0, 3, 1, 0, 2)


def test_seq_len_longer_than_window(windows):
    with pytest.raises(LcftError, match="longer than the data's windows"):
        TrainSamples(windows, DataConfig(WINDOW * 2))


def test_a_one_token_sequence_is_refused_naming_the_flag(windows):
    with pytest.raises(LcftError, match="^--seq-len must be at least 2 \\(got 1\\)$"):
        TrainSamples(windows, DataConfig(1))
