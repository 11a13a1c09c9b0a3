"""Hub ids online, against a stand-in Hub on 127.0.0.1 that answers huggingface_hub's client as the Hub does (repo
info, tree listing, HEAD and GET of /resolve/): `lcft plan --init` and `--tokenizer ORG/NAME` download config and
tokenizer files, never the weights; `lcft export` downloads the weights; HF_HUB_OFFLINE=1 reads the cache only."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import subprocess
import threading
import urllib.parse
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.kernels.spec import SparseSpec
from lcft.model import AttentionConfig
from tests.cli.preloaded import preloaded  # noqa: F401  (a fixture, by name)
from tests.conftest import SHARED_GENOMES
from tests.model.test_attention_config import _small
from tests.test_hub import METAGENE, hf_model, same_logits

transformers = pytest.importorskip("transformers")
REPO = "dna-org/tiny-llama"
LCFT_REPO = "dna-org/tiny-sparse"  # a model lcft saved: lcft.json records its sparse attention
SPARSE = AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=16, top_k=2), impl="cpu")
COMMIT = hashlib.sha1(b"the one commit of the stand-in Hub").hexdigest()
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
LAMBDA = SHARED_GENOMES / "lambda_phage_NC_001416.1.fa"


def git_oid(data: bytes) -> str:
    """A file's git blob id, as the Hub's tree listing names it ("oid")."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandInHub(http.server.BaseHTTPRequestHandler):
    """Model repositories (`repos`: id -> its files), each at revision main = COMMIT, as huggingface_hub's
    HfApi.repo_info, list_repo_tree and hf_hub_download read the Hub: no xet, no redirect to a CDN; every file's ETag
    its sha256 (as the Hub's for an LFS file). Each request is logged, 'METHOD PATH', in `requested`."""

    repos: dict[str, dict[str, bytes]] = {}
    requested: list[str] = []

    def do_GET(self) -> None:
        self.answer(body=True)

    def do_HEAD(self) -> None:
        self.answer(body=False)

    def answer(self, body: bool) -> None:
        self.requested.append(f"{self.command} {self.path}")
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rev, repo = f"(?:main|{COMMIT})", "|".join(map(re.escape, self.repos))
        headers = {"Content-Type": "application/json"}
        if m := re.fullmatch(f"/api/models/({repo})/revision/{rev}", path):  # HfApi.model_info (snapshot_download)
            data = json.dumps({"id": m[1], "sha": COMMIT, "siblings": [{"rfilename": n} for n in self.repos[m[1]]]})
        elif m := re.fullmatch(f"/api/models/({repo})/tree/{rev}", path):  # list_repo_tree: one page, no folders
            data = json.dumps([{"type": "file", "path": n, "size": len(d), "oid": git_oid(d)}
                               for n, d in self.repos[m[1]].items()])
        elif (m := re.fullmatch(f"/({repo})/resolve/{rev}/(.+)", path)) and m[2] in self.repos[m[1]]:
            data = self.repos[m[1]][m[2]]
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                       "Content-Type": "application/octet-stream"}
        else:  # /api/agent-harnesses among them (huggingface_hub's registry for its user agent, asked for once a
            # day and ignored where it fails); X-Error-Code tells a missing repository from a missing file
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound" if "/resolve/" in path else "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        raw = data.encode() if isinstance(data, str) else data
        self.send_response(200)
        for name, value in {**headers, "Content-Length": str(len(raw))}.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(raw)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def hub_model(tmp_path_factory):
    """(port, requested, the transformers model REPO holds) of a stand-in Hub serving REPO: a tiny Llama (2 blocks,
    hidden 32, 1024 tokens) saved by transformers (config.json, generation_config.json, model.safetensors),
    METAGENE-1's tokenizer files and a README.md; and LCFT_REPO, a tiny model lcft saved with sparse attention
    (config.json, model.safetensors, lcft.json)."""
    if not METAGENE.is_dir():
        pytest.skip(f"published files not found at {METAGENE}")
    files, model = hf_model(tmp_path_factory.mktemp("model"), 0, vocab=1024)  # rows for each of the tokenizer's ids
    files.update({n: (METAGENE / n).read_bytes() for n in TOKENIZER_FILES})
    files["README.md"] = b"# tiny-llama\n"
    ours = save_pretrained(_small(SPARSE), tmp_path_factory.mktemp("lcft") / "model")
    repos = {REPO: files, LCFT_REPO: {p.name: p.read_bytes() for p in ours.iterdir()}}
    handler = type("Hub", (StandInHub,), {"repos": repos, "requested": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], handler.requested, model
    server.shutdown()
    server.server_close()


@pytest.fixture
def online_hub(preloaded, hub_model, tmp_path):  # noqa: F811
    """(run lcft, requested, model): `run(*args, offline=False)` runs lcft in a process of its own, forked from the
    module's preloaded process (which has not imported huggingface_hub: it reads HF_ENDPOINT at import), with the
    stand-in Hub as HF_ENDPOINT, HF_HOME a folder of this test's, no proxy; the request log starts empty."""
    port, requested, model = hub_model
    requested.clear()
    unset = {"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN",
             "TRANSFORMERS_OFFLINE"}
    base = {k: v for k, v in os.environ.items() if k.upper() not in unset}
    base.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"), NO_PROXY="127.0.0.1,localhost")

    def run(*args: str, offline: bool = False) -> subprocess.CompletedProcess:
        env = {**base, "HF_HUB_OFFLINE": "1"} if offline else base
        return preloaded.run(["-m", "lcft", *args], env=env, cwd=tmp_path)

    return run, requested, model


def cached(tmp_path: Path) -> set[str]:
    """The names of the files in the cached snapshot of REPO at COMMIT (each a link to a blob that is there)."""
    snapshot = tmp_path / "hf" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    assert all(p.exists() for p in snapshot.iterdir())
    return {p.name for p in snapshot.iterdir()}


def downloaded(requested: list[str], repo: str = REPO) -> set[str]:
    """The files of `repo` that were downloaded (GET of /resolve/)."""
    return {p.rsplit("/", 1)[1] for p in requested if p.startswith(f"GET /{repo}/resolve/")}


def test_plan_downloads_config_and_tokenizer_only_then_reads_the_cache_offline(online_hub, tmp_path):
    """`lcft plan --init ORG/NAME` reads the model's config: the weights (gigabytes for a published model) and the
    README are never requested; HF_HUB_OFFLINE=1 then plans from the cache, asking the Hub nothing; a mistyped id the
    Hub does not have names the cached repository meant."""
    run, requested, _ = online_hub
    got = run("plan", "--init", REPO, "--seq-len", "4K")
    assert got.returncode == 0, got.stderr
    assert "2 blocks" in got.stdout and "hidden 32" in got.stdout, got.stdout
    assert not [p for p in requested if "model.safetensors" in p or "README.md" in p], requested
    assert downloaded(requested) == {"config.json", "generation_config.json", *TOKENIZER_FILES}, requested
    assert cached(tmp_path) == downloaded(requested)
    online = got.stdout
    requested.clear()
    got = run("plan", "--init", REPO, "--seq-len", "4K", offline=True)
    assert got.returncode == 0 and got.stdout == online, got.stderr
    assert requested == []
    got = run("plan", "--init", "dna-org/tiny-lama", "--seq-len", "4K")  # mistyped: the Hub has no such repository
    assert got.returncode == 1 and got.stderr == (
        "error: dna-org/tiny-lama: no such Hub repository, or it needs access (log in or set HF_TOKEN) (did you mean "
        f"'{REPO}'?)\n"), got.stderr


def test_prepare_reads_the_tokenizer_of_an_id_without_its_weights(online_hub, tmp_path):
    """`lcft prepare windows --tokenizer ORG/NAME` tokenizes with the repository's tokenizer (the same as METAGENE-1's
    own folder's) and downloads no weights."""
    from lcft.genomics.model_tokenizer import load_tokenizer

    run, requested, _ = online_hub
    got = run("prepare", "windows", "--fasta", str(LAMBDA), "--out", "data", "--tokenizer", REPO, "--length", "512",
              "--train", "gi|9626243|ref|NC_001416.1|", "--eval", "")
    assert got.returncode == 0, got.stderr
    assert not [p for p in requested if "model.safetensors" in p or "README.md" in p], requested
    assert set(TOKENIZER_FILES) <= cached(tmp_path) and "model.safetensors" not in cached(tmp_path)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["tokenizer"]["sha256"] == load_tokenizer(str(METAGENE)).sha256()
    assert manifest["splits"]["train"]["windows"] > 0


def test_export_of_an_id_downloads_its_weights(online_hub, tmp_path):
    """`lcft export ORG/NAME` needs the weights: model.safetensors is downloaded, and transformers loads the export
    as the model the repository holds (same logits)."""
    run, requested, model = online_hub
    got = run("export", REPO, "--out", "out")
    assert got.returncode == 0, got.stderr
    assert "model.safetensors" in downloaded(requested) and "README.md" not in downloaded(requested), requested
    assert "model.safetensors" in cached(tmp_path)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    torch.manual_seed(0)
    assert same_logits(lambda ids: exported(ids).logits, model)


def test_a_model_lcft_saved_is_read_with_its_lcft_json(online_hub, tmp_path):
    """A model lcft exported and pushed to the Hub keeps what its lcft.json records: `lcft plan --init ORG/NAME`
    downloads lcft.json beside config.json and plans its sparse attention (not dense), and `lcft export ORG/NAME`
    writes the same attention settings."""
    run, requested, _ = online_hub
    got = run("plan", "--init", LCFT_REPO, "--seq-len", "4K")
    assert got.returncode == 0, got.stderr
    assert "sparse attention" in got.stdout, got.stdout
    assert downloaded(requested, LCFT_REPO) == {"config.json", "lcft.json"}, requested
    got = run("export", LCFT_REPO, "--out", "out")
    assert got.returncode == 0, got.stderr
    assert json.loads((tmp_path / "out" / "lcft.json").read_text())["attention"] == SPARSE.to_dict()
