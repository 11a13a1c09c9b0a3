"""The copy probe: planted windows decode back, distances are checked, losses reduce to drops by distance."""

from __future__ import annotations

import numpy as np
import pytest

from lcft.errors import LcftError
from lcft.evaluate.probe import CopyProbe, check_probe, default_distances, plant
from lcft.evaluate.stats import resample_counts
from lcft.genomics.tokenizer import A, N, T, decode


def _window(length: int = 2048, seed: int = 0) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(A, T + 1, size=length).astype(np.uint8)
    ids[100:140] = N  # an N run, as in real held-out windows
    return ids


def test_default_distances_are_a_log_grid_up_to_the_window():
    assert default_distances(2048, 256) == (256, 512, 1024, 1792)
    assert default_distances(32768, 256)[-1] == 32768 - 256 and len(default_distances(32768, 256)) == 8
    check_probe(2048, 256, default_distances(2048, 256))


@pytest.mark.parametrize("segment,distances,match", [
    (1500, (), "too long for 2048-token windows"),
    (0, (), "at least 1"),
    (256, (128,), "shorter than the segment"),
    (256, (1800,), "beyond the window: at most 1792"),
])
def test_bad_probe_input_is_a_one_line_error(segment, distances, match):
    with pytest.raises(LcftError, match=match) as e:
        check_probe(2048, segment, distances)
    assert "\n" not in str(e.value)


def test_planted_window_decodes_to_the_original_with_the_copy_at_the_stated_place():
    ids = _window()
    soft = np.random.default_rng(1).random(len(ids)) < 0.3
    p = plant(ids, window=3, segment=256, distance=1000, mutation=0.1, seed=0)
    s, t = p.describe()["source"], p.describe()["target"]
    assert t == [2048 - 256, 2048] and s == [2048 - 256 - 1000, 2048 - 1000]
    text, orig = p.decode("exact", soft), decode(ids, soft)
    assert text[:t[0]] == orig[:t[0]]  # everything before the target is the window as it was
    assert text[t[0]:].upper() == orig[s[0]:s[1]].upper()  # the target holds the source segment
    for v in ("control", "exact", "mutated"):  # the target is the same in every variant
        assert (getattr(p, v)[t[0]:] == ids[s[0]:s[1]]).all()
        assert (getattr(p, v)[:s[0]] == ids[:s[0]]).all() and (getattr(p, v)[s[1]:t[0]] == ids[s[1]:t[0]]).all()
    # Control: the source's bases shuffled; mutated: 10% of them given another base, the base counts kept.
    src = ids[s[0]:s[1]]
    assert sorted(p.control[s[0]:s[1]]) == sorted(src) and (p.control[s[0]:s[1]] != src).sum() > 100
    diff = p.mutated[s[0]:s[1]] != src
    assert diff.sum() == round(0.1 * 256) and ((p.mutated[s[0]:s[1]][diff] >= A) & (p.mutated[s[0]:s[1]][diff] <= T)).all()
    again = plant(ids, window=3, segment=256, distance=1000, mutation=0.1, seed=0)
    assert all((getattr(again, v) == getattr(p, v)).all() for v in ("control", "exact", "mutated"))
    assert not (plant(ids, window=4, segment=256, distance=1000, mutation=0.1, seed=0).control == p.control).all()


def test_probe_items_record_target_losses_and_reduce_to_drops():
    windows = [_window(seed=i) for i in range(7)]  # 2^-7 < 2.5% / 2 distances: enough to tell
    probe = CopyProbe(windows, 7, segment=64, distances=(64, 512), mutation=0.1, seed=0)
    assert len(probe) == 7 * 2 * 3 and probe.length == 2048
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.5, 1.5, size=(3, 7, 2))  # (variants, windows, distances) per-token target loss
    truth[1] = truth[0] - 0.2  # the exact copy lowers the loss by 0.2 nats
    truth[2] = truth[0] - 0.1
    for k in range(len(probe)):
        w, d, v = k // 6, (k // 3) % 2, k % 3
        ids = probe[k]
        assert (ids == getattr(probe.planted(w, d), probe.variants[v])).all()
        loss = np.full(2048, truth[v, w, d], dtype=np.float32)
        counted = np.ones(2048, dtype=bool)
        counted[-3:] = False  # three target tokens not counted
        probe.record(k, loss, counted)
    assert (probe.counts == 61).all()
    out = probe.summary(resample_counts(7, 200, seed=0))
    assert out["distances"] == [64, 512] and out["tokens"] == [7 * 61, 7 * 61]
    np.testing.assert_allclose(out["drop"], [0.2, 0.2], rtol=1e-5)
    np.testing.assert_allclose(out["ci_low"], [0.2, 0.2], rtol=1e-5)  # every window drops the same
    np.testing.assert_allclose(out["mutated"]["drop"], [0.1, 0.1], rtol=1e-5)
    np.testing.assert_allclose(out["loss_without"], truth[0].mean(0), rtol=1e-6)
    assert out["effective_context"] == 512 and out["mutated"]["effective_context"] == 512


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_target_loss_is_a_one_line_error_naming_its_window(bad):
    probe = CopyProbe([_window(seed=i) for i in range(3)], 3, segment=64, distances=(64, 512), mutation=0.0, seed=0)
    counted = np.ones(2048, dtype=bool)
    for k in range(len(probe)):
        loss = np.ones(2048, dtype=np.float32)
        loss[:-64] = bad  # before the target: never counted in it
        probe.record(k, loss, counted)
    assert probe.checked("ckpt") is probe
    loss = np.ones(2048, dtype=np.float32)
    loss[-1] = bad
    probe.record(7, loss, counted)  # window 1 (2 distances x 2 variants a window), distance 512, exact copy
    with pytest.raises(LcftError, match=r"^ckpt: non-finite loss on the copy probe in 1 window\(s\) \(first: "
                                        r"window 1\)"):
        probe.checked("ckpt")


def test_first_position_keeps_every_piece_the_target_depends_on():
    probe = CopyProbe([_window()], 1, segment=256, distances=(256,), mutation=0.0, seed=0)
    assert probe.variants == ("control", "exact") and len(probe) == 2
    assert probe.first_position(0) == 0
    assert probe.first_position(512) == 1536  # the target [1792, 2048) lies in the last 512-token piece
    assert probe.first_position(300) == 1500  # pieces start at multiples of 300; position 1791 is in [1500, 1800)


# End to end: `evaluate(probe="copy")` on the bundled human sample.


def _eval(data_dir, out, *ckpts, **kw):
    from lcft.evaluate import EvalConfig, evaluate

    return evaluate(EvalConfig(data=str(data_dir), checkpoints=tuple(str(c) for c in ckpts), out=str(out), **kw))


def test_truncated_context_is_the_probe_null(data_dir, ckpt_a, tmp_path):
    c = 512
    rep = _eval(data_dir, tmp_path / "r", ckpt_a, ckpt_a, max_context=(0, c), probe="copy", probe_segment=128,
                probe_distances=(256, 1024, 1920), max_windows=7, batch_size=6, bootstrap=100)
    full, cut = (ck["probe"] for ck in rep["checkpoints"])
    far = [k for k, d in enumerate(cut["distances"]) if d > c]
    for k in far:  # beyond the cut the copy is out of sight: the same target losses with or without it
        assert abs(cut["drop"][k]) < 1e-6 and abs(cut["mutated"]["drop"][k]) < 1e-6
        assert cut["ci_low"][k] <= 1e-6
    assert rep["checkpoints"][1]["effective_context"] is not None  # 2^-7 < 2.5% / 3 distances: it can tell
    assert rep["checkpoints"][1]["effective_context"] <= c
    assert max(abs(full["drop"][k]) for k in far) > 1e-4  # with the whole window the far copy is seen
    assert full["tokens"] == cut["tokens"]


def _train_copier(path, lag: int = 300, length: int = 600, max_steps: int = 200):
    """A one-layer model trained on random sequences repeated at `lag`: it learns to read back `lag` tokens."""
    import torch
    import torch.nn.functional as F

    from lcft.checkpoint.hf_folder import save_pretrained
    from lcft.model import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                              num_key_value_heads=4, rope_theta=1e3))
    opt = torch.optim.Adam(model.parameters(), lr=6e-3)
    rng = np.random.default_rng(0)
    for _ in range(max_steps):
        x = rng.integers(A, T + 1, size=(8, length))
        x[:, lag:] = x[:, :length - lag]  # every token from `lag` on repeats the one `lag` before
        ids = torch.from_numpy(x)  # (8, length)
        logits = model(ids)  # (8, length, V)
        loss = F.cross_entropy(logits[:, lag - 1:-1].flatten(0, 1), ids[:, lag:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.1:
            break
    assert loss.item() < 0.3, f"the copier did not learn ({loss.item():.3f})"
    save_pretrained(model.eval(), path)
    return path


def test_a_model_trained_on_repeats_at_300_reads_back_300_and_nothing_beyond_its_context(data_dir, tmp_path):
    ck = _train_copier(tmp_path / "copier")
    rep = _eval(data_dir, tmp_path / "r", ck, max_context=(512,), probe="copy", probe_segment=64,
                probe_distances=(128, 300, 1024, 1984), max_windows=8, bootstrap=200)  # 2^-8 < 2.5% / 4
    pr = rep["checkpoints"][0]["probe"]
    at = {d: k for k, d in enumerate(pr["distances"])}
    assert pr["drop"][at[300]] > 0.5 and pr["ci_low"][at[300]] > 0  # nats/base: the copy is read back
    assert 0 < pr["mutated"]["drop"][at[300]] < pr["drop"][at[300]]  # a diverged copy helps less
    for d in (1024, 1984):
        assert abs(pr["drop"][at[d]]) < 1e-6
    assert rep["checkpoints"][0]["effective_context"] == 300
    assert rep["probe"]["target"] == [2048 - 64, 2048]


@pytest.mark.parametrize("kw,match", [
    (dict(probe_segment=1500), "too long for 2048-token windows"),
    (dict(probe_distances=(4096,)), "beyond the window"),
])
def test_bad_probe_options_fail_before_any_work(data_dir, ckpt_a, tmp_path, kw, match):
    out = tmp_path / "out"
    with pytest.raises(LcftError, match=match) as e:
        _eval(data_dir, out, ckpt_a, probe="copy", max_windows=1, **kw)
    assert "\n" not in str(e.value) and not out.exists()
