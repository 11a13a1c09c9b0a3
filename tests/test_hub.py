"""Hub ids offline, against a Hub cache this test writes by hand (models--ORG--NAME/{refs,snapshots,blobs},
HF_HUB_OFFLINE=1, HF_HOME): --init and --tokenizer ORG/NAME[@REVISION] resolve to the cached snapshot; a pinned
revision; pytorch_model.bin read with weights_only (a planted pickle never runs); missing ids are one line; a Hub
that cannot be reached, or (a server on 127.0.0.1) fails its requests, is one line, soon."""

from __future__ import annotations

import hashlib
import http.server
import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.layout import resolve_checkpoint
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.genomics.model_tokenizer import load_tokenizer
from lcft.hub import hub_id, local_path
from tests.cli.preloaded import Preloaded, preloaded  # noqa: F401  (a fixture, by name)

transformers = pytest.importorskip("transformers")
METAGENE = Path(__file__).resolve().parents[2] / "shared" / "published" / "metagene-1"
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def cache_repo(home: Path, repo: str, commit: str, files: dict[str, bytes], refs: tuple[str, ...] = ("main",)):
    """One snapshot of a model repository in huggingface_hub's cache layout: content-addressed blobs, the
    snapshot's files as relative symlinks to them, refs/<name> holding the commit."""
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (root / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)


def hf_model(tmp_path: Path, seed: int, safe: bool = True, vocab: int = 16) -> tuple[dict[str, bytes], object]:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    out = tmp_path / f"hf{seed}{safe}"
    model.save_pretrained(out)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    if not safe:  # the layout transformers 4 wrote with safe_serialization=False: a torch.save'd state dict
        del files["model.safetensors"]
        torch.save(model.state_dict(), out / "pytorch_model.bin")
        files["pytorch_model.bin"] = (out / "pytorch_model.bin").read_bytes()
    return files, model


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path / "hf-home"


def same_logits(ours, theirs) -> bool:
    ids = torch.randint(0, 16, (1, 12))
    with torch.no_grad():
        return torch.allclose(ours(ids).float(), theirs(ids).logits, atol=1e-5)


def test_init_id_resolves_to_the_cached_snapshot_and_pins_a_revision(hub, tmp_path):
    files_a, model_a = hf_model(tmp_path, 0)
    files_b, model_b = hf_model(tmp_path, 1)
    cache_repo(hub, "dna-org/tiny-llama", COMMIT_A, files_a)
    cache_repo(hub, "dna-org/tiny-llama", COMMIT_B, files_b, refs=("v2",))
    main = resolve_checkpoint("dna-org/tiny-llama")
    assert main.parent.name == "snapshots" and main.name == COMMIT_A
    assert same_logits(from_pretrained(main), model_a)
    assert resolve_checkpoint(f"dna-org/tiny-llama@{COMMIT_B}").name == COMMIT_B
    assert same_logits(from_pretrained(resolve_checkpoint("dna-org/tiny-llama@v2")), model_b)
    r = CliRunner().invoke(app, ["plan", "--init", "dna-org/tiny-llama@v2", "--seq-len", "4096"])
    assert r.exit_code == 0 and "blocks" in r.output, r.output


def test_train_init_id_starts_from_the_cached_snapshot(hub, tmp_path):
    """`lcft train --init ORG/NAME@REV`: the id is kept as an id (it had been made a path under the working folder,
    then not found), and the run starts from that snapshot's weights."""
    from lcft.genomics import prepare_windows
    from lcft.train.config import load_run_config
    from tests.conftest import SHARED_GENOMES

    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, "dna-org/tiny-llama", COMMIT_A, files, refs=("v1",))
    data, run = tmp_path / "data", tmp_path / "run"
    prepare_windows(fasta=str(SHARED_GENOMES / "lambda_phage_NC_001416.1.fa"), out=str(data), length=512,
                    train=("gi|9626243|ref|NC_001416.1|",), eval=())
    r = CliRunner().invoke(app, ["train", "--init", "dna-org/tiny-llama@v1", "--data", str(data), "--out", str(run),
                                 "--steps", "1", "--global-batch", "1", "--precision", "fp32", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert load_run_config(run / "config.toml").init == "dna-org/tiny-llama@v1"


def test_uncached_id_offline_and_unknown_revision_are_one_line(hub, tmp_path):
    files, _ = hf_model(tmp_path, 0)
    cache_repo(hub, "dna-org/tiny-llama", COMMIT_A, files)
    for text in ("dna-org/not-cached", "dna-org/tiny-llama@v9"):
        with pytest.raises(LcftError, match="not in the Hub cache") as e:
            resolve_checkpoint(text)
        assert "\n" not in str(e.value)
    r = CliRunner().invoke(app, ["plan", "--init", "dna-org/not-cached", "--seq-len", "4096"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1 and "HF_HUB_OFFLINE" in r.output


def test_local_paths_are_never_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert hub_id("runs/typo") is None and hub_id("./a/b") is None and hub_id("/abs/path") is None
    assert hub_id("org/name@refs/pr/1") == ("org/name", "refs/pr/1") and hub_id("a/b/c") is None
    assert local_path("runs") == Path("runs")


def test_a_dot_path_on_the_command_line_stays_a_path(hub, tmp_path, monkeypatch):
    """`./org/name` is a local path, never a Hub id: export's argument, typed as a Path, had lost the './' and
    looked the name up in the Hub cache."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["export", "./nosuch/model", "--out", "out"])
    assert r.exit_code == 1 and "Hub" not in r.output and "nosuch/model" in r.output, r.output


def test_pytorch_bin_is_read_with_weights_only(hub, tmp_path):
    files, model = hf_model(tmp_path, 2, safe=False)
    assert "pytorch_model.bin" in files and not any(n.endswith(".safetensors") for n in files)
    cache_repo(hub, "dna-org/bin-llama", COMMIT_A, files)
    assert same_logits(from_pretrained(resolve_checkpoint("dna-org/bin-llama")), model)

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    planted = dict(files, **{"pytorch_model.bin": pickle.dumps({"model.embed_tokens.weight": Payload()})})
    cache_repo(hub, "dna-org/planted", COMMIT_A, planted)
    with pytest.raises(LcftError, match="pytorch_model.bin: cannot read weights") as e:
        from_pretrained(resolve_checkpoint("dna-org/planted"))
    assert "\n" not in str(e.value) and not marker.exists()


def test_tokenizer_id_reads_the_cached_tokenizer(hub):
    if not METAGENE.is_dir():
        pytest.skip(f"published files not found at {METAGENE}")
    files = {n: (METAGENE / n).read_bytes() for n in ("tokenizer.json", "tokenizer_config.json",
                                                       "special_tokens_map.json", "config.json")}
    cache_repo(hub, "metagene-ai/METAGENE-1", COMMIT_A, files)
    via_hub = load_tokenizer(f"metagene-ai/METAGENE-1@{COMMIT_A}")
    local = load_tokenizer(str(METAGENE))
    assert via_hub.sha256() == local.sha256()
    seq = np.frombuffer(b"ACGTTGCAAGGCTTAACCGGTTAAACGTAGGCT", dtype=np.uint8)
    bounds = np.array([0, len(seq)])
    ids, _ = via_hub.encode_chunk(seq, bounds)
    assert len(ids) > 0 and ids.tolist() == local.encode_chunk(seq, bounds)[0].tolist()


def _plan_of_an_id(preloaded: Preloaded, tmp_path, **env: str):  # noqa: F811
    """`lcft plan --init org/name` in a process of its own, forked from `preloaded` (which has not imported
    huggingface_hub: it reads HF_ENDPOINT at import), with no proxy but those `env` names."""
    proxies = {"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "HF_HUB_OFFLINE"}
    base = {k: v for k, v in os.environ.items() if k.upper() not in proxies}
    return preloaded.run(["-m", "lcft", "plan", "--init", "nosuchorg/nosuchmodel", "--seq-len", "4K"],
                         env={**base, "HF_HOME": str(tmp_path / "hf"), **env}, cwd=tmp_path)


def test_a_hub_whose_name_does_not_resolve_is_one_line_at_once(preloaded, tmp_path):  # noqa: F811
    """No network (or a mistyped HF_ENDPOINT): huggingface_hub retried the request five times, printing two
    lines a try, before lcft's one; the name is looked up first and its failure is the one line."""
    got = _plan_of_an_id(preloaded, tmp_path, HF_ENDPOINT="https://hub.invalid")
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 1 and len(lines) == 1, got.stderr
    assert lines[0].startswith("error: nosuchorg/nosuchmodel: not a local folder, and the Hub cannot be reached: "
                               "hub.invalid does not resolve (") and "HF_HUB_OFFLINE=1" in lines[0], lines


def _closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hub_that_refuses_connections_is_one_line_at_once(preloaded, tmp_path):  # noqa: F811
    """An HF_ENDPOINT whose port refuses connections (a Hub mirror that is down): huggingface_hub retried it for
    about 25 s; a connection is tried first and its refusal is the one line."""
    port = _closed_port()
    got = _plan_of_an_id(preloaded, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}")
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 1 and len(lines) == 1, got.stderr
    assert lines[0] == (f"error: nosuchorg/nosuchmodel: not a local folder, and the Hub cannot be reached: "
                        f"127.0.0.1:{port} refuses connections; set HF_HUB_OFFLINE=1 to read only the Hub cache")


@pytest.mark.parametrize("variable, proxy, why", [
    ("HTTPS_PROXY", "127.0.0.1:{port}", "the proxy 127.0.0.1:{port} refuses connections; "),
    ("ALL_PROXY", "http://proxy.invalid:3128", "the proxy proxy.invalid does not resolve (")])
def test_a_proxy_that_cannot_be_reached_is_one_line_at_once(preloaded, tmp_path, variable, proxy, why):  # noqa: F811
    """Through a proxy that refuses connections or whose name does not resolve: huggingface_hub retried for about
    25 s; the proxy is tried first and why it fails is the one line."""
    port = _closed_port()
    got = _plan_of_an_id(preloaded, tmp_path, **{variable: proxy.format(port=port)})
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 1 and len(lines) == 1, got.stderr
    assert lines[0].startswith("error: nosuchorg/nosuchmodel: not a local folder, and the Hub cannot be reached: "
                               + why.format(port=port)) and "HF_HUB_OFFLINE=1" in lines[0], lines


def test_a_proxy_for_another_scheme_is_not_the_hubs(preloaded, tmp_path):  # noqa: F811
    """HTTP_PROXY is not used for an https Hub: the Hub's own host is tried (here: a name that does not resolve),
    not the proxy, which refuses connections."""
    got = _plan_of_an_id(preloaded, tmp_path, HF_ENDPOINT="https://hub.invalid",
                         HTTP_PROXY=f"http://127.0.0.1:{_closed_port()}")
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 1 and len(lines) == 1, got.stderr
    assert "cannot be reached: hub.invalid does not resolve (" in lines[0], lines


@pytest.fixture(params=["500", "429", "dropped"])
def failing_hub(request):
    """(how it fails, port, paths requested) of a Hub endpoint on 127.0.0.1 that answers each request with HTTP 500,
    or 429 (rate limited for an hour), or closes the connection unanswered."""
    requested: list[str] = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requested.append(self.path)
            if request.param != "dropped":
                self.send_response(int(request.param))
                if request.param == "429":
                    self.send_header("Retry-After", "3600")  # (huggingface_hub would wait for it)
                self.send_header("Content-Length", "0")
                self.end_headers()  # (dropped: nothing is sent, and HTTP/1.0 closes the connection)

        do_HEAD = do_GET

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield request.param, server.server_address[1], requested
    server.shutdown()
    server.server_close()


def test_a_hub_that_fails_its_requests_is_one_line_soon(preloaded, tmp_path, failing_hub):  # noqa: F811
    """A Hub (or mirror) that answers HTTP 500 or drops the connection: huggingface_hub requested the repository's
    file list 6 times, over about 25 s with nothing on the screen; now twice, and the one line says why. Rate
    limited (429), it waited an hour for the reset; now the one line comes at once."""
    kind, port, requested = failing_hub
    got = _plan_of_an_id(preloaded, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}", NO_PROXY="127.0.0.1,localhost")
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 1 and len(lines) == 1, got.stderr
    assert lines[0].startswith("error: nosuchorg/nosuchmodel: not a local folder, and the Hub cannot be read ("), lines
    assert (f"HTTP Error {kind}" if kind != "dropped" else "disconnected") in lines[0], lines
    assert f"GET http://127.0.0.1:{port}/api/models/nosuchorg/nosuchmodel/" in lines[0], lines
    tries = 1 if kind == "429" else 2
    assert lines[0].endswith("; tried once)" if tries == 1 else "; tried 2 times)"), lines
    assert len([p for p in requested if p.startswith("/api/models/nosuchorg/nosuchmodel/")]) == tries, requested
