"""Sentence splitting of user corpora with sentencex (Wikimedia's rule-based segmenter, a compiled Rust core).

Chosen by `python -m bert_jax.benchmarks.sentences` (docs/data.md, "Sentence splitting"): of the splitters measured
that need no model download, level with the most accurate on independent gold text and by far the fastest, with
rules for ~300 languages and English fallbacks that also end sentences at CJK full stops. The offline demo corpus
keeps `demo_corpus.split_sentences_by_rules`, which runs without third-party packages; corpus imports this module on
first use.
"""

from __future__ import annotations

import sentencex


def split_sentences(text: str, language: str = "en") -> list[str]:
    """The sentences of `text`, stripped, with whitespace runs made single spaces; [] for blank text.

    `language` is an ISO 639 code. English scored within a point of German's and French's own rules on German and
    French text, so the default also serves a corpus of unknown or mixed language.
    """
    text = " ".join(text.split())
    return [sentence.strip() for sentence in sentencex.segment(language, text) if sentence.strip()] if text else []
