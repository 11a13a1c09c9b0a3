"""Hugging Face Hub ids (ORG/NAME[@REVISION]) as local folders: every option that takes a model or tokenizer folder
resolves through here (huggingface_hub's cache, HF_HOME, HF_TOKEN, HF_HUB_OFFLINE; safetensors preferred). A Hub
that cannot be reached, or fails the first request, is one line soon, not after huggingface_hub's retries."""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import itertools
import logging
import os
import re
import socket
import stat
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from lcft.errors import LcftError, closest, did_you_mean, reason
from lcft.files import dangling, read_text

# ORG/NAME as the Hub spells repository ids, then an optional @revision (a branch, a tag or a commit hash).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?:@(?P<revision>[\w./-]{1,200}))?")
# What lcft reads from a model repository: its config and tokenizer files (all that `lcft plan` and a tokenizer
# read), and its weights (a model built from it: train --init, eval, export).
CONFIG_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "vocab.txt"]
WEIGHT_FILES = ["*.safetensors", "model.safetensors.index.json"]
TORCH_WEIGHTS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
CONNECT_PROBE_S = 10.0  # a connection not open by then is left to huggingface_hub's own timeouts and retries
NO_ROUTE = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)  # connect() failing at once, as refusal does
# Retries of the first request (the repository's file list) that fails with a server error or a dropped
# connection: one, 1 s later, then the one line; a rate limit is the one line at once. huggingface_hub's own 5
# retries over 23 s (and waits for a rate limit's reset) left the user with nothing on the screen; once the Hub
# has answered, the download keeps its retries.
LIST_RETRIES = 1
COMMIT = re.compile(r"[0-9a-f]{40}")  # a commit hash, as the cache's refs hold them and its snapshots are named
REF_BYTES = 100  # a ref file holds one commit hash (40 bytes): a longer one is no ref
# a cached tree listing (trees/<commit>.json: a file's name, size and hashes, about 250 bytes, per file of the
# repository), which huggingface_hub reads whole: 64 MiB is a quarter of a million files
MAX_TREE_BYTES = 1 << 26
# where huggingface_hub logs each failed request, then "Retrying in ..." or "Rate limited. ..." (a version that words
# them otherwise retries as it always did)
HUB_HTTP_LOGGER = "huggingface_hub.utils._http"
# entries of the cache folder that a repository not in it is compared with (models--ORG--NAME), for a "did you
# mean": a cache holds one folder per repository, and a listing of millions is not read for a suggestion
MAX_CACHE_ENTRIES = 10_000


def _id_form(text: str) -> tuple[re.Match, Path] | None:
    """The ORG/NAME[@REVISION] match of `text` and its first part, ORG, as a local path, where `text` has a Hub
    id's form and is no local path that exists; None otherwise."""
    m = HUB_ID.fullmatch(text)
    if m is None or text.startswith((".", "/")) or Path(text).exists():
        return None
    return m, Path(m["repo"].split("/")[0])


def hub_id(text: str | os.PathLike) -> tuple[str, str | None] | None:
    """(repo id, revision) when `text` names a Hub repository and no local path of that name exists."""
    form = _id_form(str(text))
    # runs/typo, where runs/ is a local folder, is a missing local path, not a repository of user "runs"
    if form is None or form[1].exists():
        return None
    return form[0]["repo"], form[0]["revision"]


def read_as_path(text: str | os.PathLike) -> str:
    """'; ./ORG is a local folder, so this was read as a path, not a Hub id (...)' to end the message about a
    missing path `text` that has a Hub id's form and is a path only because its first part exists here (hub_id);
    '' otherwise."""
    form = _id_form(str(text))
    if form is None or not form[1].exists():
        return ""
    kind = "folder" if form[1].is_dir() else "file"
    return (f"; ./{form[1]} is a local {kind}, so this was read as a path, not a Hub id (to read {form[0]['repo']} "
            "from the Hub, run from another folder)")


def local_path(text: str | os.PathLike, weights: bool = True, also: tuple[str, ...] = ()) -> Path:
    """A local path as given; a Hub id -> its snapshot folder in the cache (downloaded, with a progress bar, unless
    HF_HUB_OFFLINE is set: then only the cache is read). weights=False: its config and tokenizer files only (a
    plan or a tokenizer does not download gigabytes of weights, nor needs them cached). `also`: the names of other
    files the caller reads where the repository has them (a model folder's lcft.json)."""
    got = hub_id(text)
    return Path(text) if got is None else snapshot(*got, weights=weights, also=also)


def _offline() -> str | None:
    """The variable that sets offline mode, as huggingface_hub reads them: HF_HUB_OFFLINE, or where that is unset
    the older TRANSFORMERS_OFFLINE, true; None when neither does."""
    name = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    return name if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") else None


def _cache_dir() -> str | None:
    """HF_HUB_CACHE, else HF_HOME/hub, read now (huggingface_hub reads them once, at import), with ~ and $VARS
    expanded as huggingface_hub expands them (a value quoted in a job script or an env file keeps them)."""
    for name, below in (("HF_HUB_CACHE", ""), ("HF_HOME", "hub")):
        if os.environ.get(name):
            return str(Path(os.path.expandvars(os.path.expanduser(os.environ[name]))) / below)
    return None


def _unreachable(endpoint: str) -> str | None:
    """Why the Hub at `endpoint` cannot be reached at all, each of which huggingface_hub retries for about 25 s:
    its host name (or its proxy's) does not resolve (no network, or a mistyped HF_ENDPOINT), or its port refuses
    connections or has no route. None where a connection opens, or where it only times out (a slow network: the
    requests' own retries decide)."""
    url = urllib.parse.urlparse(endpoint)
    if not url.hostname:
        return None
    proxies = urllib.request.getproxies()  # what huggingface_hub's HTTP client reads (with macOS's and Windows' settings)
    proxy = proxies.get(url.scheme) or proxies.get("all")
    try:
        if not proxy:
            return _refused(url.hostname, url.port or (443 if url.scheme == "https" else 80), "")
        if proxies.get("no"):
            return None  # which hosts bypass the proxy is the HTTP client's reading of NO_PROXY: the requests decide
        via = urllib.parse.urlparse(proxy if "://" in proxy else f"http://{proxy}")
        default = 443 if via.scheme == "https" else 1080 if via.scheme.startswith("socks") else 80
        return _refused(via.hostname, via.port or default, "the proxy ") if via.hostname else None
    except ValueError:  # a port out of range in HF_ENDPOINT or the proxy: the request says so
        return None


def _refused(host: str, port: int, what: str) -> str | None:
    """Why a connection to host:port fails at once (no such name, refused, no route); None where it opens or
    times out."""
    offline = "; set HF_HUB_OFFLINE=1 to read only the Hub cache"
    try:
        with socket.create_connection((host, port), timeout=CONNECT_PROBE_S):
            return None
    except (socket.gaierror, UnicodeError) as e:
        return f"{what}{host} does not resolve ({reason(e)}){offline}"
    except ConnectionRefusedError:
        return f"{what}{host}:{port} refuses connections{offline}"
    except OSError as e:  # a timeout among them
        return f"{what}{host}:{port}: {reason(e)}{offline}" if e.errno in NO_ROUTE else None


class _GaveUp(Exception):
    """A request to the Hub failed once more than the retries allowed (the failure as huggingface_hub logged it)."""


class _Retries(logging.Filter):
    """On huggingface_hub's HTTP logger: keeps its records (a failed request, then its retry) off the screen and
    raises _GaveUp, naming the failure, where it would wait to retry a request past `allowed` retries, or for a
    rate limit's reset."""

    def __init__(self, allowed: int) -> None:
        super().__init__()
        self.allowed, self.tries, self.failure = allowed, 1, ""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith(("Retrying in", "Rate limited")):
            self.failure = text
        elif text.startswith("Rate limited") or self.tries > self.allowed:
            raise _GaveUp(f"{self.failure}; tried {'once' if self.tries == 1 else f'{self.tries} times'}")
        else:
            self.tries += 1
        return False


@contextlib.contextmanager
def _quiet(retries: int | None = None) -> Iterator[None]:
    """huggingface_hub's log warnings (each retry of a failed request, two lines) left out: what fails is one
    line of lcft's. With `retries`, a failed request is retried that many times, not as often as huggingface_hub
    would: the next failure is raised (_GaveUp)."""
    from huggingface_hub.utils import logging as hub_logging  # its import sets the level: first, then ours

    level = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()
    http, cut = logging.getLogger(HUB_HTTP_LOGGER), None if retries is None else _Retries(retries)
    http_level = http.level
    if cut is not None:
        http.addFilter(cut)
        http.setLevel(logging.WARNING)  # its records reach the filter (which drops them), not the screen
    try:
        yield
    finally:
        hub_logging.set_verbosity(level)
        if cut is not None:
            http.removeFilter(cut)
            http.setLevel(http_level)


def _cached_commit(repo: str, folder: Path, revision: str) -> str | None:
    """The commit hash the cache's refs/<revision> holds, read here (a regular file, without blocking, of at most
    REF_BYTES): huggingface_hub reads it whole, online too, however it got there, and would wait forever on a
    FIFO. None where the cache has no such ref (offline, huggingface_hub then says it is not cached)."""
    if ".." in revision.split("/") or revision.startswith("/"):  # git refuses such names: no ref of the Hub's
        raise LcftError(f"{repo}: {revision!r} is not a revision name (a branch, a tag or a commit hash)")
    ref = folder / "refs" / revision
    if not os.path.lexists(ref):
        return None
    commit = read_text(ref, REF_BYTES, "the Hub cache's ref")
    if not COMMIT.fullmatch(commit):
        raise LcftError(f"the Hub cache's ref {ref} does not hold a commit hash: remove it (or the whole "
                        f"{folder}) and download again")
    return commit


def _check_trees(folder: Path) -> None:
    """The cached tree listings that huggingface_hub reads whole (trees/<commit>.json, json.load): each a regular
    file of at most MAX_TREE_BYTES, or one line naming it, before one is opened."""
    trees = folder / "trees"
    for path in sorted(trees.iterdir()) if trees.is_dir() else []:
        try:
            st = path.stat()
        except OSError as e:
            raise LcftError(f"the Hub cache's tree listing {path}: cannot read it ({reason(e)})") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TREE_BYTES:
            why = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"{st.st_size} bytes, over {MAX_TREE_BYTES}"
            raise LcftError(f"the Hub cache's tree listing {path} is {why}: remove it and download again")


def snapshot(repo: str, revision: str | None = None, weights: bool = True, also: tuple[str, ...] = ()) -> Path:
    """The cached snapshot of a model repository at `revision` (default main): config and tokenizer files, the
    files named in `also`, and (`weights`) safetensors weights, or pytorch_model.bin only where the repository has
    no safetensors."""
    try:
        import huggingface_hub as hh
        from huggingface_hub import constants, errors
    except ImportError:
        raise LcftError(f"{repo}: Hub ids need the huggingface_hub package (pip install huggingface_hub)") from None
    from huggingface_hub.file_download import repo_folder_name

    offline, cache = _offline(), _cache_dir()
    token = os.environ.get("HF_TOKEN") or None
    if not offline and (why := _unreachable(constants.ENDPOINT)):
        raise LcftError(f"{repo}: not a local folder, and the Hub cannot be reached: {why}")
    folder = Path(cache or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    _check_trees(folder)
    # a branch or tag's ref is read here, with bounds, not by huggingface_hub: offline, it is given the commit
    cached = None if COMMIT.fullmatch(revision or "") else _cached_commit(repo, folder, revision or "main")
    pinned = cached if offline and cached else revision
    try:
        patterns = CONFIG_FILES + list(also) + (WEIGHT_FILES if weights else [])
        if offline and weights:
            patterns += TORCH_WEIGHTS  # whatever the cache holds; from_pretrained prefers safetensors
        elif not offline:  # the first request, its failure one line soon (LIST_RETRIES), weights needed or not
            with _quiet(retries=LIST_RETRIES):
                files = hh.HfApi(token=token).list_repo_files(repo, revision=revision)
            if weights and not any(f.endswith(".safetensors") for f in files):
                patterns += TORCH_WEIGHTS
        with _quiet():
            path = hh.snapshot_download(repo, revision=pinned, cache_dir=cache, local_files_only=bool(offline),
                                        allow_patterns=patterns, token=token)
    except errors.LocalEntryNotFoundError:
        raise _not_cached(repo, revision, folder, offline) from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError):
        raise LcftError(f"{repo}: no such Hub repository, or it needs access (log in or set HF_TOKEN)"
                        f"{did_you_mean(_meant(repo, folder))}") from None
    except errors.RevisionNotFoundError:
        raise LcftError(f"{repo}: no revision {revision!r} on the Hub") from None
    except RecursionError:  # the one file it parses whole that _check_trees bounds by size only: its nesting
        raise LcftError(f"the Hub cache's tree listing in {folder / 'trees'} is nested too deep to be one: remove it "
                        "and download again") from None
    except Exception as e:  # noqa: BLE001 (HTTP, connection and validation errors of its HTTP stack alike)
        raise LcftError(f"{repo}: not a local folder, and the Hub cannot be read ({reason(e)})") from None
    _check_links(repo, revision, Path(path), patterns, offline)
    return Path(path)


def _check_links(repo: str, revision: str | None, snapshot: Path, patterns: list[str], offline: str | None) -> None:
    """Each file of the snapshot that lcft reads (`patterns`) is there: a link to a blob the cache lacks (a
    download cut short, blobs removed by hand), which huggingface_hub hands over offline, is one line naming the
    blob and how to fetch it again, not a folder with 'no config.json' or weights that cannot be read."""
    for entry in itertools.islice(snapshot.iterdir(), MAX_CACHE_ENTRIES):
        if any(fnmatch.fnmatchcase(entry.name, p) for p in patterns) and dangling(entry):
            blob = os.path.normpath(entry.parent / os.readlink(entry))
            again = f"run again without {offline}, or run " if offline else "run "
            raise LcftError(f"{repo}: {entry.name} in the Hub cache is a link to {blob}, which is not there: "
                            f"download it again ({again}`hf download {repo}"
                            f"{' --revision ' + revision if revision else ''}`)")


def _cached_repos(root: Path) -> list[str]:
    """The model repositories ORG/NAME that the Hub cache `root` holds (its models--ORG--NAME folders), among its
    first MAX_CACHE_ENTRIES entries; none where it cannot be listed."""
    try:
        with os.scandir(root) as entries:
            names = [e.name for e in itertools.islice(entries, MAX_CACHE_ENTRIES)]
    except OSError:
        return []
    ids = ("/".join(parts[1:]) for n in names if (parts := n.split("--"))[0] == "models" and len(parts) == 3)
    return [i for i in ids if (m := HUB_ID.fullmatch(i)) and not m["revision"]]


def _closest_cached(repo: str, cached: list[str]) -> str | None:
    """The cached repository `repo` was likely meant to be: of its own ORG, the closest NAME (compared whole, ids
    of one ORG look alike by their shared part: 'dna-org/not-cached' is not 'dna-org/tiny-llama'); else the
    closest id of another ORG (a mistyped ORG)."""
    org, name = repo.split("/")
    ours = {r.split("/")[1]: r for r in cached if r.split("/")[0] == org}
    meant = closest(name, ours)
    return ours[meant] if meant else closest(repo, [r for r in cached if r.split("/")[0] != org])


def _not_cached(repo: str, revision: str | None, folder: Path, offline: str | None) -> LcftError:
    """The one line for a snapshot the Hub cache lacks: the cache folder named (the default one too), and the
    closest repository it holds where it holds none of this name (a mistyped id)."""
    why = f"{offline} is set" if offline else "the Hub did not answer"
    where = str(folder.parent) if _cache_dir() else f"the default cache, {folder.parent}"
    return LcftError(f"{repo}{'@' + revision if revision else ''}: not in the Hub cache ({where}) and {why}"
                     f"{did_you_mean(_meant(repo, folder))}")


def _meant(repo: str, folder: Path) -> str | None:
    """The cached repository a mistyped `repo` (whose cache folder is `folder`) likely meant; None where the cache
    holds `repo` itself (a revision or a file of it is what is missing)."""
    return None if os.path.lexists(folder) else _closest_cached(repo, _cached_repos(folder.parent))
