"""What a tokenizer.json lcft did not write is checked on before it encodes a base: that it does not enlarge DNA.

A normalizer can write more than it reads (a Replace of one letter by a thousand, a Prepend, Unicode forms), and
`tokenizers` allocates for all of it: a 1 KB file could make one 4096-base block a million tokens. Its Replace and
Prepend rules are bounded from the file itself (`rule_growth`); then, with a normalizer or a regex lcft did not write,
a child process with bounded memory encodes every letter alone and as a run (`_PROBE`): one that gives more than
GROWTH tokens or characters a base, runs out of memory, or whose regex the engine gives up on (a Rust panic), is
refused in one line.
"""

from __future__ import annotations

import hashlib
import os
import re
import string
import subprocess
import sys
from typing import Any

from lcft.errors import LcftError
from lcft.genomics.kmer_tokenizer import kmer_k_of
from lcft.genomics.tokenizer_hash import BOUNDARY_RULE, MARKED_RUNS_SPLIT, RUNS_SPLIT
from lcft.units import counted

BPE_BLOCK = 4096  # tokenizer.json pieces never cross a multiple of this many bases of the record (see README)
GROWTH = 4  # tokens, or normalized characters, a base may give (a DNA tokenizer gives at most one token a base)
MARKS = 4  # and this many more a piece: the word-start marks a pipeline puts before a string
RULE_LIMIT = 64  # characters a base its Replace and Prepend rules together may write, whatever the bases
PROBE_BYTES = 1 << 30  # address space of the probing child: a pipeline that needs more for a probe is refused
PROBE_S = 120  # a probe still running by then is refused as well
NOT_READ = 4  # the probing child's exit code for a file the library does not read: nothing probed
# each letter alone, then each as a block-long run (upper case: lcft upper-cases bases before a tokenizer sees them),
# then mixed bases; a line names each probe before it is encoded, so one that exhausts the child's memory is named
# too (the library's ordinary errors, a missing unknown token say, are left to `guarded`, which names them)
_PROBE = f"""import resource, sys
try:
    resource.setrlimit(resource.RLIMIT_AS, ({PROBE_BYTES}, {PROBE_BYTES}))
except (ValueError, OSError):
    pass
from tokenizers import Tokenizer
try:
    tk = Tokenizer.from_str(sys.stdin.read())
except Exception:  # not a pipeline the library reads (a panic is no Exception): the parent's parse says why
    sys.exit({NOT_READ})
letters = {string.ascii_uppercase!r}
probes = [(c, c + ' alone') for c in letters] + [(c * {BPE_BLOCK}, f'a run of {BPE_BLOCK} {{c}}') for c in letters]
probes += [(s, f'{{s[:5]!r}} repeated') for s in ('ACGT' * 1024, 'ACGTN' * 820, 'acgtn' * 820, 'AAAAC' * 820)]
for s, name in probes:
    print('probe', len(s), name, sep='\\t', flush=True)
    try:
        got = max(len(tk.encode(s, add_special_tokens=False).ids), len(tk.normalizer.normalize_str(s)) if tk.normalizer else 0)
    except MemoryError:
        raise
    except Exception:
        continue
    if got > {GROWTH} * len(s) + {MARKS}:
        print('grows', got, sep='\\t', flush=True)
        sys.exit(3)
"""
_OWN_REGEXES = {RUNS_SPLIT["pattern"]["Regex"], MARKED_RUNS_SPLIT["pattern"]["Regex"], BOUNDARY_RULE["pattern"]["Regex"]}
_PASSED: set[str] = set()  # sha256 of pipelines probed in this process (a load parses a file, then its canonical form)


def _regexes(node: Any, where: str) -> list[tuple[str, str]]:
    """(field, pattern) of every regex in a tokenizer.json's pipeline."""
    if isinstance(node, dict):
        if isinstance(node.get("Regex"), str):
            return [(where, node["Regex"])]
        return [r for k, v in node.items() for r in _regexes(v, f"{where}.{k}")]
    if isinstance(node, list):
        return [r for j, v in enumerate(node) for r in _regexes(v, f"{where}[{j}]")]
    return []


def rule_growth(node: Any) -> float:
    """At most how many characters a normalizer's Replace and Prepend rules write for one base they read, a piece
    being as short as one base (its other rules keep ASCII letters to one character each; the probe measures them)."""
    if isinstance(node, list):
        growth = 1.0
        for v in node:
            growth *= rule_growth(v)
        return growth
    if not isinstance(node, dict):
        return 1.0
    kind, content = node.get("type"), node.get("content")
    if kind == "Replace" and isinstance(content, str):
        pattern = node.get("pattern") or {}
        text = pattern.get("String") if isinstance(pattern, dict) else None
        if isinstance(text, str) and text:  # a String replaces len(text) characters at a time
            return max(1.0, len(content) / len(text))
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        # a regex that matches only characters replaces at least one each time; one that may match nothing (or
        # that Python's engine does not read alike), before every character as well
        return max(1.0, len(content)) if _consumes(regex) else 1.0 + len(content)
    if kind == "Prepend" and isinstance(node.get("prepend"), str):
        return 1.0 + len(node["prepend"])
    return rule_growth(node.get("normalizers")) if kind == "Sequence" else 1.0


ASSERTIONS = re.compile(r"\\[bBAzZGK]|\(\?<?[=!]|[\^$]")  # zero-width: whether they match depends on context


def _consumes(regex: Any) -> bool:
    """Whether every match of `regex` is at least one character: it has no zero-width assertion (so its empty
    match, if any, would match anywhere) and does not match the empty string. Unsure (Python's `re` does not
    compile it): False."""
    if not isinstance(regex, str) or ASSERTIONS.search(regex):
        return False
    try:
        return re.fullmatch(regex, "") is None
    except (re.error, RecursionError, OverflowError):
        return False


def probe_tokenizer(data: dict[str, Any], text: str, source: str) -> None:
    """Refuse, in one line, tokenizer.json `text` (parsed: `data`) that enlarges DNA or whose regex the engine
    gives up on (module docstring)."""
    norm = data.get("normalizer")
    growth = rule_growth(norm)
    if growth > RULE_LIMIT:
        raise LcftError(f"tokenizer {source}: its normalizer's Replace/Prepend rules can write {growth:,.4g} "
                        f"characters for one base (lcft allows {RULE_LIMIT}); lcft refuses a tokenizer that enlarges DNA")
    found = [r for key in ("normalizer", "pre_tokenizer") for r in _regexes(data.get(key), key)
             if r[1] not in _OWN_REGEXES and kmer_k_of(r[1]) is None]
    digest = hashlib.sha256(text.encode()).hexdigest()
    if (norm is None and not found) or digest in _PASSED:
        return
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE], input=text, capture_output=True, text=True,
                             timeout=PROBE_S, env={**os.environ, "RUST_BACKTRACE": "0"}, check=False)
        rc, out, err = res.returncode, res.stdout.splitlines(), res.stderr
    except subprocess.TimeoutExpired as e:  # what it wrote so far comes as bytes
        rc, out, err = None, (e.stdout or b"").decode(errors="replace").splitlines(), ""
    if rc == 0:
        _PASSED.add(digest)
    if rc in (0, NOT_READ):
        return
    _refuse(source, rc, out, err, found)


def _refuse(source: str, rc: int | None, out: list[str], err: str, found: list[tuple[str, str]]) -> None:
    """The one line for a probe that failed: exit code `rc` (None: timed out), its stdout lines and stderr."""
    last = next((ln.split("\t") for ln in reversed(out) if ln.startswith("probe\t")), ["probe", "0", "?"])
    bases, name = int(last[1]), last[2]
    if rc == 3 and out and out[-1].startswith("grows\t"):
        raise LcftError(f"tokenizer {source} gives {int(out[-1].split()[1]):,} tokens or characters for {name} "
                        f"({counted(bases, 'base')}; lcft allows {GROWTH} a base and {MARKS} more); lcft refuses a tokenizer "
                        "that enlarges DNA")
    if rc is not None and "memory" in err.lower():  # Rust's failed allocation aborts; Python raises MemoryError
        raise LcftError(f"tokenizer {source}: encoding {name} ({counted(bases, 'base')}) needs over {PROBE_BYTES >> 20:,} MiB; "
                        "lcft refuses a tokenizer that enlarges DNA")
    why = next((ln.strip() for ln in err.splitlines() if "rror" in ln), "it failed") if rc else f"no answer within {PROBE_S} s"
    fields = ", ".join(f"{f} {p[:60]!r}" for f, p in found)
    what = f"the regex engine gives up on {fields}" if found else "the tokenizers library fails"
    raise LcftError(f"tokenizer {source}: {what} for {name} ({why[:160]}); lcft cannot tokenize with it")


def vouch(text: str) -> None:
    """Record tokenizer.json `text` as probed: `tokenizers`' own writing of a pipeline that passed."""
    _PASSED.add(hashlib.sha256(text.encode()).hexdigest())
