"""WordPiece and SentencePiece tokenizers behind one small interface, and a HuggingFace tokenizer.json
(TokenizerJson) behind the same interface, for checkpoints that come with one. Training a vocabulary:
bert_jax.data.vocabulary.

WordPiece reproduces the original google-research/bert FullTokenizer id for id, on every Unicode code point: the
heavy work runs on HuggingFace `tokenizers` (Rust), with every character class taken from this Python's
`unicodedata` as the original's are; SentencePiece runs on the `sentencepiece` C++ library. Both kinds encode WITHOUT
adding special tokens: the pretraining-data stage places [CLS]/[SEP] itself, as the original did.

Worker processes: `tokenizers` starts a Rust thread pool on its first batch call; a process forked after that
gets a warning and a disabled pool. So build tokenizers inside each worker, after the fork, with
`load_tokenizer(saved_dir)`, and set `TOKENIZERS_PARALLELISM=false` in the worker before its first encode, so N
workers do not each start a pool sized for the whole machine (SentencePiece batches honour the same variable
here). This module leaves the variable alone: the right value depends on whether the caller is parent or worker.
"""

from __future__ import annotations

import json
import os
import posixpath
from typing import Iterable, Sequence

import numpy as np
import sentencepiece
from sentencepiece import sentencepiece_model_pb2
from tokenizers import decoders, models

from bert_jax import fileio
from bert_jax.data import basic_tokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Special ids of the original BERT WordPiece vocabularies.
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 101, 102, 103
CONFIG_FILE = "tokenizer_config.json"
WORDPIECE_VOCAB_FILE = "vocab.txt"
SENTENCEPIECE_MODEL_FILE = "spm.model"
TOKENIZER_JSON_FILE = "tokenizer.json"  # a HuggingFace `tokenizers` file (TokenizerJson)
# The original WordpieceTokenizer (max_input_chars_per_word=200) maps any longer word to [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
_SPECIAL_ID_FIELDS = ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id")


def padded_vocab_size(vocab_size: int, multiple: int = 128) -> int:
    """Embedding rows for `vocab_size` real entries: rounded up so the vocab axis shards and tiles evenly."""
    if vocab_size < 1 or multiple < 1:
        raise ValueError(f"padded_vocab_size: vocab_size ({vocab_size}) and multiple ({multiple}) must be >= 1")
    return -(-vocab_size // multiple) * multiple


def _read_bytes(path: str) -> bytes:
    with fileio.open_file(path, "rb") as f:
        return f.read()


def _write_bytes(path: str, data: bytes) -> None:
    directory = posixpath.dirname(path) if fileio.is_remote(path) else os.path.dirname(path)
    if directory:
        fileio.makedirs(directory)
    with fileio.open_file(path, "wb") as f:
        f.write(data)


# The common interface.


class Tokenizer:
    """What the rest of bert_jax may rely on; WordPieceTokenizer and SentencePieceTokenizer fill it in."""

    kind: str
    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    do_lower_case: bool

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids for each text, without special tokens."""
        raise NotImplementedError

    def tokenize(self, text: str) -> list[str]:
        raise NotImplementedError

    def encode_with_spans(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]] | None]]:
        """For each text, its ids (as encode_batch) and each piece's (start, end) characters in the text as given
        (None where the tokenizer's normalisation cannot be aligned with it)."""
        raise NotImplementedError

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Ids for token strings; a string not in the vocabulary maps to unk_id."""
        raise NotImplementedError

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        ids = [int(token_id) for token_id in ids]
        bad = [token_id for token_id in ids if not 0 <= token_id < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside this {self.kind} vocabulary (size {self.vocab_size})")
        return [self._words[token_id] for token_id in ids]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Readable text for ids, for inspection (not an exact inverse: WordPiece loses spacing and case).
        skip_special_tokens drops [PAD] [CLS] [SEP] [MASK] and keeps [UNK]."""
        raise NotImplementedError

    @property
    def vocab_words(self) -> list[str]:
        return list(self._words)

    @property
    def is_continuation(self) -> np.ndarray:
        raise NotImplementedError

    @property
    def special_ids(self) -> dict[str, int]:
        return {field: getattr(self, field) for field in _SPECIAL_ID_FIELDS}

    def save(self, directory: str) -> str:
        """Writes the vocabulary file and tokenizer_config.json into `directory` (local or gs://); returns it."""
        vocab_file = self._save_vocab(directory)
        config = {"kind": self.kind, "do_lower_case": self.do_lower_case, "vocab_file": vocab_file,
                  "vocab_size": self.vocab_size, **self.special_ids}
        _write_bytes(fileio.join(directory, CONFIG_FILE), (json.dumps(config, indent=2) + "\n").encode("utf-8"))
        return directory

    def _save_vocab(self, directory: str) -> str:
        raise NotImplementedError

    def _set_special_ids(self, found: dict[str, int | None], fix: str) -> None:
        missing = [token for token in SPECIAL_TOKENS if found[token] is None]
        if missing:
            raise ValueError(f"{self._source}: the vocabulary lacks the special token(s) {', '.join(missing)}; BERT "
                             f"pretraining needs all of {', '.join(SPECIAL_TOKENS)}. Fix: {fix}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (found[t] for t in SPECIAL_TOKENS)

    def _skip_special(self, ids: Iterable[int], skip: bool) -> list[int]:
        ids = [int(i) for i in ids]
        # [UNK] is kept: it stands for text that was there, and hiding it would make decode look lossless.
        structural = {self.pad_id, self.cls_id, self.sep_id, self.mask_id} if skip else set()
        return [i for i in ids if i not in structural]

    def __reduce__(self):
        # Pickled as the vocabulary and rebuilt, so spawn-started workers get a fresh native tokenizer.
        return _rebuild, (type(self), self._payload, self.do_lower_case, self._source)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case})"


def _rebuild(cls, payload, do_lower_case: bool, source: str) -> Tokenizer:
    return cls(payload, do_lower_case=do_lower_case, source=source)


# WordPiece.
#
# The original BasicTokenizer cleans the text (drops U+0000, U+FFFD and categories Cc/Cf other than \t \n \r), puts
# spaces around CJK ideographs, splits on whitespace, lower-cases each word with str.lower() and strips accents (NFD,
# then drops category Mn) when asked to, and splits punctuation (ASCII symbols and categories P*) off. HF's
def _parse_vocab_lines(text: str) -> list[str]:
    # The original load_vocab reads line by line and strips each line: id = line number, an empty line is the
    # token "", and a repeated token keeps the id of its LAST line (a dict overwrite). Splitting on "\n" only
    # (not str.splitlines) matches its tf.gfile readline, which does not break on \u2028 and friends.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


class WordPieceTokenizer(Tokenizer):
    """Original-BERT WordPiece: BasicTokenizer (clean, CJK split, optional lower-case + accent strip, punctuation
    split) then greedy longest-match-first with "##" continuations; Python lower-cases (str.lower + NFD), Rust
    does the rest, with the character classes of this Python's unicodedata."""

    kind = "wordpiece"

    def __init__(self, vocab_words: Sequence[str], *, do_lower_case: bool = True, source: str = "<vocab>"):
        self._words = list(vocab_words)
        self._payload, self._source = self._words, source
        self.do_lower_case = bool(do_lower_case)
        self.vocab_size = len(self._words)
        self._vocab = {word: index for index, word in enumerate(self._words)}  # last duplicate wins, as originally
        self._set_special_ids({token: self._vocab.get(token) for token in SPECIAL_TOKENS},
                              "add them as lines of the vocab file (ids are line numbers), or train a vocabulary "
                              "with bert_jax.data.vocabulary.train_wordpiece")
        # No special tokens are registered with the Rust tokenizer on purpose: the original splits a literal
        # "[MASK]" in text into "[", "mask", "]", and so must we, or raw text could inject control ids.
        self._backend = basic_tokenizer.backend(models.WordPiece(self._vocab, unk_token="[UNK]",
                                                       max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD),
                                      self.do_lower_case)
        self._decoder = decoders.WordPiece(prefix="##", cleanup=True)
        self._is_continuation = None

    @classmethod
    def from_vocab_file(cls, path: str, *, do_lower_case: bool = True) -> "WordPieceTokenizer":
        data = _read_bytes(path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not a UTF-8 WordPiece vocab.txt ({error}). Fix: pass a text file with one "
                             f"token per line, or a SentencePiece model whose name ends in .model") from None
        return cls(_parse_vocab_lines(text), do_lower_case=do_lower_case, source=path)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        lower = self.do_lower_case
        encodings = self._backend.encode_batch_fast([basic_tokenizer.prepare_text(text, lower) for text in texts],
                                                    add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def tokenize(self, text: str) -> list[str]:
        # Token strings come from our own id order, so a duplicated vocab line reads back as it was written.
        ids = self._backend.encode(basic_tokenizer.prepare_text(text, self.do_lower_case), add_special_tokens=False).ids
        return [self._words[i] for i in ids]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self._vocab.get(token, self.unk_id) for token in tokens]

    def encode_with_spans(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]] | None]]:
        # The backend's offsets index the prepared (lower-cased, accent-stripped) text; map them back.
        prepared = [basic_tokenizer.prepare_text(text, self.do_lower_case) for text in texts]
        results = []
        encodings = self._backend.encode_batch(prepared, add_special_tokens=False)
        for text, ready, encoding in zip(texts, prepared, encodings):
            origin = basic_tokenizer.prepared_origin(text, ready, self.do_lower_case)
            spans = None if origin is None else [(origin[start], origin[end - 1] + 1) if end > start
                                                 else (0, len(text)) for start, end in encoding.offsets]
            results.append((list(encoding.ids), spans))
        return results

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self._decoder.decode(self.convert_ids_to_tokens(self._skip_special(ids, skip_special_tokens)))

    @property
    def is_continuation(self) -> np.ndarray:
        if self._is_continuation is None:
            self._is_continuation = np.array([word.startswith("##") for word in self._words], dtype=bool)
        return self._is_continuation.copy()

    def _save_vocab(self, directory: str) -> str:
        _write_bytes(fileio.join(directory, WORDPIECE_VOCAB_FILE),
                     "".join(w + "\n" for w in self._words).encode("utf-8"))
        return WORDPIECE_VOCAB_FILE


# SentencePiece.

# Pieces that start a word even without the "▁" prefix: single ASCII punctuation (WordPiece always splits it off
# as its own word, so whole-word masking treats both kinds alike), as ALBERT's whole-word masking also does.
_PUNCTUATION = frozenset('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~')


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (unigram or BPE). Lower-casing, when asked for, is Python's str.lower() on the input,
    applied the same way at training and at encoding, on top of the model's own normalization."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, *, do_lower_case: bool = False, source: str = "<spm model>"):
        self._model_proto = bytes(model_proto)
        self._payload, self._source = self._model_proto, source
        self.do_lower_case = bool(do_lower_case)
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=self._model_proto)
        except Exception as error:  # the C++ side raises a bare RuntimeError without the file name
            raise ValueError(f"{source}: not a readable SentencePiece model ({error}). Fix: pass a .model file "
                             "written by sentencepiece, or a WordPiece vocab.txt") from None
        self.vocab_size = self._sp.get_piece_size()
        self._words = [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
        # Models from elsewhere (ALBERT, T5-style) may call padding "<pad>"; their declared pad/unk ids win.
        found = {"[PAD]": self._sp.pad_id() if self._sp.pad_id() >= 0 else self._piece_id("[PAD]"),
                 "[UNK]": self._sp.unk_id()}
        for token in SPECIAL_TOKENS[2:]:
            found[token] = self._piece_id(token)
        self._set_special_ids(found, "train the model with bert_jax.data.vocabulary.train_sentencepiece, or pass "
                                     "them to SentencePieceTrainer as control_symbols")
        self._is_continuation = None

    @classmethod
    def from_model_file(cls, path: str, *, do_lower_case: bool = False) -> "SentencePieceTokenizer":
        return cls(_read_bytes(path), do_lower_case=do_lower_case, source=path)

    def _piece_id(self, piece: str) -> int | None:
        # piece_to_id answers unk_id for an unknown piece, so confirm the round trip.
        piece_id = self._sp.piece_to_id(piece)
        return piece_id if self._sp.id_to_piece(piece_id) == piece else None

    def _prepare(self, text: str) -> str:
        return text.lower() if self.do_lower_case else text

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # One switch for both kinds: a worker that turned off the Rust pool wants no C++ pool either.
        parallel = os.environ.get("TOKENIZERS_PARALLELISM", "").lower() not in ("false", "0", "off", "no")
        return self._sp.encode([self._prepare(text) for text in texts], out_type=int,
                               num_threads=-1 if parallel else 1)

    def tokenize(self, text: str) -> list[str]:
        return self._sp.encode(self._prepare(text), out_type=str)

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self._sp.piece_to_id(token) for token in tokens]

    def encode_with_spans(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]] | None]]:
        # Byte offsets of the (lower-cased) text, mapped to characters; a piece without surface (the word-start "▁"
        # alone) takes the span of the piece after it.
        results = []
        for text in texts:
            prepared = self._prepare(text)
            proto = self._sp.encode(prepared, out_type="proto")
            ids = [piece.id for piece in proto.pieces]
            origin = [index for index, char in enumerate(text) for _ in self._prepare(char)]
            if len(origin) != len(prepared):
                results.append((ids, None))
                continue
            char_of_byte = [origin[index] for index, char in enumerate(prepared)
                            for _ in char.encode("utf-8")] + [len(text)]
            spans = [(char_of_byte[piece.begin], char_of_byte[piece.end - 1] + 1 if piece.end > piece.begin
                      else char_of_byte[piece.begin]) for piece in proto.pieces]
            for index in range(len(spans) - 2, -1, -1):
                if spans[index][0] == spans[index][1]:
                    spans[index] = spans[index + 1]
            results.append((ids, spans))
        return results

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self._sp.decode(self._skip_special(ids, skip_special_tokens))

    @property
    def is_continuation(self) -> np.ndarray:
        if self._is_continuation is None:
            # Only NORMAL pieces can continue a word; the processor has no is_user_defined(), so read the types.
            proto = sentencepiece_model_pb2.ModelProto()
            proto.ParseFromString(self._model_proto)
            normal = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
            self._is_continuation = np.array([
                piece.type == normal and not piece.piece.startswith("\u2581") and piece.piece not in _PUNCTUATION
                for piece in proto.pieces], dtype=bool)
        return self._is_continuation.copy()

    def _save_vocab(self, directory: str) -> str:
        _write_bytes(fileio.join(directory, SENTENCEPIECE_MODEL_FILE), self._model_proto)
        return SENTENCEPIECE_MODEL_FILE


# A HuggingFace tokenizer.json.
#
# Checkpoints trained elsewhere come with their tokenizer as `tokenizers`' own file (ModernBERT's is a byte-level BPE
# with BERT's special tokens and 83 unused entries, 50,368 in all). `tokenizers` runs it as transformers' fast
# tokenizers do; the post-processor's [CLS]/[SEP] are left out, as for the other kinds.

# The five special tokens, in the spellings BERT-style and RoBERTa-style vocabularies give them.
_JSON_SPECIAL_SPELLINGS = {"[PAD]": ("[PAD]", "<pad>"), "[UNK]": ("[UNK]", "<unk>"), "[CLS]": ("[CLS]", "<s>"),
                           "[SEP]": ("[SEP]", "</s>"), "[MASK]": ("[MASK]", "<mask>")}
# Characters that start a word in byte-level BPE (a space, a newline) and SentencePiece-style models.
_WORD_START_MARKS = ("\u0120", "\u010a", "\u2581")


class TokenizerJson(Tokenizer):
    """A `tokenizers` tokenizer.json (any model: BPE, WordPiece, Unigram), for fine-tuning and pretraining from a
    checkpoint that comes with one; bert_jax trains WordPiece and SentencePiece only. Its own normaliser decides the
    case: `do_lower_case` is recorded, never applied. A word is encoded alone as transformers encodes words split
    beforehand (is_split_into_words): a byte-level BPE without add_prefix_space gives it no leading space."""

    kind = "tokenizer_json"

    def __init__(self, payload: str, *, do_lower_case: bool = False, source: str = "<tokenizer.json>"):
        from tokenizers import Tokenizer as Backend  # pylint: disable=import-outside-toplevel
        self._payload, self._source, self.do_lower_case = payload, source, do_lower_case
        try:
            self._backend = Backend.from_str(payload)
        except Exception as error:  # pylint: disable=broad-except  # tokenizers raises its own Exception type
            raise ValueError(f"{source}: not a tokenizers tokenizer.json ({error})") from None
        vocab = self._backend.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        self._words = [""] * self.vocab_size
        for word, index in vocab.items():
            self._words[index] = word
        self._set_special_ids({token: next((vocab[s] for s in spellings if s in vocab), None)
                               for token, spellings in _JSON_SPECIAL_SPELLINGS.items()},
                              "a tokenizer.json whose vocabulary has them")
        self._continuation_prefix = json.loads(payload).get("model", {}).get("continuing_subword_prefix")

    @classmethod
    def from_file(cls, path: str, *, do_lower_case: bool = False) -> "TokenizerJson":
        return cls(_read_bytes(path).decode("utf-8"), do_lower_case=do_lower_case, source=path)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def tokenize(self, text: str) -> list[str]:
        return self._backend.encode(text, add_special_tokens=False).tokens

    def encode_with_spans(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]] | None]]:
        encodings = self._backend.encode_batch(list(texts), add_special_tokens=False)
        return [(encoding.ids, [tuple(offset) for offset in encoding.offsets]) for encoding in encodings]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        ids = (self._backend.token_to_id(token) for token in tokens)
        return [self.unk_id if token_id is None else token_id for token_id in ids]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self._backend.decode(self._skip_special(ids, skip_special_tokens), skip_special_tokens=False)

    @property
    def is_continuation(self) -> np.ndarray:
        special = set(self.special_ids.values())
        if self._continuation_prefix:  # WordPiece: "##" marks a continuation
            flags = [word.startswith(self._continuation_prefix) for word in self._words]
        else:  # BPE, Unigram: a piece continues the word unless it starts one (or is punctuation)
            flags = [bool(word) and not word.startswith(_WORD_START_MARKS) and word not in _PUNCTUATION
                     for word in self._words]
        return np.array([flag and index not in special for index, flag in enumerate(flags)], dtype=bool)

    def _save_vocab(self, directory: str) -> str:
        _write_bytes(fileio.join(directory, TOKENIZER_JSON_FILE), self._payload.encode("utf-8"))
        return TOKENIZER_JSON_FILE


# Loading.

# Directories not written by save(): a Google BERT checkpoint or a HuggingFace model directory.
_FOREIGN_VOCAB_FILES = (("wordpiece", "vocab.txt"), ("sentencepiece", "spm.model"),
                        ("sentencepiece", "spiece.model"), ("sentencepiece", "sentencepiece.model"),
                        ("tokenizer_json", "tokenizer.json"))
_KINDS = {"wordpiece": WORDPIECE_VOCAB_FILE, "sentencepiece": SENTENCEPIECE_MODEL_FILE,
          "tokenizer_json": TOKENIZER_JSON_FILE}  # kind -> the file save() writes


def load_tokenizer(path: str, *, do_lower_case: bool | None = None) -> Tokenizer:
    """Loads a WordPiece vocab.txt, a SentencePiece .model, a HuggingFace tokenizer.json, or a directory written by
    Tokenizer.save() (or a HuggingFace model directory: its vocab.txt, else its tokenizer.json).

    `do_lower_case=None` takes the saved setting, else True for a vocab.txt and False for a .model. Local paths
    and gs:// both work; the tokenizer is cheap to build, so load it once per worker process after the fork.
    """
    path = os.fspath(path)
    if not fileio.exists(path):
        raise FileNotFoundError(f"tokenizer path {path!r} does not exist. Fix: pass a WordPiece vocab.txt, a "
                                "SentencePiece .model file, or a directory written by Tokenizer.save()")
    if fileio.isdir(path):
        return _load_directory(path, do_lower_case)
    kind = ("sentencepiece" if path.endswith(".model") else
            "tokenizer_json" if path.endswith(".json") else "wordpiece")
    return _load_file(path, kind, do_lower_case)


def _load_file(path: str, kind: str, do_lower_case: bool | None) -> Tokenizer:
    if kind == "wordpiece":
        return WordPieceTokenizer.from_vocab_file(path, do_lower_case=True if do_lower_case is None else do_lower_case)
    if kind == "tokenizer_json":
        return TokenizerJson.from_file(path, do_lower_case=bool(do_lower_case))
    return SentencePieceTokenizer.from_model_file(path, do_lower_case=bool(do_lower_case))


def _load_directory(directory: str, do_lower_case: bool | None) -> Tokenizer:
    config_path = fileio.join(directory, CONFIG_FILE)
    config = {}
    if fileio.exists(config_path):
        try:
            config = json.loads(_read_bytes(config_path).decode("utf-8"))
        except ValueError as error:
            raise ValueError(f"{config_path}: not valid JSON ({error}). Fix: re-save the tokenizer") from None
    if do_lower_case is None and "do_lower_case" in config:
        do_lower_case = bool(config["do_lower_case"])
    if "kind" not in config:
        # HuggingFace also writes a tokenizer_config.json (with do_lower_case but no "kind"); use its vocab file.
        for kind, name in _FOREIGN_VOCAB_FILES:
            if fileio.exists(fileio.join(directory, name)):
                return _load_file(fileio.join(directory, name), kind, do_lower_case)
        raise FileNotFoundError(f"{directory}: no {CONFIG_FILE} with a 'kind' field and no vocabulary file "
                                f"({', '.join(name for _, name in _FOREIGN_VOCAB_FILES)}). Fix: point at a "
                                "directory written by Tokenizer.save(), or at the vocab file itself")
    kind = config["kind"]
    if kind not in _KINDS:
        raise ValueError(f"{config_path}: field 'kind' is {kind!r}; expected one of {sorted(_KINDS)}")
    default_file = _KINDS[kind]
    vocab_path = fileio.join(directory, config.get("vocab_file") or default_file)
    if not fileio.exists(vocab_path):
        raise FileNotFoundError(f"{config_path}: its vocab_file {vocab_path!r} does not exist. Fix: copy the "
                                "whole directory written by Tokenizer.save()")
    tokenizer = _load_file(vocab_path, kind, do_lower_case)
    stale = [field for field in _SPECIAL_ID_FIELDS
             if field in config and config[field] != getattr(tokenizer, field)]
    if stale:
        raise ValueError(f"{config_path}: {', '.join(stale)} disagree with {vocab_path} (config "
                         f"{ {f: config[f] for f in stale} }, vocab { {f: getattr(tokenizer, f) for f in stale} }). "
                         "Fix: the vocab file was replaced; re-save the tokenizer so data and model agree")
    return tokenizer
