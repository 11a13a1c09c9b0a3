"""What a tokenizer.json lcft did not write is checked on before it encodes a base: that it does not enlarge DNA.

A normalizer can write more than it reads (a Replace of one letter by a thousand, a Prepend, Unicode forms), and
`tokenizers` allocates for all of it: a 1 KB file could make one 4096-base block a million tokens. The normalizer is
bounded from the file itself first (`normalizer_growth`, whatever the bases: every kind's worst case, a Sequence's
product); then, with a normalizer or a regex lcft did not write, a child process with bounded memory encodes every
letter alone and as a run, and tandem repeats of every unit up to 6 bases (`REPEATS`): one that gives more than
GROWTH tokens or characters a base, runs out of memory, whose regex the engine gives up on (a Rust panic), or that
takes more than SLOW_US of CPU a base (a regex that backtracks on a repeat: (GA)n and its kind are common in
genomes, and a search that backtracks is polynomial or exponential in the repeat's length) is refused in one line.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import string
import subprocess
import sys
from typing import Any

from lcft.errors import LcftError
from lcft.genomics.kmer_tokenizer import kmer_k_of
from lcft.genomics.normalizer_growth import check_normalizer
from lcft.genomics.tokenizer_hash import BOUNDARY_RULE, MARKED_RUNS_SPLIT, RUNS_SPLIT
from lcft.units import counted

BPE_BLOCK = 4096  # tokenizer.json pieces never cross a multiple of this many bases of the record (see README)
GROWTH = 4  # tokens, or normalized characters, a base may give (a DNA tokenizer gives at most one token a base)
MARKS = 4  # and this many more a piece: the word-start marks a pipeline puts before a string
PROBE_BYTES = 1 << 30  # address space of the probing child: a pipeline that needs more for a probe is refused
PROBE_S = 120  # a probe still running by then is refused as well
NOT_READ = 4  # the probing child's exit code for a file the library does not read: nothing probed
# CPU a probe may take a base: a DNA tokenizer takes under 1 µs (a BPE of 1,024 tokens: 0.3); a Split regex that
# backtracks, 100 and more on a repeat of 1,024 bases ((?:GA)*(?:GA)*T on (GA)n then C: 117). At 20 a base, a
# whole human genome would take 17 hours
SLOW_US = 20
SLACK_S = 0.05  # and this much a probe whatever its length (the first call's set-up, the clock's grain)
REPEAT_LENGTHS = (256, 1024, BPE_BLOCK)  # growing: a search polynomial in the repeat's length is caught short


def _fold(unit: str) -> str:
    """The least rotation of a tandem-repeat unit: one name for the repeat whatever its phase."""
    return min(unit[i:] + unit[:i] for i in range(len(unit)))


def _units(k: int) -> list[str]:
    """Every tandem-repeat unit of `k` bases up to rotation, less those that repeat a shorter one (ACAC is AC)."""
    return sorted({_fold(u) for u in map("".join, itertools.product("ACGT", repeat=k))
                   if all(u != u[:d] * (k // d) for d in range(1, k) if k % d == 0)})


# one unit of each mono-, di- and trinucleotide repeat up to rotation (a run of AG is a run of GA one base on)
REPEAT_UNITS = sorted(u for k in (1, 2, 3) for u in _units(k))
# Longer units: 60 + 204 + 670 of 4, 5 and 6 bases, 5M bases at the three lengths even with one end each (12x the
# rest of the probe). A search backtracks on a repeat in one of two ways. Exponentially (alternatives that split a
# unit two ways, as (?:GGAAT|GGA|AT)+C on (GGAAT)n): some 20 periods exhaust the engine's retry limit (a panic) or
# the budget, and every unit of a few bases occurs as such a short run somewhere in a genome, so every unit of 4-6
# bases is probed once, at 256 bases (42-64 periods: room for a slower growth; CPU allowed: 0.055 s).
# Polynomially (quantified pieces in a row, as (?:GGAAT)*(?:GGAAT)*C): the cost a base grows as a power of the
# run's length, harmless on a short run (that one: 1 µs a base at 256 bases, 10 at 1,024, 110 at 4,096), so it
# matters only where a genome holds a unit in arrays of kilobases: the units below, both strands, probed at every
# length. (Alpha satellite's 171-base unit is no pattern's piece: a regex backtracks on the few bases its pieces span)
ARRAY_UNITS = sorted({_fold(v) for u in (
    "GGAAT",  # human satellite III (megabases at 1q12, 9q12, Yq12), with (ATTCC)n = (CATTC)n on the other strand
    "TTAGGG", "TTAGG", "TTAGGC", "TTTAGGG",  # the telomere of vertebrates, arthropods, nematodes and plants
    "GGAA", "AAAT", "AAAAT",  # human microsatellites common and long ((AAAT)n, (AAAAT)n at Alu tails)
) for v in (u, u[::-1].translate(str.maketrans("ACGT", "TGCA")))})


def _end(unit: str, n: int) -> str:
    """The one base a longer unit's probe of `n` bases ends in: one not in the unit, else one that breaks its
    period (a unit of 6 bases mostly holds all four)."""
    return min("ACGT", key=lambda b: (b in unit, b == (unit * n)[n - 1]))


_SCREENED = sorted({*ARRAY_UNITS, *(u for k in (4, 5, 6) for u in _units(k))})  # the longer units at 256 bases
# (unit, bases, the bases its probes end in), by length so that a search polynomial in the length is caught short
REPEATS = [r for n in REPEAT_LENGTHS for r in
           [(u, n, "".join(b for b in "ACGT" if b not in u)) for u in REPEAT_UNITS] +
           [(u, n, _end(u, n)) for u in (_SCREENED if n == REPEAT_LENGTHS[0] else ARRAY_UNITS)]]
# each letter alone; each repeat, ending in each base not in its unit (a piece is a run of A/C/G/T: a base that
# fails a pattern is what sets a search backtracking; a longer unit's repeat in one, `_end`); each letter as a
# block-long run (upper case: lcft upper-cases bases before a tokenizer sees them); then mixed bases. A line names
# each probe before it is encoded, so one that exhausts the child's memory or its time is named too (the library's
# ordinary errors, a missing unknown token say, are left to `guarded`, which names them)
_PROBE = f"""import resource, sys, time
try:
    resource.setrlimit(resource.RLIMIT_AS, ({PROBE_BYTES}, {PROBE_BYTES}))
except (ValueError, OSError):
    pass
from tokenizers import Tokenizer
try:
    tk = Tokenizer.from_str(sys.stdin.read())
except Exception:  # not a pipeline the library reads (a panic is no Exception): the parent's parse says why
    sys.exit({NOT_READ})
# lcft encodes with neither (JsonTokenizer; an export drops both): a file's padding to 512 tokens is no growth of
# DNA, and its truncation must not shorten what is measured
tk.no_padding()
tk.no_truncation()
letters = {string.ascii_uppercase!r}
probes = [(c, c + ' alone') for c in letters]
probes += [((u * n)[:n - 1] + b, f'{{u!r}} repeated to {{n}} bases then {{b}}') for u, n, ends in {REPEATS!r}
           for b in ends]
probes += [(c * {BPE_BLOCK}, f'a run of {BPE_BLOCK} {{c}}') for c in letters]
probes += [(s, f'{{s[:5]!r}} repeated') for s in ('ACGT' * 1024, 'ACGTN' * 820, 'acgtn' * 820, 'AAAAC' * 820)]
def timed(s):
    t = time.process_time()
    got = max(len(tk.encode(s, add_special_tokens=False).ids), len(tk.normalizer.normalize_str(s)) if tk.normalizer else 0)
    return got, time.process_time() - t
for s, name in probes:
    print('probe', len(s), name, sep='\\t', flush=True)
    try:
        got, took = timed(s)
        if took > {SLOW_US} * 1e-6 * len(s) + {SLACK_S}:  # once more: a crawling search crawls again, a stall once
            took = min(took, timed(s)[1])
    except MemoryError:
        raise
    except Exception:
        continue
    if got > {GROWTH} * len(s) + {MARKS}:
        print('grows', got, sep='\\t', flush=True)
        sys.exit(3)
    if took > {SLOW_US} * 1e-6 * len(s) + {SLACK_S}:
        print('slow', took, sep='\\t', flush=True)
        sys.exit(5)
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


def probe_tokenizer(data: dict[str, Any], text: str, source: str) -> None:
    """Refuse, in one line, tokenizer.json `text` (parsed: `data`) that enlarges DNA or whose regex the engine
    gives up on (module docstring)."""
    norm = data.get("normalizer")
    check_normalizer(norm, source)
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
    fields = ", ".join(f"{f} {p[:60]!r}" for f, p in found)
    if rc == 5 and out and out[-1].startswith("slow\t"):
        took = float(out[-1].split()[1])
        what = f"the regex engine backtracks on {fields}" if found else "the tokenizers library crawls"
        raise LcftError(f"tokenizer {source}: {what}: {took:.2f} s of CPU for {name} ({took / bases * 1e6:,.0f} µs "
                        f"a base; lcft allows {SLOW_US}), so prepare would crawl on such repeats in a genome; lcft "
                        "cannot tokenize with it")
    why = next((ln.strip() for ln in err.splitlines() if "rror" in ln), "it failed") if rc else f"no answer within {PROBE_S} s"
    what = f"the regex engine gives up on {fields}" if found else "the tokenizers library fails"
    raise LcftError(f"tokenizer {source}: {what} for {name} ({why[:160]}); lcft cannot tokenize with it")


def vouch(text: str) -> None:
    """Record tokenizer.json `text` as probed: `tokenizers`' own writing of a pipeline that passed."""
    _PASSED.add(hashlib.sha256(text.encode()).hexdigest())
