"""A Hub cache whose refs/<revision> or trees/<commit>.json is not what huggingface_hub writes (a FIFO, a link to
/dev/zero, too long, no commit hash) is one line at once, offline: huggingface_hub read each whole, and waited
forever on a FIFO; a cache as huggingface_hub writes it (a tree listing beside the snapshot) still loads."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.layout import resolve_checkpoint
from tests import test_hub
from tests.cli.preloaded import Preloaded, preloaded  # noqa: F401  (a fixture, by name)
from tests.test_hub import COMMIT_A, cache_repo, hf_model, same_logits

hub = test_hub.hub  # the fixture: HF_HOME a folder of the test's, HF_HUB_OFFLINE set

REPO = "dna-org/tiny-llama"
# address space of the command: reading /dev/zero whole ends in MemoryError, not a full machine (a plan maps ~0.8 GB,
# torch's libraries among them, forked from the preloaded process or not)
MEMORY_CAP = 6 << 30


def _repo_folder(home: Path) -> Path:
    return home / "hub" / f"models--{REPO.replace('/', '--')}"


def _plan(preloaded: Preloaded, home: Path, init: str = REPO, **variables: str,  # noqa: F811
          ) -> subprocess.CompletedProcess:
    """`lcft plan --init <init>` offline in a process of its own, forked from `preloaded` (huggingface_hub, which
    reads HF_HOME at import, not imported there), its memory capped, given 60 s (it takes under 1); `variables` set in its
    environment over those (an empty one: unset)."""
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", **variables}
    for name in ("HF_HUB_CACHE", "TRANSFORMERS_OFFLINE", *variables):
        if not variables.get(name):
            env.pop(name, None)
    try:
        return preloaded.run(["-m", "lcft", "plan", "--init", init, "--seq-len", "4K"], env=env, timeout=60,
                             address_space=MEMORY_CAP)
    except subprocess.TimeoutExpired:
        pytest.fail(f"lcft plan --init {init} was still running after 60 s")


def _plant(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "oversize":
        path.write_text(COMMIT_A * 4)
    else:
        path.write_text("x" * 40)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "oversize", "not-hex"])
def test_a_ref_that_is_no_commit_is_one_line_at_once(preloaded, hub, tmp_path, kind):  # noqa: F811
    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, REPO, COMMIT_A, files)
    ref = _repo_folder(hub) / "refs" / "main"
    _plant(ref, kind)
    got = _plan(preloaded, hub)
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 1 and len(lines) == 1, got.stderr[-2000:]
    assert lines[0].startswith(f"error: the Hub cache's ref {ref}"), lines
    assert ("not a regular file" if kind in ("fifo", "dev-zero") else "bytes, over the limit" if kind == "oversize"
            else "does not hold a commit hash") in lines[0], lines


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_tree_listing_that_is_no_file_is_one_line_at_once(preloaded, hub, tmp_path, kind):  # noqa: F811
    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, REPO, COMMIT_A, files)
    tree = _repo_folder(hub) / "trees" / f"{COMMIT_A}.json"
    tree.parent.mkdir()
    _plant(tree, kind)
    got = _plan(preloaded, hub)
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 1 and len(lines) == 1, got.stderr[-2000:]
    assert lines[0] == f"error: the Hub cache's tree listing {tree} is not a regular file: remove it and download again"


def test_a_tree_listing_nested_too_deep_is_one_line_naming_it(preloaded, hub, tmp_path):  # noqa: F811
    """huggingface_hub reads a tree listing with json.load: one of 100,000 nested lists (a small file) was
    RecursionError, said as 'not a local folder, and the Hub cannot be read (maximum recursion depth exceeded...)'
    while offline."""
    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, REPO, COMMIT_A, files)
    trees = _repo_folder(hub) / "trees"
    trees.mkdir()
    (trees / f"{COMMIT_A}.json").write_text("[" * 100_000 + "]" * 100_000)
    got = _plan(preloaded, hub)
    assert got.returncode == 1 and got.stderr == (f"error: the Hub cache's tree listing in {trees} is nested too deep "
                                                  "to be one: remove it and download again\n"), got.stderr[-2000:]


def test_a_revision_that_leaves_the_refs_folder_is_one_line(preloaded, hub, tmp_path):  # noqa: F811
    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, REPO, COMMIT_A, files)
    got = _plan(preloaded, hub, f"{REPO}@../../x")
    assert got.returncode == 1 and got.stderr.strip() == (f"error: {REPO}: '../../x' is not a revision name (a branch, "
                                                          "a tag or a commit hash)"), got.stderr[-2000:]


def test_a_cache_as_huggingface_hub_writes_it_still_loads(hub, tmp_path):
    """Its refs and tree listing (written by huggingface_hub's own writer) are read: main's snapshot loads."""
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    files, model = hf_model(tmp_path, 0)
    cache_repo(hub, REPO, COMMIT_A, files)
    folder = _repo_folder(hub)
    write_tree_cache(str(folder), COMMIT_A, {n: TreeCacheEntry(size=len(d), blob_id="0" * 40) for n, d in files.items()})
    path = resolve_checkpoint(REPO)
    assert path == folder / "snapshots" / COMMIT_A
    assert same_logits(from_pretrained(path), model)


@pytest.mark.parametrize("home", ["$HUB_TEST_ROOT/hf-home", "~/hf-home"])
def test_cache_variables_are_expanded_as_huggingface_hub_expands_them(preloaded, hub, tmp_path, home):  # noqa: F811
    """HF_HOME holding ~ or a $VARIABLE (quoted in a job script or an env file): huggingface_hub expands them; lcft
    had looked in a folder named so literally ('$HUB_TEST_ROOT/hf-home/hub': not in the Hub cache), or, for ~,
    left the refs to huggingface_hub's unbounded read (a bad ref was not said)."""
    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, REPO, COMMIT_A, files)
    variables = {"HF_HOME": home, "HUB_TEST_ROOT": str(tmp_path), "HOME": str(tmp_path)}
    got = _plan(preloaded, hub, **variables)
    assert got.returncode == 0 and "verdict: fits" in got.stdout, got.stderr[-2000:]
    _plant(_repo_folder(hub) / "refs" / "main", "not-hex")
    got = _plan(preloaded, hub, **variables)
    assert got.returncode == 1 and "does not hold a commit hash" in got.stderr, got.stderr[-2000:]


def test_transformers_offline_reads_only_the_cache(preloaded, hub, tmp_path):  # noqa: F811
    """TRANSFORMERS_OFFLINE=1, the older name huggingface_hub still reads, without HF_HUB_OFFLINE: the cached
    snapshot loads, no Hub asked (lcft had tried the Hub, here a port that refuses connections, and stopped)."""
    from tests.test_hub import _closed_port

    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, REPO, COMMIT_A, files)
    got = _plan(preloaded, hub, HF_HUB_OFFLINE="", TRANSFORMERS_OFFLINE="1", HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}")
    assert got.returncode == 0 and "verdict: fits" in got.stdout, got.stderr[-2000:]
    got = _plan(preloaded, hub, "dna-org/not-cached", HF_HUB_OFFLINE="", TRANSFORMERS_OFFLINE="1")
    assert got.stderr.strip() == (f"error: dna-org/not-cached: not in the Hub cache ({hub / 'hub'}) and "
                                  "TRANSFORMERS_OFFLINE is set"), got.stderr[-2000:]
