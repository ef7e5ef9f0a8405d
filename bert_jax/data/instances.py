"""The original BERT instance algorithm on token ids, and its tf.train.Example encoding.

Sentence pairs from documents (`create_instances_from_document`), the masked-LM draw
(`create_masked_lm_predictions`) and `truncate_seq_pair` consume a `random.Random` in exactly the order of
google-research/bert's create_pretraining_data.py, so the same seed gives the same instances. `serialize_example`
writes the original feature layout with a hand-written protobuf encoder (the protobuf classes cost more than
making the instances). Orchestration over a corpus lives in bert_jax.data.create.
"""

from __future__ import annotations

import itertools
import random
import struct
from typing import Callable, NamedTuple, Sequence

# The original's feature order (an OrderedDict): fixed here so that equal instances are equal bytes.
MASKED_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                   "masked_lm_weights", "next_sentence_labels")
UNMASKED_FEATURES = ("input_ids", "input_mask", "segment_ids", "next_sentence_labels")

class TrainingInstance(NamedTuple):
    """One sentence pair as ids: [CLS] A [SEP] B [SEP], after masking (if any)."""

    input_ids: list[int]
    segment_ids: list[int]  # 0 for [CLS] A [SEP], 1 for B [SEP]
    masked_lm_positions: list[int] | None  # ascending; None when not masked (masking="none")
    masked_lm_ids: list[int] | None  # the original ids at those positions
    next_sentence_label: int  # NSP: 1 = B is from a random document; SOP: 1 = A and B swapped


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
                target_b_length = target_seq_length - len(tokens_a)
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
                # The segments after A were not used: go back so that they start the next chunk.
                i -= len(current_chunk) - a_end
            else:
                label = 0
                tokens_b = list(itertools.chain.from_iterable(current_chunk[a_end:]))
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

            input_ids = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            if mask_fn is None:
                instances.append(TrainingInstance(input_ids, segment_ids, None, None, label))
            else:
                masked_ids, positions, labels = mask_fn(input_ids, rng)
                instances.append(TrainingInstance(masked_ids, segment_ids, positions, labels, label))
            current_chunk, current_length = [], 0
        i += 1
    return instances


# ---------------------------------------------------------------------------------------------------------------
# tf.train.Example encoding, by hand: the protobuf classes cost more than making the instances.


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 fields encode negatives as ten-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VARINTS = [_varint(value) for value in range(1 << 15)]
_FLOAT_ONE, _FLOAT_ZERO = struct.pack("<f", 1.0), struct.pack("<f", 0.0)
_INT64_LIST, _FLOAT_LIST = 0x1A, 0x12  # Feature.int64_list = 3, Feature.float_list = 2 (length-delimited)


def _entry_header(name: str, kind: int, payload_length: int) -> bytes:
    """Bytes before a packed payload: a Features.feature map entry {key, value: Feature{kind: List{value}}}."""
    # An empty repeated field is left out altogether, as protobuf does.
    list_header = b"\x0a" + _varint(payload_length) if payload_length else b""
    feature_header = bytes([kind]) + _varint(len(list_header) + payload_length) + list_header
    name_bytes = name.encode("utf-8")
    entry_header = (b"\x0a" + _varint(len(name_bytes)) + name_bytes
                    + b"\x12" + _varint(len(feature_header) + payload_length) + feature_header)
    return b"\x0a" + _varint(len(entry_header) + payload_length) + entry_header


def _int_payload(values: Sequence[int]) -> bytes:
    varints = _VARINTS
    try:
        return b"".join([varints[value] for value in values])  # a list comprehension joins faster than map here
    except (IndexError, TypeError):  # a negative or large value, or a numpy integer
        return b"".join(_varint(int(value)) for value in values)


def _small_int_payload(values: Sequence[int]) -> bytes:
    # Values below 128 (segment ids, positions) are one varint byte each: bytes() does it in C.
    try:
        payload = bytes(values)
    except (ValueError, TypeError):
        return _int_payload(values)
    return payload if payload.isascii() else _int_payload(values)


_entry_headers: dict = {}


def _entry(name: str, kind: int, payload: bytes) -> bytes:
    # A header depends only on the feature and the payload length: build each one once.
    header = _entry_headers.get((name, len(payload)))
    if header is None:
        header = _entry_headers[name, len(payload)] = _entry_header(name, kind, len(payload))
    return header + payload


def serialize_example(instance: TrainingInstance, *, max_seq_length: int, max_predictions_per_seq: int) -> bytes:
    """A tf.train.Example in the original layout and feature order, padded to the given lengths. Unmasked instances
    (positions None) get only input_ids, input_mask, segment_ids and next_sentence_labels."""
    length = len(instance.input_ids)
    pad = max_seq_length - length
    if pad < 0:
        raise ValueError(f"instance of {length} tokens is longer than max_seq_length={max_seq_length}")
    zeros = b"\x00" * pad  # varint 0
    entries = [_entry("input_ids", _INT64_LIST, _int_payload(instance.input_ids) + zeros),
               _entry("input_mask", _INT64_LIST, b"\x01" * length + zeros),
               _entry("segment_ids", _INT64_LIST, _small_int_payload(instance.segment_ids) + zeros)]
    if instance.masked_lm_positions is not None:
        count = len(instance.masked_lm_positions)
        pad = max_predictions_per_seq - count
        if pad < 0:
            raise ValueError(f"instance has {count} masked positions, more than max_predictions_per_seq="
                             f"{max_predictions_per_seq}")
        zeros = b"\x00" * pad
        positions = _small_int_payload(instance.masked_lm_positions)
        entries += [_entry("masked_lm_positions", _INT64_LIST, positions + zeros),
                    _entry("masked_lm_ids", _INT64_LIST, _int_payload(instance.masked_lm_ids) + zeros),
                    _entry("masked_lm_weights", _FLOAT_LIST, _FLOAT_ONE * count + _FLOAT_ZERO * pad)]
    entries.append(_entry("next_sentence_labels", _INT64_LIST, _VARINTS[instance.next_sentence_label]))
    body = b"".join(entries)
    return b"\x0a" + (_VARINTS[len(body)] if len(body) < len(_VARINTS) else _varint(len(body))) + body
