"""Pretraining instances on token ids: the original BERT algorithm, and MLM-only rows.

Sentence pairs from documents (`create_instances_from_document`), the masked-LM draw
(`create_masked_lm_predictions`) and `truncate_seq_pair` consume a `random.Random` in exactly the order of
google-research/bert's create_pretraining_data.py, so the same seed gives the same instances. Their encoding as
records is bert_jax.data.tfrecord's; orchestration over a corpus lives in bert_jax.data.create.

For masked-LM-only encoders (no NSP), `create_rows` and `create_fragments` fill sequences with contiguous text
instead, with no pairs and no label (next_sentence_label None):
  * rows: a chunk's documents joined by [SEP] into one stream, cut into rows of [CLS] + max_seq_length-2 tokens +
    [SEP]; only the stream's last row is short. A row may span documents (as ModernBERT's concatenated rows).
  * fragments: each document cut alone into pieces of max_seq_length-2 tokens, [CLS] piece [SEP]; only a
    document's last piece is short. Meant to be packed when read (data.pack), which gives each piece its own
    attention and positions.
"""

from __future__ import annotations

import itertools
import random
from typing import Callable, NamedTuple, Sequence


# What create's `instances` option makes: the original's sentence pairs, or MLM-only rows or fragments (below).
INSTANCE_KINDS = ("pairs", "rows", "fragments")


class TrainingInstance(NamedTuple):
    """One sentence pair as ids: [CLS] A [SEP] B [SEP], after masking (if any)."""

    input_ids: list[int]
    segment_ids: list[int]  # 0 for [CLS] A [SEP], 1 for B [SEP]
    masked_lm_positions: list[int] | None  # ascending; None when not masked (masking="none")
    masked_lm_ids: list[int] | None  # the original ids at those positions
    next_sentence_label: int | None  # NSP: 1 = B is from a random document; SOP: 1 = A and B swapped; None: no pair


# ---------------------------------------------------------------------------------------------------------------
# The original algorithm, on ids. Each function draws from `rng` exactly as its original counterpart does.


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trims the longer of the two lists (front or back, at random) until both fit; in place."""
    lengths = [len(tokens_a), len(tokens_b)]
    cuts = [0, 0, 0, 0]  # front of A, back of A, front of B, back of B
    draw = rng.random
    # Counting first and slicing once gives the same result as deleting one token per draw, without the
    # quadratic cost of repeated `del tokens[0]` on a very long sentence.
    while lengths[0] + lengths[1] > max_num_tokens:
        side = 0 if lengths[0] > lengths[1] else 1
        cuts[2 * side + (draw() >= 0.5)] += 1
        lengths[side] -= 1
    for side, tokens in enumerate((tokens_a, tokens_b)):
        if lengths[side] < len(tokens):
            tokens[:] = tokens[cuts[2 * side]:cuts[2 * side] + lengths[side]]


# Bit lengths of small ints, looked up instead of calling int.bit_length in the innermost loop.
_BIT_LENGTHS = [n.bit_length() for n in range(1 << 12)]


def _randbelow(getrandbits, n: int) -> int:
    # random.Random._randbelow_with_getrandbits: the draw behind randint, randrange and shuffle.
    k = _BIT_LENGTHS[n] if n < len(_BIT_LENGTHS) else n.bit_length()
    value = getrandbits(k)
    while value >= n:
        value = getrandbits(k)
    return value


def shuffle(items: list, rng: random.Random) -> None:
    """random.Random.shuffle, same draws and same result, at twice the speed: it is the largest single cost here."""
    getrandbits = rng.getrandbits
    bit_lengths = _BIT_LENGTHS
    if len(items) >= len(bit_lengths):
        rng.shuffle(items)
        return
    for i in range(len(items) - 1, 0, -1):
        n = i + 1
        k = bit_lengths[n]
        j = getrandbits(k)
        while j >= n:
            j = getrandbits(k)
        items[i], items[j] = items[j], items[i]


def _same_as_random_module() -> bool:
    # random's internals are no documented interface: should another Python draw differently, use its own shuffle.
    ours, theirs = random.Random(1), random.Random(1)
    for size in (0, 1, 2, 3, 17, 128, 1000):
        items, expected = list(range(size)), list(range(size))
        shuffle(items, ours)
        theirs.shuffle(expected)
        if items != expected or _randbelow(ours.getrandbits, 30522 + size) != theirs.randint(0, 30521 + size):
            return False
    return ours.getstate() == theirs.getstate()


if not _same_as_random_module():
    shuffle = lambda items, rng: rng.shuffle(items)  # noqa: E731
    _randbelow = lambda getrandbits, n: getrandbits.__self__.randrange(n)  # noqa: E731


def create_masked_lm_predictions(input_ids: Sequence[int], rng: random.Random, *, masked_lm_prob: float,
                                 max_predictions_per_seq: int, vocab_size: int, cls_id: int, sep_id: int,
                                 mask_id: int, is_continuation: Sequence[bool] | None = None
                                 ) -> tuple[list[int], list[int], list[int]]:
    """BERT's 80/10/10 masking -> (masked input ids, ascending positions, original ids at those positions).

    `is_continuation[id]` (e.g. "##" WordPieces) turns on whole-word masking: a continuation joins the group of the
    candidate before it, and groups are masked whole. The random replacement is an id uniform in [0, vocab_size).
    """
    output_ids = list(input_ids)
    length = len(output_ids)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(length * masked_lm_prob))))
    if is_continuation is None:
        if (output_ids[0] == cls_id and output_ids[-1] == sep_id and output_ids.count(cls_id) == 1
                and output_ids.count(sep_id) == 2):
            # The usual [CLS] A [SEP] B [SEP]: the candidates are ranges, no per-token test needed.
            first_sep = output_ids.index(sep_id)
            candidates = [*range(1, first_sep), *range(first_sep + 1, length - 1)]
        else:
            candidates = [index for index, token in enumerate(output_ids) if token != cls_id and token != sep_id]
        # Shuffling indexes instead of one-element groups draws the same numbers: shuffle depends on length only.
        shuffle(candidates, rng)
        chosen = candidates[:num_to_predict]
    else:
        groups = []
        for index, token in enumerate(output_ids):
            if token == cls_id or token == sep_id:
                continue
            if groups and is_continuation[token]:
                groups[-1].append(index)
            else:
                groups.append([index])
        shuffle(groups, rng)
        chosen = []
        for group in groups:
            if len(chosen) >= num_to_predict:
                break
            if len(chosen) + len(group) > num_to_predict:
                continue
            chosen.extend(group)

    draw, getrandbits = rng.random, rng.getrandbits
    for index in chosen:  # in shuffled order: that is the order the original draws in
        if draw() < 0.8:
            output_ids[index] = mask_id
        elif draw() >= 0.5:
            output_ids[index] = _randbelow(getrandbits, vocab_size)  # = rng.randint(0, vocab_size - 1)
    chosen.sort()
    return output_ids, chosen, [input_ids[index] for index in chosen]


def create_instances_from_document(all_documents: Sequence[Sequence[Sequence[int]]], document_index: int,
                                   rng: random.Random, *, max_seq_length: int, short_seq_prob: float, cls_id: int,
                                   sep_id: int, sentence_order_prediction: bool = False,
                                   mask_fn: Callable | None = None) -> list[TrainingInstance]:
    """Sentence-pair instances from one document (a list of non-empty sentences of token ids).

    `mask_fn(input_ids, rng) -> (masked ids, positions, labels)` masks each instance as soon as it is made, as the
    original does (the draws interleave); None leaves instances unmasked.
    """
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    # Mostly fill the sequence; sometimes aim shorter to resemble fine-tuning inputs.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            # Segments A and B end at sentence boundaries, so that NSP cannot be solved by a cut mid-sentence.
            a_end = 1
            if len(current_chunk) >= 2:
                a_end = rng.randint(1, len(current_chunk) - 1)
            tokens_a = list(itertools.chain.from_iterable(current_chunk[:a_end]))
            if sentence_order_prediction:
                if len(current_chunk) == 1:
                    if len(tokens_a) < 2:
                        current_chunk, current_length = [], 0
                        i += 1
                        continue
                    cut = rng.randint(1, len(tokens_a) - 1)
                    tokens_a, tokens_b = tokens_a[:cut], tokens_a[cut:]
                else:
                    tokens_b = list(itertools.chain.from_iterable(current_chunk[a_end:]))
                label = int(rng.random() < 0.5)
                if label:
                    tokens_a, tokens_b = tokens_b, tokens_a
            elif len(current_chunk) == 1 or rng.random() < 0.5:
                label = 1
                tokens_b = _random_next_segment(all_documents, document_index, target_seq_length - len(tokens_a), rng)
                # The segments after A were not used: go back so that they start the next chunk.
                i -= len(current_chunk) - a_end
            else:
                label = 0
                tokens_b = list(itertools.chain.from_iterable(current_chunk[a_end:]))
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

            instances.append(_make_instance(tokens_a, tokens_b, label, rng, cls_id=cls_id, sep_id=sep_id,
                                            mask_fn=mask_fn))
            current_chunk, current_length = [], 0
        i += 1
    return instances


def _random_next_segment(all_documents: Sequence[Sequence[Sequence[int]]], document_index: int,
                         target_b_length: int, rng: random.Random) -> list[int]:
    """NSP's "random next" segment B: sentences of another document, from a random one on, up to the target."""
    # Ten tries at a different document; a one-document chunk ends up pairing with itself.
    for _ in range(10):
        random_document_index = rng.randint(0, len(all_documents) - 1)
        if random_document_index != document_index:
            break
    random_document = all_documents[random_document_index]
    tokens_b = []
    for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
        tokens_b.extend(random_document[j])
        if len(tokens_b) >= target_b_length:
            break
    return tokens_b


def _make_instance(tokens_a: list[int], tokens_b: list[int], label: int, rng: random.Random, *, cls_id: int,
                   sep_id: int, mask_fn: Callable | None) -> TrainingInstance:
    """[CLS] A [SEP] B [SEP] as an instance, masked by `mask_fn` (drawing from `rng`) unless it is None."""
    input_ids = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    return _masked(input_ids, segment_ids, label, rng, mask_fn)


def _masked(input_ids: list[int], segment_ids: list[int], label: int | None, rng: random.Random,
            mask_fn: Callable | None) -> TrainingInstance:
    """The instance of these ids, masked by `mask_fn` (drawing from `rng`) unless it is None."""
    if mask_fn is None:
        return TrainingInstance(input_ids, segment_ids, None, None, label)
    masked_ids, positions, labels = mask_fn(input_ids, rng)
    return TrainingInstance(masked_ids, segment_ids, positions, labels, label)


# ---------------------------------------------------------------------------------------------------------------
# MLM-only instances: contiguous text, no pairs. A pass after the first (dupe_factor) starts its cuts at a random
# offset, so that its rows are not the first pass's again (their masks differ anyway).


def _mlm_instance(tokens: list[int], rng: random.Random, *, cls_id: int, sep_id: int,
                  mask_fn: Callable | None) -> TrainingInstance:
    input_ids = [cls_id, *tokens, sep_id]
    return _masked(input_ids, [0] * len(input_ids), None, rng, mask_fn)


def create_rows(all_documents: Sequence[Sequence[Sequence[int]]], rng: random.Random, *, max_seq_length: int,
                cls_id: int, sep_id: int, first_pass: bool = True,
                mask_fn: Callable | None = None) -> list[TrainingInstance]:
    """Full rows of the documents, in their order, joined by [SEP] and cut every max_seq_length-2 tokens.

    After the first pass the documents are shuffled again and the stream is rotated by a random offset (its head
    goes to its end, after a [SEP]), so rows start elsewhere and no token is lost: only the last row is short.
    """
    if not first_pass:
        all_documents = list(all_documents)
        shuffle(all_documents, rng)
    stream = []
    for document in all_documents:
        if stream:
            stream.append(sep_id)
        for sentence in document:
            stream.extend(sentence)
    width = max_seq_length - 2
    if not first_pass and len(stream) > width:
        offset = rng.randrange(width)
        stream = stream[offset:] + [sep_id] + stream[:offset] if offset else stream
    return [_mlm_instance(stream[start:start + width], rng, cls_id=cls_id, sep_id=sep_id, mask_fn=mask_fn)
            for start in range(0, len(stream), width)]


def create_fragments(document: Sequence[Sequence[int]], rng: random.Random, *, max_seq_length: int, cls_id: int,
                     sep_id: int, first_pass: bool = True,
                     mask_fn: Callable | None = None) -> list[TrainingInstance]:
    """One document cut into pieces of max_seq_length-2 tokens, in order; only the last piece is short.

    After the first pass a document longer than one piece is cut from a random offset on, and the head before it
    is one more (short) piece: no token is lost, and a piece never joins the document's end to its start.
    """
    tokens = list(itertools.chain.from_iterable(document))
    width = max_seq_length - 2
    offset = rng.randrange(width) if not first_pass and len(tokens) > width else 0
    pieces = [tokens[start:start + width] for start in range(offset, len(tokens), width)]
    if offset:
        pieces.append(tokens[:offset])
    return [_mlm_instance(piece, rng, cls_id=cls_id, sep_id=sep_id, mask_fn=mask_fn) for piece in pieces]
