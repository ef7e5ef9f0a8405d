"""Vocabulary training: a BERT-style WordPiece vocab (HuggingFace `tokenizers`, with the original's normalisation
and pre-tokenization) or a SentencePiece model, saved as bert_jax.data.tokenization's tokenizers load them."""

from __future__ import annotations

import collections
import os
import tempfile
from typing import Iterable, Iterator

import sentencepiece
from tokenizers import models, trainers

from bert_jax.data import basic_tokenizer
from bert_jax.data.tokenization import (MAX_INPUT_CHARS_PER_WORD, SPECIAL_TOKENS, SentencePieceTokenizer,
                                        WordPieceTokenizer)


def _training_lines(texts: Iterable[str], lower: bool) -> Iterator[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be an iterable of strings (e.g. a list of documents), not one string")
    for text in texts:
        # One line per sentence: SentencePiece skips "sentences" over max_sentence_length bytes.
        for line in text.split("\n"):
            line = line.strip()
            if line:
                yield line.lower() if lower else line


def train_wordpiece(texts: Iterable[str], *, vocab_size: int, output_dir: str, do_lower_case: bool = True,
                    min_frequency: int = 2, limit_alphabet: int = 1000) -> WordPieceTokenizer:
    """Trains a BERT-style WordPiece vocab ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4), saves it to `output_dir`.

    Counting uses the same normalization and pre-tokenization as encoding, so every learned piece is reachable.
    Only the `limit_alphabet` most frequent characters are kept (the rest become [UNK]), so a stray script in a
    web corpus cannot spend the vocabulary. The texts are spooled to a temporary file, read twice.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"train_wordpiece: vocab_size={vocab_size} leaves no room beyond {SPECIAL_TOKENS}")
    backend = basic_tokenizer.backend(
        models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD), do_lower_case)
    with tempfile.TemporaryDirectory() as scratch:
        corpus_file = os.path.join(scratch, "corpus.txt")
        raw_counts = collections.Counter()
        with open(corpus_file, "w", encoding="utf-8") as f:
            for line in _training_lines(texts, lower=False):
                line = basic_tokenizer.prepare_text(line, do_lower_case)  # what the backend sees when encoding
                raw_counts.update(line)
                f.write(line + "\n")
        char_counts = collections.Counter()
        for char, count in raw_counts.items():  # the normalizer works character by character
            for normalized in backend.normalizer.normalize_str(char):
                if not normalized.isspace():
                    char_counts[normalized] += count
        if not char_counts:
            raise ValueError("train_wordpiece: the training texts were empty; pass an iterable of non-empty strings")
        alphabet = sorted(sorted(char_counts, key=lambda c: (-char_counts[c], c))[:limit_alphabet])
        # Characters that the pre-tokenizer never leaves inside a word (punctuation, CJK) get no "##" form.
        continuations = ["##" + c for c in alphabet if len(backend.pre_tokenizer.pre_tokenize_str("a" + c)) == 1]
        # The trainer creates "##" pieces in hash-map order and breaks count ties by id, so the same input gave a
        # different vocab run to run (huggingface/tokenizers#1794). Registering every single-character piece up
        # front, in sorted order, fixes their ids and with them every tie-break.
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False, continuing_subword_prefix="##",
            special_tokens=list(SPECIAL_TOKENS) + alphabet + continuations, initial_alphabet=alphabet,
            limit_alphabet=len(alphabet))
        backend.train([corpus_file], trainer=trainer)
    words = [word for word, _ in sorted(backend.get_vocab().items(), key=lambda item: item[1])]
    tokenizer = WordPieceTokenizer(words, do_lower_case=do_lower_case, source=f"train_wordpiece({output_dir})")
    tokenizer.save(output_dir)
    return tokenizer


def train_sentencepiece(texts: Iterable[str], *, vocab_size: int, output_dir: str, model_type: str = "unigram",
                        do_lower_case: bool = False, character_coverage: float = 0.9995,
                        seed: int = 0) -> SentencePieceTokenizer:
    """Trains a SentencePiece model ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4), saves it to `output_dir`."""
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"train_sentencepiece: model_type={model_type!r}; expected 'unigram' or 'bpe'")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"train_sentencepiece: vocab_size={vocab_size} leaves no room beyond {SPECIAL_TOKENS}")
    sentencepiece.set_random_generator_seed(seed)
    with tempfile.TemporaryDirectory() as scratch:
        prefix = os.path.join(scratch, "spm")
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=_training_lines(texts, lower=do_lower_case), model_prefix=prefix,
                vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
                normalization_rule_name="nmt_nfkc",
                # Fixed ids, the same as a trained WordPiece vocab. [CLS]/[SEP]/[MASK] are control symbols, so
                # the literal text "[MASK]" is never encoded as the mask id (WordPiece splits it up too).
                pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
                control_symbols=list(SPECIAL_TOKENS[2:]),
                # Pinned rather than taken from the machine, so thread partitioning of the EM sums cannot make
                # two machines train different models from the same input.
                num_threads=16, minloglevel=2)
        except RuntimeError as error:
            raise ValueError(f"train_sentencepiece: sentencepiece refused the input ({error}). Fix: give it more "
                             "text or a smaller vocab_size") from None
        with open(prefix + ".model", "rb") as f:
            model_proto = f.read()
    tokenizer = SentencePieceTokenizer(model_proto, do_lower_case=do_lower_case,
                                       source=f"train_sentencepiece({output_dir})")
    tokenizer.save(output_dir)
    return tokenizer
