"""What a Hub id that cannot be read says, offline, against a Hub cache written as huggingface_hub lays it out: the
cache folder, the default one too; a mistyped id, the cached one meant; a file whose blob is missing, that blob and
how to download it again; an id whose ORG is a local folder here was read as a path (and says so)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import lcft.hub
from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.layout import resolve_checkpoint
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.genomics.model_tokenizer import load_tokenizer
from tests import test_hub
from tests.cli.preloaded import preloaded  # noqa: F401  (a fixture, by name)
from tests.test_hub import COMMIT_A, cache_repo, hf_model, same_logits
from tests.test_hub_cache import _plan

hub = test_hub.hub  # the fixture: HF_HOME a folder of the test's, HF_HUB_OFFLINE set

AS_PATH = ("; ./dna-org is a local folder, so this was read as a path, not a Hub id (to read dna-org/tiny from the "
           "Hub, run from another folder)")


@pytest.mark.parametrize("args, said", [
    (["plan", "--init", "dna-org/tiny", "--seq-len", "4K"],
     "checkpoint not found: dna-org/tiny (give a checkpoint, a run or an HF model folder)"),
    (["export", "dna-org/tiny", "--out", "out"],
     "checkpoint not found: dna-org/tiny (give a checkpoint, a run or an HF model folder)"),
    (["train", "--init", "dna-org/tiny@v1", "--data", "data", "--out", "run"], "--init: dna-org/tiny@v1 not found"),
    (["eval", "-c", "dna-org/tiny", "--data", "data"], "--checkpoint: dna-org/tiny not found")])
def test_an_id_whose_org_is_a_local_folder_says_it_was_read_as_a_path(hub, tmp_path, monkeypatch, args, said):
    """./dna-org exists, dna-org/tiny under it does not: the id is a missing local path (the Hub is not asked),
    and the one line says why it was read as one; train and eval, which make paths absolute first, too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dna-org").mkdir()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1 and r.output.strip() == f"error: {said}{AS_PATH}", r.output


def test_a_tokenizer_whose_org_is_a_local_folder_says_it_was_read_as_a_path(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dna-org").mkdir()
    for spec, said in (("dna-org/tiny", "tokenizer dna-org/tiny: no such file or folder (give char, kmer:K, or a "
                                        "tokenizer.json)"),
                       ("kmer:6:dna-org/tiny", "tokenizer vocabulary dna-org/tiny: no such file")):
        with pytest.raises(LcftError) as e:
            load_tokenizer(spec)
        assert str(e.value) == said + AS_PATH
    with pytest.raises(LcftError) as e:  # written as a path: nothing to explain
        load_tokenizer("./dna-org/tiny")
    assert "Hub" not in str(e.value)
    r = CliRunner().invoke(app, ["plan", "--init", "./dna-org/tiny", "--seq-len", "4K"])
    assert r.exit_code == 1 and "checkpoint not found" in r.output and "Hub" not in r.output, r.output


def test_not_cached_without_cache_variables_names_the_default_folder(preloaded, hub, tmp_path):  # noqa: F811
    """No HF_HOME or HF_HUB_CACHE: the one line named 'the default cache' but not the folder; now the folder
    huggingface_hub reads, ~/.cache/huggingface/hub with ~ expanded (a snapshot cached there loads: it is that one)."""
    files, _ = hf_model(tmp_path, 0)
    default = tmp_path / ".cache" / "huggingface"
    cache_repo(default, "dna-org/tiny-llama", COMMIT_A, files)
    unset = {"HF_HOME": "", "XDG_CACHE_HOME": "", "HUGGINGFACE_HUB_CACHE": "", "HOME": str(tmp_path)}
    got = _plan(preloaded, hub, **unset)
    assert got.returncode == 0 and "verdict: fits" in got.stdout, got.stderr[-2000:]
    got = _plan(preloaded, hub, "dna-org/not-cached", **unset)
    assert got.stderr.strip() == (f"error: dna-org/not-cached: not in the Hub cache (the default cache, "
                                  f"{default / 'hub'}) and HF_HUB_OFFLINE is set"), got.stderr[-2000:]


def test_a_mistyped_id_offline_names_the_cached_one_meant(hub, monkeypatch):
    """The cache holds dna-org/tiny-llama: a mistyped NAME or ORG is offered it; a dataset's folder, an id unlike
    any, and a revision not cached of a cached repository are offered nothing."""
    cache_repo(hub, "dna-org/tiny-llama", COMMIT_A, {"config.json": b"{}"})
    cache_repo(hub, "dna-org/bin-llama", COMMIT_A, {"config.json": b"{}"})
    (hub / "hub" / "datasets--dna-org--tiny-lamb").mkdir()
    (hub / "hub" / ".locks").mkdir()
    offered = {"dna-org/tiny-lama": "dna-org/tiny-llama", "dna-orgg/tiny-llama": "dna-org/tiny-llama",
               "dna-org/tiny-lamb": "dna-org/tiny-llama", "dna-org/bin-lama": "dna-org/bin-llama",
               "dna-org/not-cached": None, "dna-org/tiny-llama@v9": None}
    for given, meant in offered.items():
        with pytest.raises(LcftError) as e:
            resolve_checkpoint(given)
        hint = f" (did you mean '{meant}'?)" if meant else ""
        assert str(e.value) == f"{given}: not in the Hub cache ({hub / 'hub'}) and HF_HUB_OFFLINE is set{hint}"
    monkeypatch.setattr(lcft.hub, "MAX_CACHE_ENTRIES", 0)  # the cache folder's listing is cut there
    with pytest.raises(LcftError) as e:
        resolve_checkpoint("dna-org/tiny-lama")
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_link_to_a_missing_blob_is_named_with_its_mend(hub, tmp_path, name):
    """A snapshot file whose blob is gone (a download cut short, blobs removed by hand): huggingface_hub hands the
    snapshot over offline, and lcft said 'no config.json' (or failed to read the weights); now the link, the blob
    and how to download it again. A dangling file that lcft does not read (README.md) is no matter."""
    files, model = hf_model(tmp_path, 0)
    cache_repo(hub, "dna-org/tiny-llama", COMMIT_A, {**files, "README.md": b"# tiny"}, refs=("main", "v1"))
    snap = hub / "hub" / "models--dna-org--tiny-llama" / "snapshots" / COMMIT_A
    (snap / "README.md").resolve().unlink()
    assert same_logits(from_pretrained(resolve_checkpoint("dna-org/tiny-llama")), model)
    blob = (snap / name).resolve()
    blob.unlink()
    for given, rev in (("dna-org/tiny-llama", ""), ("dna-org/tiny-llama@v1", " --revision v1")):
        with pytest.raises(LcftError) as e:
            resolve_checkpoint(given)
        assert str(e.value) == (f"dna-org/tiny-llama: {name} in the Hub cache is a link to {blob}, which is not "
                                f"there: download it again (run again without HF_HUB_OFFLINE, or run `hf download "
                                f"dna-org/tiny-llama{rev}`)")


def test_a_plan_and_a_tokenizer_read_no_weights(hub, tmp_path):
    """`lcft plan --init ORG/NAME` and `--tokenizer ORG/NAME` read config and tokenizer files only: a snapshot
    whose weights' blob is missing (a download cut short, or only those files downloaded) is planned and its
    tokenizer read (both had stopped on the weights, and online they downloaded them: gigabytes for a published
    model, to read a config); a model built from it names the blob."""
    if not test_hub.METAGENE.is_dir():
        pytest.skip(f"published files not found at {test_hub.METAGENE}")
    files, _ = hf_model(tmp_path, 0)
    tokenizer = {n: (test_hub.METAGENE / n).read_bytes()
                 for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")}
    cache_repo(hub, "dna-org/tiny-llama", COMMIT_A, {**files, **tokenizer})
    weights = hub / "hub" / "models--dna-org--tiny-llama" / "snapshots" / COMMIT_A / "model.safetensors"
    blob = weights.resolve()
    blob.unlink()
    r = CliRunner().invoke(app, ["plan", "--init", "dna-org/tiny-llama", "--seq-len", "4K"])
    assert r.exit_code == 0 and "2 blocks, hidden 32" in r.output, r.output
    assert load_tokenizer("dna-org/tiny-llama").sha256() == load_tokenizer(str(test_hub.METAGENE)).sha256()
    with pytest.raises(LcftError, match=f"model.safetensors in the Hub cache is a link to {blob}, which is not there"):
        resolve_checkpoint("dna-org/tiny-llama")
