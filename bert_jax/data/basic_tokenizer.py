"""The original BERT BasicTokenizer's text steps (clean-up, whitespace, punctuation and CJK splits, lower-casing
with accent stripping) as a HuggingFace `tokenizers` normalizer and pre-tokenizer, plus what must run in Python.
bert_jax.data.tokenization's WordPieceTokenizer puts them in front of the WordPiece model.
"""

import functools
import re
import unicodedata
from typing import Sequence

import tokenizers
from tokenizers import normalizers, pre_tokenizers

# BertNormalizer / BertPreTokenizer do the same steps with Rust tables of other Unicode versions, a clean-up that also
# drops private-use and unassigned characters, a CJK range that misses U+2B820..U+2B91F and a per-character
# lower-casing without the Greek final sigma. So here Python does what must follow its own rules and is fast in C
# (str.lower, unicodedata.normalize), and the Rust side gets every character class as explicit code-point ranges
# computed from this Python's unicodedata, the tables the original reads.

_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_PUNCTUATION_RANGES = ((33, 47), (58, 64), (91, 96), (123, 126))
_CATEGORIES = ("Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So Zs Zl Zp Cc Cf Cs Co Cn").split()
_CATEGORY_LETTER = {category: chr(0x100 + index) for index, category in enumerate(_CATEGORIES)}


@functools.lru_cache(maxsize=None)
def _char_classes() -> dict[str, tuple[tuple[int, int], ...]]:
    """The original BasicTokenizer's character tests as sorted (first, last) code-point ranges, per this Python."""
    everything = "".join(map(chr, range(0x110000)))
    # One letter per code point naming its category, so regexes find the runs of a class at C speed.
    categories = "".join(map(_CATEGORY_LETTER.__getitem__, map(unicodedata.category, everything)))

    def mask(pattern: str, text: str) -> bytearray:
        flags = bytearray(0x110000)
        for match in re.finditer(pattern, text):
            flags[match.start():match.end()] = b"\x01" * (match.end() - match.start())
        return flags

    def of(*names: str) -> str:
        return "[" + "".join(_CATEGORY_LETTER[name] for name in names) + "]+"

    def ranges(flags: bytearray) -> tuple[tuple[int, int], ...]:
        return tuple((match.start(), match.end() - 1) for match in re.finditer(rb"\x01+", bytes(flags)))

    drop = mask(of("Cc", "Cf"), categories)  # _clean_text: `cp == 0 or cp == 0xfffd or _is_control(char)`
    drop[0x9] = drop[0xA] = drop[0xD] = 0
    drop[0] = drop[0xFFFD] = 1
    isolate = mask(of(*(name for name in _CATEGORIES if name.startswith("P"))), categories)  # _is_punctuation
    for first, last in _ASCII_PUNCTUATION_RANGES:
        isolate[first:last + 1] = b"\x01" * (last + 1 - first)
    for first, last in _CJK_RANGES:  # the original isolates these as it isolates punctuation
        isolate[first:last + 1] = b"\x01" * (last + 1 - first)
    # whitespace_tokenize's str.split() splits on str.isspace() characters, which is what re's \s matches.
    return {"drop": ranges(drop), "space": ranges(mask(r"\s+", everything)),
            "isolate": ranges(isolate), "mark": ranges(mask(of("Mn"), categories))}


def _rust_class(ranges: Sequence[tuple[int, int]]) -> tokenizers.Regex:
    """A one-character Oniguruma class of exactly these code points (no Unicode property lookups on the Rust side)."""
    parts = (f"\\x{{{first:X}}}" if first == last else f"\\x{{{first:X}}}-\\x{{{last:X}}}" for first, last in ranges)
    return tokenizers.Regex("[" + "".join(parts) + "]")


def _python_class(ranges: Sequence[tuple[int, int]]) -> re.Pattern:
    parts = (f"\\U{first:08X}" if first == last else f"\\U{first:08X}-\\U{last:08X}" for first, last in ranges)
    return re.compile("[" + "".join(parts) + "]")


def backend(model, do_lower_case: bool) -> tokenizers.Tokenizer:
    classes = _char_classes()
    backend = tokenizers.Tokenizer(model)
    # Accents (Mn after the NFD of prepare_text) go only when lower-casing, as in the original; deleting both
    # kinds in one pass is the same as one after the other.
    deleted = sorted(classes["drop"] + classes["mark"]) if do_lower_case else classes["drop"]
    backend.normalizer = normalizers.Replace(_rust_class(deleted), "")
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(_rust_class(classes["space"]), behavior="removed"),
        pre_tokenizers.Split(_rust_class(classes["isolate"]), behavior="isolated")])
    return backend


@functools.lru_cache(maxsize=None)
def _python_drop() -> re.Pattern:
    return _python_class(_char_classes()["drop"])


def prepared_origin(text: str, prepared: str, do_lower_case: bool) -> list[int] | None:
    """For each character of `prepared` (prepare_text(text, do_lower_case)), the index of the character of `text` it
    came from (lower-casing and accent stripping may change the length); None where the two cannot be aligned."""
    if not do_lower_case or text.isascii():
        return list(range(len(text))) if len(prepared) == len(text) else None
    drop = _python_drop()
    origin = []
    for index, char in enumerate(text):
        if not drop.match(char):
            origin += [index] * len(unicodedata.normalize("NFD", char.lower()))
    # Canonical reordering of combining marks may move a mark across characters; the lengths still agree then, and
    # the map stays within the same base character's cluster.
    return origin if len(origin) == len(prepared) else None


def prepare_text(text: str, do_lower_case: bool) -> str:
    """The steps of the original BasicTokenizer that must run in Python, before the Rust backend sees `text`."""
    if not do_lower_case:
        return text  # the backend does the rest
    if text.isascii():
        return text.lower()  # nothing context-dependent on ASCII; the backend drops the control characters
    # Cleaning comes before lower-casing in the original, and a dropped character between a capital sigma and a
    # letter changes whether str.lower() reads the sigma as word-final.
    if _python_drop().search(text) is not None:
        text = _python_drop().sub("", text)
    return unicodedata.normalize("NFD", text.lower())
