"""Reverse-complement augmentation: flipped samples decode to Biopython's reverse complement, re-tokenized as
`tokenizers` would; the same flips for the same seed in a fresh reader (what a resumed run sees)."""

from __future__ import annotations

import numpy as np
import pytest
from Bio.Seq import Seq
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from lcft.genomics import decode, open_windows, prepare_windows, sample_fasta
from lcft.genomics.dataset import IGNORE_INDEX, DataConfig, TrainSamples

SEQ = 1024


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    d = tmp_path_factory.mktemp("rc")
    for spec in ("char", "kmer:6"):
        prepare_windows(fasta=str(sample_fasta()), out=str(d / spec.replace(":", "")), length=4096, train="chr2",
                        eval=(), tokenizer=spec)
    return d


def test_char_flip_is_the_reverse_complement(prepared):
    ws = open_windows(prepared / "char", "train")
    ds = TrainSamples(ws, DataConfig(SEQ, seed=1, rc_augment=1.0, softmask_loss_weight=0.5))
    for sid in (0, 5, ds.num_samples - 1):
        w, off = ds.locate(sid)
        ex = ds.example(sid)
        plain = decode(ws[w][off : off + SEQ], ws.softmask(w)[off : off + SEQ])
        assert decode(ex["input_ids"]) == str(Seq(plain.upper()).reverse_complement())
        lower_next = np.array([c.islower() for c in plain[::-1]])[1:]  # the flipped labels' soft mask
        assert np.array_equal(ex["weights"][:-1] == 0.5, lower_next)


def test_kmer_flip_is_retokenized_reverse_complement(prepared):
    """The flipped sample = the first SEQ tokens of the 6-mer tokenization of the reverse complement of the
    window's bases up to the sample's end (oracle: tokenizers' WordLevel over the same rule)."""
    ws = open_windows(prepared / "kmer6", "train")
    ds = TrainSamples(ws, DataConfig(SEQ, seed=1, rc_augment=1.0))
    vocab = ws.tokenizer.vocab
    oracle = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab) if t}, unk_token="<unk>"))
    oracle.pre_tokenizer = pre_tokenizers.Split(Regex("[ACGT]{6}|[^ACGT]{6}|."), behavior="isolated")
    for sid in (1, 2, 7):
        w, off = ds.locate(sid)
        end = int(ws.base_offsets(w)[off + SEQ - 1] + ws.token_bases(w)[off + SEQ - 1])
        flipped = str(Seq(ws.sequence(w)[:end].upper()).reverse_complement())
        ex = ds.example(sid)
        assert ex["input_ids"].tolist() == oracle.encode(flipped).ids[:SEQ]
        spelled = "".join(ws.tokenizer.bases()[t] for t in ex["input_ids"].tolist())
        assert flipped.startswith(spelled) and len(spelled) >= SEQ * 5
        assert (ex["labels"][:-1] == IGNORE_INDEX).sum() == sum("N" in ws.tokenizer.bases()[t]
                                                                  for t in ex["input_ids"][1:].tolist())


def test_same_seed_same_flips_in_a_fresh_reader(prepared):
    ws = open_windows(prepared / "kmer6", "train")
    a = TrainSamples(ws, DataConfig(SEQ, seed=3, rc_augment=0.5))
    b = TrainSamples(open_windows(prepared / "kmer6", "train"), DataConfig(SEQ, seed=3, rc_augment=0.5))
    c = TrainSamples(ws, DataConfig(SEQ, seed=4, rc_augment=0.5))
    ids = list(range(min(40, a.num_samples)))
    plain = TrainSamples(ws, DataConfig(SEQ, seed=3))
    flipped = [not np.array_equal(a.example(i)["input_ids"], plain.example(i)["input_ids"]) for i in ids]
    assert all(np.array_equal(a.example(i)["input_ids"], b.example(i)["input_ids"]) for i in ids)
    assert 0.2 < np.mean(flipped) < 0.8
    assert any(not np.array_equal(a.example(i)["input_ids"], c.example(i)["input_ids"]) for i in ids)
