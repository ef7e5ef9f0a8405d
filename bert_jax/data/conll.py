"""Token classification data: CoNLL files in, WordPiece rows out, one tag per word back.

A CoNLL file holds one token per line, its tag in the last whitespace-separated column (CoNLL-2003's middle POS and
chunk columns are ignored), a blank line between sentences, and `-DOCSTART-` lines between documents (skipped).
Tags are IOB1 or IOB2; `to_iob2` makes them IOB2, the form entity-level scoring reads.

`encode` labels each word's first WordPiece and ignores the others (label IGNORE), as the BERT paper does for NER.
A sentence longer than a row is split at word boundaries into several rows, never truncated; `words_of_rows`
maps each row's labelled positions back to the words, so every input token gets a prediction.
"""

import dataclasses

import numpy as np

from bert_jax import fileio

IGNORE = -100  # the label of positions that count in neither loss nor metric ([CLS], [SEP], non-first pieces)
DOCUMENT_START = "-DOCSTART-"


@dataclasses.dataclass
class Sentence:
    words: list[str]
    tags: list[str]
    line: int  # 1-based line number of its first word, for messages


def read_conll(path: str, field: str = "data.train_file") -> list[Sentence]:
    """The sentences of a CoNLL file; a line with a token but no tag is an error naming the file and line."""
    sentences, words, tags, first = [], [], [], 0
    with fileio.open_file(path) as file:
        for number, line in enumerate(file, start=1):
            columns = line.split()
            if not columns or columns[0] == DOCUMENT_START:
                if words:
                    sentences.append(Sentence(words, tags, first))
                words, tags = [], []
                continue
            if len(columns) < 2:
                raise ValueError(f"--config.{field}={path}: line {number} ({line.strip()!r}) has no tag. Fix: each "
                                 "line is a token and its tag (its last column), a blank line between sentences")
            if not words:
                first = number
            words.append(columns[0])
            tags.append(columns[-1])
    if words:
        sentences.append(Sentence(words, tags, first))
    if not sentences:
        raise ValueError(f"--config.{field}={path} holds no sentence: expected a CoNLL file (token and tag per line)")
    return sentences


def to_iob2(tags: list[str]) -> list[str]:
    """IOB1 (I- opens an entity unless it continues one of the same type; B- only between two adjacent ones) as IOB2
    (every entity opens with B-). IOB2 tags are returned unchanged."""
    converted, previous = [], "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
        previous = tag
    return converted


@dataclasses.dataclass
class Rows:
    """Model inputs [rows, max_seq_length], with `labels` (IGNORE where nothing is scored) and, for each row, the
    sentence it comes from."""
    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    labels: np.ndarray
    sentence: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        return {"input_ids": self.input_ids, "input_mask": self.input_mask, "segment_ids": self.segment_ids}


def encode(tokenizer, sentences: list[Sentence], label_ids: dict[str, int], max_seq_length: int) -> Rows:
    """[CLS] pieces [SEP] rows; each word's first piece carries its label (label_ids[tag]). A word that tokenizes to nothing (a control character, say) becomes [UNK], so it is still tagged.
    Sentences with more pieces than a row holds continue in the next row, split between words."""
    room = max_seq_length - 2
    rows: list[tuple[list[int], list[int], int]] = []  # (ids, labels, sentence)
    for index, sentence in enumerate(sentences):
        pieces = [ids or [tokenizer.unk_id] for ids in tokenizer.encode_batch(sentence.words)]
        too_long = [word for word, ids in zip(sentence.words, pieces) if len(ids) > room]
        if too_long:
            raise ValueError(f"line {sentence.line + sentence.words.index(too_long[0])}: the word {too_long[0]!r} "
                             f"has more WordPieces than data.max_seq_length={max_seq_length} holds. Fix: a larger "
                             "--config.data.max_seq_length")
        ids, labels = [], []
        for word_ids, tag in zip(pieces, sentence.tags):
            if len(ids) + len(word_ids) > room:
                rows.append((ids, labels, index))
                ids, labels = [], []
            ids += word_ids
            labels += [label_ids[tag]] + [IGNORE] * (len(word_ids) - 1)
        rows.append((ids, labels, index))
    count = len(rows)
    input_ids = np.full((count, max_seq_length), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((count, max_seq_length), np.int32)
    label_array = np.full((count, max_seq_length), IGNORE, np.int32)
    for row, (ids, labels, _) in enumerate(rows):
        input_ids[row, :len(ids) + 2] = [tokenizer.cls_id, *ids, tokenizer.sep_id]
        input_mask[row, :len(ids) + 2] = 1
        label_array[row, 1:len(ids) + 1] = labels
    return Rows(input_ids, input_mask, np.zeros_like(input_ids), label_array,
                np.array([row[2] for row in rows], np.int64))


def words_of_rows(rows: Rows, sentences: list[Sentence], row_values: np.ndarray) -> list[list]:
    """Per sentence, one value per word: `row_values` [rows, max_seq_length] read at each word's first piece."""
    per_sentence: list[list] = [[] for _ in sentences]
    for row in range(len(rows.sentence)):
        positions = np.flatnonzero(rows.labels[row] != IGNORE)
        per_sentence[rows.sentence[row]].extend(row_values[row, positions].tolist())
    return per_sentence


def write_predictions(path: str, sentences: list[Sentence], predicted: list[list[str]]) -> None:
    """The input's layout, each line its token, the gold tag and the predicted tag (conlleval's input)."""
    with fileio.open_file(path, "w") as file:
        for sentence, tags in zip(sentences, predicted):
            for word, gold, tag in zip(sentence.words, sentence.tags, tags):
                file.write(f"{word} {gold} {tag}\n")
            file.write("\n")
