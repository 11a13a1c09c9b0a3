"""A tokenizer.json's normalizer bounded from the file alone (normalizer_growth): SentencePiece charsmaps, chained
normalizers, a normalizer written without its type, lcft's own k-mer files; each against what `tokenizers` writes."""

from __future__ import annotations

import base64
import json
import re
import struct
import unicodedata

import pytest
from tokenizers import Regex, Tokenizer, normalizers

from lcft.errors import LcftError
from lcft.genomics.hf_tokenizer import hf_tokenizer_json
from lcft.genomics.kmer_tokenizer import KmerTokenizer
from lcft.genomics.model_tokenizer import load_tokenizer, tokenizer_from_json_text
from lcft.genomics.normalizer_growth import (
    CONTENT_KINDS,
    MAX_CHARSMAP,
    PLAIN_KEPT,
    RULE_LIMIT,
    UNICODE_GROWTH,
    is_plain,
    normalizer_growth,
)
from lcft.genomics.tokenizer import tokenizer_spec
from lcft.genomics.tokenizer_hash import BOUNDARY, BOUNDARY_RULE
from tests.genomics.test_tokenizer_probe import FDFA, tokenizer_json, written

ACUTE = "A\u0301"  # A and a combining acute accent: one grapheme of two characters


def charsmap(rewrites: dict[str, str]) -> bytes:
    """A SentencePiece charsmap mapping each key to its rewrite: a darts-clone double array (u32 units: label in
    bits 0-7, has-leaf bit 8, offset to the children from bit 10; a leaf's value with bit 31 set), each trie node's
    children in a 256-unit block of its own at position block ^ byte, its leaf in the block's unit 0."""
    nodes: list[dict] = [{}]
    for key, value in rewrites.items():
        node = nodes[0]
        for b in key.encode():
            if b not in node:
                nodes.append({})
                node[b] = nodes[-1]
            node = node[b]
        node[None] = value
    index = {id(n): i for i, n in enumerate(nodes)}
    blob, at = b"", {}
    for value in dict.fromkeys(rewrites.values()):
        at[value], blob = len(blob), blob + value.encode() + b"\0"
    units = [0] * (256 * (len(nodes) + 1))
    units[0] = 256 << 10  # the root's children: block 1
    for i, node in enumerate(nodes):
        block = 256 * (i + 1)
        for b, child in node.items():
            if b is None:
                units[block] = 1 << 31 | at[child]
            else:
                pos = block ^ b
                units[pos] = b | (None in child) << 8 | (pos ^ 256 * (index[id(child)] + 1)) << 10
    return struct.pack(f"<I{len(units)}I", 4 * len(units), *units) + blob


def test_a_charsmap_rewrite_no_probe_sees_is_bounded_from_the_file(tmp_path):
    """A charsmap looks up each grapheme: a Replace writing an accented letter for a 7-mer no probe holds, then a
    charsmap rewriting that letter as 500, is 71 characters a base; refused from the charsmap's longest rewrite."""
    def bomb(n: int) -> normalizers.Normalizer:
        return normalizers.Sequence([normalizers.Replace("GATTACA", ACUTE), normalizers.Precompiled(charsmap({ACUTE: "N" * n}))])

    path = tokenizer_json(tmp_path / "bomb", bomb(500))
    assert written(path, "GATTACA" * 4) == 2000 and written(path, "ACGTN" * 8) == 40
    with pytest.raises(LcftError, match="can write 500 characters for one base") as e:
        load_tokenizer(str(path))
    assert "\n" not in str(e.value)
    with pytest.raises(LcftError, match="can write 500 characters"):  # the copy kept with prepared data
        tokenizer_from_json_text(path.read_text(), "kept")
    path = tokenizer_json(tmp_path / "limit", bomb(RULE_LIMIT))  # RULE_LIMIT itself loads
    assert written(path, "GATTACA") == RULE_LIMIT and load_tokenizer(str(path)).vocab_size == 7


def test_a_charsmap_sees_dna_one_letter_at_a_time(tmp_path):
    """Each DNA letter is a grapheme of its own, so a charsmap never rewrites a multi-letter key in DNA (the
    library's own answer); a rewrite longer than RULE_LIMIT is refused all the same: the file cannot say which
    keys DNA reaches once a rule before it has written."""
    path = tokenizer_json(tmp_path / "tok", normalizers.Precompiled(charsmap({"ACGTAC": "N" * 1000, "G": "GG"})))
    assert written(path, "ACGTAC") == 7  # G doubled, ACGTAC as it was
    with pytest.raises(LcftError, match="can write 1,000 characters for one base"):
        load_tokenizer(str(path))


def nfkc_charsmap() -> bytes:
    """A charsmap of the kind SentencePiece embeds (its nmt_nfkc rule is NFKC's compatibility mappings): every
    character of the Arabic presentation forms and the CJK compatibility block that NFKC rewrites, as Python's
    unicodedata writes it; U+FDFA among them, whose 18 characters are the longest rewrite NFKC has."""
    chars = (chr(c) for c in [*range(0xFB50, 0xFE00), *range(0x3300, 0x3400)])
    return charsmap({c: n for c in chars if (n := unicodedata.normalize("NFKC", c)) != c})


def test_an_nfkc_charsmap_loads(tmp_path):
    """An NFKC charsmap: its longest rewrite (U+FDFA, 18 characters, as the library writes it) is the bound, and
    leaves DNA as it is; transformers' ALBERT chain around it is 18 too (Unicode kinds on ASCII)."""
    spm = normalizers.Precompiled(nfkc_charsmap())
    assert len(spm.normalize_str(FDFA)) == 18 and spm.normalize_str("\u3300") == unicodedata.normalize("NFKC", "\u3300")
    path = tokenizer_json(tmp_path / "tok", spm)
    assert written(path, "ACGTNRYKM") == 9
    assert normalizer_growth(json.loads(path.read_text())["normalizer"], "t") == (18.0, False)
    assert load_tokenizer(str(path)).vocab_size == 7
    albert = normalizers.Sequence([
        normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFKD(), normalizers.StripAccents(),
        normalizers.Lowercase(), spm, normalizers.Replace(Regex(" {2,}"), " ")])
    assert normalizer_growth(json.loads(albert.__getstate__()), "t")[0] == 18.0


@pytest.mark.parametrize(("charsmap_text", "refusal"), [
    (base64.b64encode(struct.pack("<I", 16) + b"\0" * 8).decode(), "its trie of 16 bytes runs past its 12 bytes"),
    (base64.b64encode(struct.pack("<I", 4) + b"\0" * 4 + b"\xff\0").decode(), "not a SentencePiece charsmap .*utf-8"),
    ("AAA*", "not a SentencePiece charsmap"),
    ("A" * (MAX_CHARSMAP + 4), f"is {MAX_CHARSMAP + 4:,} characters; lcft reads one of base64 text up to"),
])
def test_a_charsmap_lcft_cannot_read_is_refused_in_one_line(charsmap_text, refusal, tmp_path):
    """A charsmap cut short, not UTF-8 or not base64 (the library refuses these as well), or too long to read."""
    data = json.loads(tokenizer_json(tmp_path / "tok", normalizers.Replace("R", "N")).read_text())
    data["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": charsmap_text}
    text = json.dumps(data)
    if len(charsmap_text) <= MAX_CHARSMAP:  # the library's parse panics (PanicException: a BaseException)
        with pytest.raises(BaseException, match="Cannot parse precompiled_charsmap|Invalid byte"):
            Tokenizer.from_str(text)
    with pytest.raises(LcftError, match=refusal) as e:
        tokenizer_from_json_text(text, "kept")
    assert "\n" not in str(e.value)


def test_chained_normalizers_multiply(tmp_path):
    """A Replace writing 30 U+FDFA for a 7-mer, then NFKC writing each as 18: 77 characters a base, refused from
    the file (a Replace alone, 4.3 a base, passed); a chain of Unicode kinds on DNA writes one a base, and loads
    (bounded at 3: ByteLevel's for the export's run-edge mark)."""
    path = tokenizer_json(tmp_path / "bomb", normalizers.Sequence([normalizers.Replace("GATTACA", FDFA * 30), normalizers.NFKC()]))
    assert written(path, "GATTACA") == 540
    with pytest.raises(LcftError, match="can write 77.14 characters for one base"):
        load_tokenizer(str(path))
    kinds = [normalizers.NFKC(), normalizers.NFKD(), normalizers.NFC(), normalizers.NFD(), normalizers.StripAccents(),
             normalizers.Strip(), normalizers.Nmt(), normalizers.BertNormalizer(lowercase=False), normalizers.ByteLevel()]
    path = tokenizer_json(tmp_path / "forms", normalizers.Sequence(kinds))
    assert written(path, "ACGTNRYKM" * 4) == 36
    assert load_tokenizer(str(path)).vocab_size == 7


def _library_kinds() -> dict[str, str]:
    """Class name -> serialized type of every normalizer the installed library reads but those bounded from content."""
    names = [n for n in dir(normalizers) if isinstance(getattr(normalizers, n), type)
             and issubclass(getattr(normalizers, n), normalizers.Normalizer) and n != "Normalizer"]
    assert set(CONTENT_KINDS) <= set(names)
    return {n: json.loads(getattr(normalizers, n)().__getstate__())["type"] for n in names if n not in CONTENT_KINDS}


def test_every_kind_the_library_reads_is_declared():
    assert set(_library_kinds().values()) == set(UNICODE_GROWTH)


# every code point of the planes that hold decompositions and case mappings (0-2), every 101st of the others
CODE_POINTS = [chr(c) for c in [*range(0x30000), *range(0x30000, 0x110000, 101)] if not 0xD800 <= c < 0xE000]


@pytest.mark.parametrize("kind", sorted(UNICODE_GROWTH))
def test_a_unicode_kind_writes_at_most_its_declared_worst(kind):
    """The library's own output, one code point at a time: never more than declared (the declared worst itself for
    the normalization forms and ByteLevel); on plain text (ASCII, the run-edge mark) as declared for it."""
    norm = normalizers.BertNormalizer(strip_accents=True) if kind == "BertNormalizer" else getattr(normalizers, kind)()
    on_plain, on_any = UNICODE_GROWTH[kind]
    most = max(len(norm.normalize_str(c)) for c in CODE_POINTS)
    assert most <= on_any
    assert most == on_any or kind in ("Lowercase", "BertNormalizer")  # 2 and 3: declared from the rules
    plain = [norm.normalize_str(c) for c in [*map(chr, range(128)), BOUNDARY]]
    assert max(map(len, plain)) == on_plain
    assert all(map(is_plain, plain)) == (kind in PLAIN_KEPT)
    assert (plain[-1] == BOUNDARY) == (kind in PLAIN_KEPT)


def test_a_file_and_its_export_are_held_to_one_bound(tmp_path):
    """The export upper-cases and marks run edges before the file's normalizer (a mark the Unicode kinds write as
    itself): a normalizer at the bound, and a chain of Unicode kinds, load as exported as they do as published."""
    for name, norm in (("limit", normalizers.Replace("GATTACA", "GATTACA" * RULE_LIMIT)),
                       ("forms", normalizers.Sequence([normalizers.NFKC(), normalizers.BertNormalizer(lowercase=False),
                                                       normalizers.NFD()]))):
        tok = load_tokenizer(str(tokenizer_json(tmp_path / name, norm)))
        export = hf_tokenizer_json(tok)
        assert BOUNDARY_RULE in json.loads(export)["normalizer"]["normalizers"]  # marks before the file's normalizer
        assert len(Tokenizer.from_str(export).normalizer.normalize_str("ACGTNACGT")) == 11  # and writes them
        assert tokenizer_from_json_text(export, "export").sha256() == tok.sha256()


def test_a_normalizer_written_without_its_type_is_bounded_as_the_library_reads_it(tmp_path):
    """The library reads a normalizer object without a type by its fields (here a Replace of a 7-mer by 1,000
    characters): the pipeline as the library writes it back is bounded as well."""
    data = json.loads(tokenizer_json(tmp_path / "tok", normalizers.Replace("R", "N")).read_text())
    data["normalizer"] = {"type": "Sequence", "normalizers": [{"pattern": {"String": "GATTACA"}, "content": "N" * 1000}]}
    text = json.dumps(data)
    assert len(Tokenizer.from_str(text).normalizer.normalize_str("GATTACA")) == 1000
    (tmp_path / "tok" / "tokenizer.json").write_text(text)
    for load in (lambda: tokenizer_from_json_text(text, "kept"), lambda: load_tokenizer(str(tmp_path / "tok"))):
        with pytest.raises(LcftError, match="can write 142.9 characters for one base"):
            load()


def test_lcft_kmer_files_with_a_normalizer_are_refused(tmp_path):
    """A WordLevel file with lcft's k-mer split is read by lcft's own k-mer reader, which never runs a normalizer:
    one there (the library's ids differ with it) is refused, a bomb too; lcft's own files still read as k-mers, and
    its char vocabulary's export (a 1-mer split behind char's normalizer) as char."""
    tok = load_tokenizer("kmer:3")
    plain = json.loads(tok.json_text)
    shift = {**plain, "normalizer": {"type": "Replace", "pattern": {"String": "A"}, "content": "C"}}
    assert Tokenizer.from_str(json.dumps(shift)).encode("AAACCC").ids != Tokenizer.from_str(tok.json_text).encode("AAACCC").ids
    bomb = {**plain, "normalizer": {"type": "Replace", "pattern": {"String": "GATTACA"}, "content": "N" * 5000}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(shift))
    with pytest.raises(LcftError, match=re.escape("k-mer pre-tokenizer with a normalizer (Replace)")):
        load_tokenizer(str(tmp_path))
    for data in (shift, bomb, {**plain, "normalizer": ["x"]}):
        with pytest.raises(LcftError, match="k-mer pre-tokenizer with a normalizer"):
            tokenizer_from_json_text(json.dumps(data), "kept")
    for text in (tok.json_text, hf_tokenizer_json(tok)):  # the copy kept with the data; the export (upper-casing)
        own = tokenizer_from_json_text(text, "own")
        assert isinstance(own, KmerTokenizer) and own.sha256() == tok.sha256()
    export = json.loads(hf_tokenizer_json(load_tokenizer("char")))  # char's export: IUPAC codes as N
    char = tokenizer_from_json_text(json.dumps(export), "char export")
    assert not char.json_text and char.spec() == tokenizer_spec()  # read as char itself, not as 1-mers
    export["model"]["vocab"]["X"] = 9  # char's normalizer over other tokens: 1-mers would map no code to N
    with pytest.raises(LcftError, match="k-mer pre-tokenizer with a normalizer"):
        tokenizer_from_json_text(json.dumps(export), "grown char export")
