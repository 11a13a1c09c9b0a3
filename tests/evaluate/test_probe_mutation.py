"""The copy probe's mutated copy keeps the source's base composition: a model that reads only the base counts of its
context (it cannot copy) drops nothing on it, and the substitution changes exactly the documented positions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lcft.evaluate import EvalConfig
from lcft.evaluate.losses import token_losses
from lcft.evaluate.probe import CopyProbe, plant, run_probe
from lcft.evaluate.stats import resample_counts
from lcft.genomics.tokenizer import UNK, VOCAB_SIZE, A, C, G, N, T
from lcft.genomics.window_set import open_windows
from tests.evaluate.planting import substitute


class CountModel(torch.nn.Module):
    """Next-token logits log(count + 1) of each base A/C/G/T among the tokens so far (the whole preceding context,
    order ignored): it uses the context's composition and cannot copy. The interface token_losses calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head_weight = torch.eye(VOCAB_SIZE)  # (V, V): the hidden state is the logits

    def hidden_states(self, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(ids.long(), VOCAB_SIZE).double()  # (B, L, V)
        counts = onehot.cumsum(1)  # (B, L, V) exact integers: token t's state counts tokens 0..t
        logits = torch.full_like(counts, -30.0)
        logits[..., A:T + 1] = torch.log1p(counts[..., A:T + 1])
        return logits.float()  # (B, L, V)


def _probe_losses(windows, mutation: float) -> CopyProbe:
    probe = CopyProbe(windows, 3, segment=64, distances=(64, 256, 1024, 1984), mutation=mutation, seed=0)
    cfg = EvalConfig(data="unused", checkpoints=("unused",), out="unused", batch_size=4)
    run_probe(CountModel(), probe, cfg, 0, torch.device("cpu"))
    return probe


def test_a_model_of_context_composition_only_drops_nothing_on_either_copy(data_dir):
    ws = open_windows(data_dir, "eval")
    probe = _probe_losses(ws, mutation=0.3)
    assert (probe.counts > 0).all()
    # the model does see composition: the target's loss moves when the source's bases are all replaced by A
    p = probe.planted(0, 0)
    moved = p.exact.copy()
    moved[p.source:p.source + p.segment] = A
    loss, _ = token_losses(CountModel(), torch.from_numpy(np.stack([p.exact, moved])))  # (2, L)
    assert abs(float(loss[0, -64:].sum() - loss[1, -64:].sum())) > 1e-3
    # the control, the exact and the mutated source hold the same bases: the same target losses, to the bit
    np.testing.assert_array_equal(probe.sums[1], probe.sums[0])  # exact
    np.testing.assert_array_equal(probe.sums[2], probe.sums[0])  # mutated
    out = probe.summary(resample_counts(3, 50, seed=0))
    assert out["drop"] == [0.0] * 4
    assert out["mutated"]["drop"] == [0.0] * 4


def _reachable(x: np.ndarray) -> set[int]:
    """Every number of positions at which a rearrangement of `x`'s tokens differs from `x`, by enumeration."""
    arrangements = np.array(sorted(set(itertools.permutations(x.tolist()))))  # (P, len(x))
    return {int(d) for d in (arrangements != x).sum(1)}


def _segment(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        return rng.integers(A, T + 1, size=256).astype(np.uint8)
    if kind == "with_n":  # N and <unk> runs among the bases
        x = rng.integers(A, T + 1, size=200).astype(np.uint8)
        x[10:40], x[150:155] = N, UNK
        return x
    if kind == "gc_rich":
        return rng.choice([A, C, G, T], p=[0.05, 0.45, 0.45, 0.05], size=300).astype(np.uint8)
    if kind == "repeat":  # a short tandem repeat
        return np.tile(np.array([A, C, G, T, T, G, C, A, A, G, G, C, T], dtype=np.uint8), 20)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["uniform", "with_n", "gc_rich", "repeat"])
@pytest.mark.parametrize("frac", [0.01, 0.05, 0.1, 0.3, 0.5, 0.9])
def test_the_mutated_source_changes_the_documented_positions_and_keeps_the_base_counts(kind, frac):
    for seed in range(3):
        x = _segment(kind, np.random.default_rng(seed))
        s = len(x)
        ids = np.concatenate([np.full(100, C, dtype=np.uint8), x, np.full(s, G, dtype=np.uint8)])  # source, target
        p = plant(ids, window=seed, segment=s, distance=s, mutation=frac, seed=seed)
        assert p.source == 100
        m = p.mutated[100:100 + s]
        bases = (x >= A) & (x <= T)
        assert (m != x).sum() == round(frac * bases.sum())  # every base is plentiful: the count asked for
        np.testing.assert_array_equal(np.bincount(m, minlength=VOCAB_SIZE), np.bincount(x, minlength=VOCAB_SIZE))
        assert (m[~bases] == x[~bases]).all()  # N and <unk> stay put
        np.testing.assert_array_equal(np.delete(p.mutated, np.s_[100:100 + s]), np.delete(p.exact, np.s_[100:100 + s]))


@pytest.mark.parametrize("x,frac,changed", [
    ([A] * 64, 0.3, 0),  # one base only: no position can change and keep the counts
    ([A] * 90 + [C] * 10, 0.5, 20),  # 50 asked; each C can swap with one A at most
    ([A, C] * 30, 0.05, 2),  # 3 asked: two bases exchange in pairs, an even number
    ([A, C] * 30, 0.1, 6),
    ([A, C, G] * 20, 0.05, 3),  # 3 asked: a cycle of three different bases
    ([A, C, G, T] * 5, 0.05, 0),  # 1 asked: one position cannot change alone
    ([N] * 10 + [A, C] * 5 + [UNK] * 4, 0.2, 2),
])
def test_too_few_distinct_bases_change_fewer_positions(x, frac, changed):
    x = np.array(x, dtype=np.uint8)
    for seed in range(5):
        ids = np.concatenate([x, np.full(len(x), T, dtype=np.uint8)])
        m = plant(ids, window=0, segment=len(x), distance=len(x), mutation=frac, seed=seed).mutated[:len(x)]
        assert (m != x).sum() == changed
        np.testing.assert_array_equal(np.bincount(m, minlength=VOCAB_SIZE), np.bincount(x, minlength=VOCAB_SIZE))


def test_the_count_is_the_largest_reachable_up_to_the_fraction_asked():
    """Every segment of up to 7 bases: the mutated copy changes the most positions that any rearrangement of its
    bases can change, up to round(frac * bases)."""
    rng = np.random.default_rng(0)
    for n in range(1, 8):
        for combo in itertools.combinations_with_replacement((A, C, G, T), n):
            x = rng.permutation(np.array(combo, dtype=np.uint8))
            reachable = _reachable(x)
            for frac in (0.15, 0.3, 0.5, 0.7, 0.99):
                want = max(d for d in reachable if d <= round(frac * n))
                ids = np.concatenate([x, np.full(n, T, dtype=np.uint8)])
                m = plant(ids, window=n, segment=n, distance=n, mutation=frac, seed=1).mutated[:n]
                assert (m != x).sum() == want, (x, frac)
                assert sorted(m) == sorted(x)


def test_planting_tells_rules_apart_where_the_first_window_holds_no_bases(monkeypatch):
    """The first window all N (every rule leaves N as it is) and the others bases: the digest a stopped probe's
    kept losses are keyed on still differs between two planting rules, and is the same for the same rule."""
    import lcft.evaluate.probe as probe

    rng = np.random.default_rng(3)
    windows = [np.full(512, N, dtype=np.uint8), *rng.integers(A, T + 1, size=(2, 512), dtype=np.uint8)]
    digest = CopyProbe(windows, 3, 64, [64, 128], 0.3, 0).planting
    kept = digest()
    assert digest() == kept
    monkeypatch.setattr(probe, "_mutate", substitute)
    assert digest() != kept
