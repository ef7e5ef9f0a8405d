"""Pretraining data: corpus documents -> sentence-pair instances -> masked LM -> sharded TFRecords.

The algorithm is google-research/bert's create_pretraining_data.py, re-implemented on token ids. The corpus is
streamed in chunks of `documents_per_chunk` documents (in corpus order), and each chunk is processed exactly as the
original processes its whole input: `rng = random.Random(chunk_seed)`, shuffle the chunk's documents, then
`dupe_factor` passes creating instances document by document (masking each one as it is made), then shuffle the
chunk's instances. Every random draw happens in the original's order, so:

  * a corpus that fits in one chunk gives exactly the original tool's examples for the same seed (chunk 0 uses
    `seed` itself); the records are byte-identical up to the order of the feature-map entries, which protobuf
    leaves unspecified (the original's order changes from process to process; ours is always input_ids,
    input_mask, segment_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights, next_sentence_labels);
  * a larger corpus is the original algorithm applied per chunk. The one difference: a "random next" segment B
    for next-sentence prediction is drawn from another document of the same chunk, not of the whole corpus.

Worker processes handle chunks in parallel while the parent streams the corpus and deals records round-robin
into `num_shards` files; with at most two chunks per worker in flight, memory does not grow with the corpus. The
same seed, corpus and documents_per_chunk give the same bytes for any num_workers, the same records for any
num_shards.

Beyond the original:
  * sentence_order_prediction (ALBERT's SOP): B is always the text that really follows A; with probability 0.5
    A and B are swapped. next_sentence_labels is 1 when swapped, 0 for the original order, so "1 = not the true
    continuation" means the same as for NSP. A chunk of a single sentence is cut at a random token to get a pair.
  * masking="none": records hold only input_ids, input_mask, segment_ids and next_sentence_labels, for a
    pipeline that masks dynamically. (Skipping the masking draws changes the rng sequence, so these instances are
    not the unmasked twins of a static run.)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import multiprocessing
import os
import posixpath
import random
import struct
import sys
import time
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

from absl import logging
import tqdm

from bert_jax import corpus
from bert_jax import tokenization

MASKING_MODES = ("static", "none")
METADATA_FILE = "metadata.json"
TOKENIZER_DIR = "tokenizer"
# The original's feature order (an OrderedDict): fixed here so that equal instances are equal bytes.
MASKED_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                   "masked_lm_weights", "next_sentence_labels")
UNMASKED_FEATURES = ("input_ids", "input_mask", "segment_ids", "next_sentence_labels")


@dataclasses.dataclass
class DataOptions:
    """How instances are made; the defaults are the original tool's flag defaults."""

    max_seq_length: int = 128  # tokens per instance including [CLS] and two [SEP]s; records are padded to it
    max_predictions_per_seq: int = 20  # masked positions per instance; records are padded to it
    masked_lm_prob: float = 0.15  # share of an instance's tokens ([CLS]/[SEP] counted) that is predicted
    short_seq_prob: float = 0.1  # chance that a document aims at a random shorter length
    dupe_factor: int = 10  # passes over each chunk, each with different pairings and masks
    whole_word_mask: bool = False  # mask all pieces of a word together
    sentence_order_prediction: bool = False  # SOP (ALBERT) pairs instead of NSP's random-next pairs
    masking: str = "static"  # "static" writes masks into the records; "none" leaves masking to the input pipeline
    seed: int = 12345  # seeds chunk 0 exactly like the original's --random_seed

    def validate(self) -> "DataOptions":
        """Raises ValueError naming the first bad field (and its command-line flag)."""
        def bad(field, flag, why):
            return ValueError(f"DataOptions.{field}={getattr(self, field)!r} (--{flag}): {why}")
        if not isinstance(self.max_seq_length, int) or self.max_seq_length < 5:
            raise bad("max_seq_length", "max_seq_length", "must be an integer >= 5 ([CLS], [SEP], [SEP] and at "
                      "least one token for each of the two segments)")
        if self.masking not in MASKING_MODES:
            raise bad("masking", "masking", f"must be one of {MASKING_MODES}")
        if self.masking == "static":
            if not isinstance(self.max_predictions_per_seq, int) or self.max_predictions_per_seq < 1:
                raise bad("max_predictions_per_seq", "max_predictions_per_seq", "must be an integer >= 1")
            if not 0.0 < self.masked_lm_prob <= 1.0:
                raise bad("masked_lm_prob", "masked_lm_prob", "must be in (0, 1]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise bad("short_seq_prob", "short_seq_prob", "must be in [0, 1]")
        if not isinstance(self.dupe_factor, int) or self.dupe_factor < 1:
            raise bad("dupe_factor", "dupe_factor", "must be an integer >= 1")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise bad("seed", "random_seed", "must be an integer")
        return self


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


def _shuffle(items: list, rng: random.Random) -> None:
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
        _shuffle(items, ours)
        theirs.shuffle(expected)
        if items != expected or _randbelow(ours.getrandbits, 30522 + size) != theirs.randint(0, 30521 + size):
            return False
    return ours.getstate() == theirs.getstate()


if not _same_as_random_module():
    _shuffle = lambda items, rng: rng.shuffle(items)  # noqa: E731
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
        _shuffle(candidates, rng)
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
        _shuffle(groups, rng)
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


# ---------------------------------------------------------------------------------------------------------------
# Chunks: the unit of work, run in worker processes (or in-process with num_workers=0).


def chunk_seed(seed: int, chunk_index: int) -> int | str:
    """Chunk 0 uses the seed itself (so a one-chunk corpus matches the original); the others a string, which
    random.Random hashes with SHA-512: the same on every run, platform and Python version."""
    return seed if chunk_index == 0 else f"{seed}:{chunk_index}"


class ChunkProcessor:
    """Turns one chunk of documents (lists of sentence strings) into serialized, shuffled records."""

    def __init__(self, tokenizer: tokenization.Tokenizer, options: DataOptions):
        self.tokenizer = tokenizer
        self.options = options
        self.mask_fn = None
        if options.masking == "static":
            mask_kwargs = dict(
                masked_lm_prob=options.masked_lm_prob, max_predictions_per_seq=options.max_predictions_per_seq,
                vocab_size=tokenizer.vocab_size, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
                mask_id=tokenizer.mask_id,
                # A list of bools indexes faster than a numpy array in the per-token loop.
                is_continuation=tokenizer.is_continuation.tolist() if options.whole_word_mask else None)
            self.mask_fn = lambda input_ids, rng: create_masked_lm_predictions(input_ids, rng, **mask_kwargs)

    def tokenize(self, documents: Sequence[Sequence[str]]) -> list[list[list[int]]]:
        """Ids per sentence in one batch call; sentences without tokens and then empty documents are dropped."""
        sentence_ids = self.tokenizer.encode_batch([sentence for document in documents for sentence in document])
        tokenized, start = [], 0
        for document in documents:
            sentences = [ids for ids in sentence_ids[start:start + len(document)] if ids]
            start += len(document)
            if sentences:
                tokenized.append(sentences)
        return tokenized

    def __call__(self, task: tuple[int, Sequence[Sequence[str]]]) -> tuple[list[bytes], dict]:
        chunk_index, documents = task
        options = self.options
        all_documents = self.tokenize(documents)
        rng = random.Random(chunk_seed(options.seed, chunk_index))
        _shuffle(all_documents, rng)
        records = []
        encode = functools.partial(serialize_example, max_seq_length=options.max_seq_length,
                                   max_predictions_per_seq=options.max_predictions_per_seq)
        instances = tokens = predictions = random_next = 0
        for _ in range(options.dupe_factor):
            for document_index in range(len(all_documents)):
                for instance in create_instances_from_document(
                        all_documents, document_index, rng, max_seq_length=options.max_seq_length,
                        short_seq_prob=options.short_seq_prob, cls_id=self.tokenizer.cls_id,
                        sep_id=self.tokenizer.sep_id, sentence_order_prediction=options.sentence_order_prediction,
                        mask_fn=self.mask_fn):
                    records.append(encode(instance))
                    instances += 1
                    tokens += len(instance.input_ids)
                    random_next += instance.next_sentence_label
                    if instance.masked_lm_positions is not None:
                        predictions += len(instance.masked_lm_positions)
        # The shuffle depends on the count only, so shuffling the bytes matches the original shuffling instances.
        _shuffle(records, rng)
        stats = {"corpus_documents": len(documents), "documents": len(all_documents),
                 "sentences": sum(len(document) for document in all_documents), "instances": instances,
                 "tokens": tokens, "predictions": predictions, "random_next": random_next}
        return records, stats


_worker_processor: ChunkProcessor | None = None
_worker_error: BaseException | None = None


def _init_worker(tokenizer: tokenization.Tokenizer, options: DataOptions) -> None:
    # Each worker is one process on one core: the tokenizer's own thread pool would only oversubscribe the machine.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _worker_processor, _worker_error
    try:
        _worker_processor = ChunkProcessor(tokenizer, options)  # the tokenizer was rebuilt when unpickled
    except BaseException as error:  # pylint: disable=broad-except
        # Raised from an initializer, it would make the pool restart workers forever; a task reports it instead.
        _worker_error = error


def _run_in_worker(task):
    if _worker_error is not None:
        raise RuntimeError(f"pretraining-data worker failed to start: {_worker_error!r}") from _worker_error
    return _worker_processor(task)


def _chunks(documents: Iterable[list[str]], documents_per_chunk: int) -> Iterator[tuple[int, list[list[str]]]]:
    chunk = []
    chunk_index = 0
    for document in documents:
        chunk.append(document)
        if len(chunk) == documents_per_chunk:
            yield chunk_index, chunk
            chunk_index += 1
            chunk = []
    if chunk:
        yield chunk_index, chunk


def _ordered_bounded_map(pool, function, tasks: Iterable, max_in_flight: int) -> Iterator:
    """Like pool.imap, in order, but never reads more than `max_in_flight` tasks ahead: Pool.imap would pull the
    whole input iterator (the corpus) into its queue as fast as it can be read."""
    pending = collections.deque()
    for task in tasks:
        pending.append(pool.apply_async(function, (task,)))
        if len(pending) >= max_in_flight:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


# ---------------------------------------------------------------------------------------------------------------
# The driver: stream chunks through the workers, write shards, describe the result.


def _join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if "://" in directory else os.path.join(directory, name)


def shard_paths(output_dir: str, prefix: str, num_shards: int) -> list[str]:
    return [_join(output_dir, f"{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord") for index in range(num_shards)]


def metadata_path(output_dir: str, prefix: str = "train") -> str:
    """metadata.json for the default prefix; `{prefix}.metadata.json` for others (e.g. an eval split beside it)."""
    return _join(output_dir, METADATA_FILE if prefix == "train" else f"{prefix}.{METADATA_FILE}")


def _check_arguments(num_shards, num_workers, documents_per_chunk, prefix) -> None:
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards={num_shards!r} (--num_shards): must be an integer >= 1")
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers={num_workers!r} (--num_workers): must be >= 0 (0 = in this process)")
    if not isinstance(documents_per_chunk, int) or documents_per_chunk < 1:
        raise ValueError(f"documents_per_chunk={documents_per_chunk!r} (--documents_per_chunk): must be >= 1")
    if not prefix or "/" in prefix or prefix.startswith("."):
        raise ValueError(f"prefix={prefix!r} (--prefix): must be a plain file-name prefix such as 'train'")


def create_pretraining_data(source: str, tokenizer_path: str, output_dir: str, options: DataOptions, *,
                            num_shards: int = 1, num_workers: int | None = None, documents_per_chunk: int = 2000,
                            text_format: str = "lines", prefix: str = "train", progress: bool = True,
                            overwrite: bool = False, do_lower_case: bool | None = None,
                            document_filter: Callable[[int], bool] | None = None) -> dict:
    """Writes `{output_dir}/{prefix}-IIIII-of-NNNNN.tfrecord`, the tokenizer and metadata.json; returns the metadata.

    source: see corpus.iter_documents. tokenizer_path: see tokenization.load_tokenizer (`do_lower_case` is passed
    on). num_workers: processes (default: all cores; 0 = this process). Shards already in output_dir with the
    same prefix are an error unless `overwrite`. `document_filter(index)` keeps the corpus document with that
    0-based index when true, e.g. to hold every n-th document out for evaluation.
    """
    started = time.perf_counter()
    options.validate()
    num_workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    _check_arguments(num_shards, num_workers, documents_per_chunk, prefix)
    tokenizer = tokenization.load_tokenizer(tokenizer_path, do_lower_case=do_lower_case)

    pool = None
    if num_workers > 0:
        # Not fork: TensorFlow and the tokenizers' thread pools do not survive it. Started before TensorFlow is
        # imported below, so the workers' start-up overlaps that import.
        context = multiprocessing.get_context("spawn")
        pool = context.Pool(num_workers, initializer=_init_worker, initargs=(tokenizer, options))
    try:
        return _create(source, tokenizer, output_dir, options, pool, started, num_shards=num_shards,
                       num_workers=num_workers, documents_per_chunk=documents_per_chunk, text_format=text_format,
                       prefix=prefix, progress=progress, overwrite=overwrite, document_filter=document_filter)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()


def _create(source, tokenizer, output_dir, options, pool, started, *, num_shards, num_workers, documents_per_chunk,
            text_format, prefix, progress, overwrite, document_filter) -> dict:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (seconds to import; workers don't need it)

    existing = sorted(tf.io.gfile.glob(_join(output_dir, f"{prefix}-*-of-*.tfrecord")))
    if existing and not overwrite:
        raise FileExistsError(f"{output_dir} already holds {len(existing)} '{prefix}' shard(s) (e.g. "
                              f"{existing[0]}); refusing to mix or replace data. Fix: choose another output_dir or "
                              "prefix, or pass overwrite=True (--overwrite) to replace them")
    tf.io.gfile.makedirs(output_dir)
    final_paths = shard_paths(output_dir, prefix, num_shards)
    # Written under hidden names and renamed only after success, so a failed run leaves no file that looks whole.
    temporary_paths = [_join(output_dir, f".{posixpath.basename(path)}.incomplete") for path in final_paths]
    writers = [tf.io.TFRecordWriter(path) for path in temporary_paths]

    corpus_stats = corpus.CorpusStats()
    totals = collections.Counter()
    try:
        documents = corpus.iter_documents(source, text_format=text_format, stats=corpus_stats)
        if document_filter is not None:
            documents = (document for index, document in enumerate(documents) if document_filter(index))
        tasks = _chunks(documents, documents_per_chunk)
        if pool is None:
            results = map(ChunkProcessor(tokenizer, options), tasks)
        else:
            # Two chunks per worker keep every worker busy while the parent writes, and bound memory.
            results = _ordered_bounded_map(pool, _run_in_worker, tasks, 2 * num_workers)
        next_writer = 0
        with tqdm.tqdm(unit=" docs", desc="documents", file=sys.stderr, dynamic_ncols=True,
                       disable=not (progress and sys.stderr.isatty())) as bar:
            for records, chunk_stats in results:
                for offset in range(num_shards):
                    write = writers[(next_writer + offset) % num_shards].write
                    for record in records[offset::num_shards]:
                        write(record)
                next_writer = (next_writer + len(records)) % num_shards
                totals.update(chunk_stats)
                totals["chunks"] += 1
                bar.update(chunk_stats["corpus_documents"])
                bar.set_postfix(instances=totals["instances"], refresh=False)
        for writer in writers:
            writer.close()
        if not totals["documents"]:
            raise ValueError(f"corpus {source!r}: no document has a sentence with any token under this tokenizer "
                             f"({corpus_stats.documents} documents read). Fix: check the source and text_format")
        if not totals["instances"]:
            raise ValueError(f"corpus {source!r}: no instance could be made from {totals['documents']} documents "
                             "(each needs at least two tokens for sentence_order_prediction). Fix: use more text")
        for stale in set(existing) - set(final_paths):
            tf.io.gfile.remove(stale)
        for temporary, final in zip(temporary_paths, final_paths):
            tf.io.gfile.rename(temporary, final, overwrite=True)
    except BaseException:
        for writer in writers:
            writer.close()
        for path in temporary_paths:
            if tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
        raise

    tokenizer.save(_join(output_dir, TOKENIZER_DIR))
    elapsed = time.perf_counter() - started
    static = options.masking == "static"
    metadata = {
        "format": "masked" if static else "unmasked",
        "features": list(MASKED_FEATURES if static else UNMASKED_FEATURES),
        **{field: value for field, value in dataclasses.asdict(options).items() if field != "masking"},
        "next_sentence_labels": ("0 = original order, 1 = A and B swapped" if options.sentence_order_prediction
                                 else "0 = B follows A, 1 = B is from a random document"),
        "num_shards": num_shards, "documents_per_chunk": documents_per_chunk, "source": source,
        "text_format": text_format, "prefix": prefix, "files": [posixpath.basename(path) for path in final_paths],
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                      "do_lower_case": tokenizer.do_lower_case, **tokenizer.special_ids, "directory": TOKENIZER_DIR},
        "stats": {
            "files": corpus_stats.files, "skipped_lines": corpus_stats.skipped_lines,
            "characters": corpus_stats.characters,
            **{key: totals[key] for key in ("documents", "sentences", "chunks", "instances", "tokens", "predictions")},
            # Predictions per real token ([CLS] and [SEP] included, as in the original's count).
            "masked_fraction": totals["predictions"] / totals["tokens"],
            "nsp_random_fraction": totals["random_next"] / totals["instances"],  # the share of label 1
            "elapsed_s": round(elapsed, 3), "instances_per_s": round(totals["instances"] / elapsed, 1),
        },
    }
    with tf.io.gfile.GFile(metadata_path(output_dir, prefix), "w") as stream:
        stream.write(json.dumps(metadata, indent=2) + "\n")
    stats = metadata["stats"]
    logging.info("wrote %d instances from %d documents (%d sentences, %d non-UTF-8 lines skipped) into %d shard(s) "
                 "in %s: %.1f s, %.0f instances/s, masked %.2f%% of tokens, label 1 in %.1f%%", stats["instances"],
                 stats["documents"], stats["sentences"], stats["skipped_lines"], num_shards, output_dir,
                 stats["elapsed_s"], stats["instances_per_s"], 100 * stats["masked_fraction"],
                 100 * stats["nsp_random_fraction"])
    return metadata


# ---------------------------------------------------------------------------------------------------------------
# Command line: the original tool's flag names where it has them.


def _define_flags() -> None:
    # Defined only when run as a program, so importing the library adds nothing to a driver's flags.
    from absl import flags  # pylint: disable=import-outside-toplevel
    defaults = DataOptions()
    flags.DEFINE_string("input_file", None, "Corpus: comma-separated text globs (local or gs://), "
                        "'tfds:NAME[:SPLIT][:FIELD]', or 'demo'.")
    flags.DEFINE_string("output_dir", None, "Directory for the TFRecord shards, tokenizer/ and metadata.json.")
    flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt, SentencePiece .model, or a saved tokenizer dir.")
    flags.DEFINE_bool("do_lower_case", None, "Lower-case the text (default: True for vocab.txt, the saved "
                      "setting for a tokenizer directory, False for a .model).")
    flags.DEFINE_bool("do_whole_word_mask", defaults.whole_word_mask, "Mask all pieces of a word together.")
    flags.DEFINE_integer("random_seed", defaults.seed, "Random seed for data generation.")
    for name, define, about in (
            ("max_seq_length", flags.DEFINE_integer, "Maximum sequence length."),
            ("max_predictions_per_seq", flags.DEFINE_integer, "Maximum masked LM predictions per sequence."),
            ("dupe_factor", flags.DEFINE_integer, "Passes over the data, with different masks."),
            ("masked_lm_prob", flags.DEFINE_float, "Masked LM probability."),
            ("short_seq_prob", flags.DEFINE_float, "Probability of aiming at a shorter sequence."),
            ("sentence_order_prediction", flags.DEFINE_bool, "ALBERT's sentence-order labels (1 = swapped)."),
    ):
        define(name, getattr(defaults, name), about)
    flags.DEFINE_enum("masking", defaults.masking, list(MASKING_MODES),
                      "'static' writes masks; 'none' writes unmasked records for dynamic masking.")
    flags.DEFINE_integer("num_shards", 1, "Output files; records are dealt round-robin.")
    flags.DEFINE_integer("num_workers", None, "Worker processes (default: all cores; 0 = in this process).")
    flags.DEFINE_integer("documents_per_chunk", 2000, "Documents processed together (the original algorithm's "
                         "unit: NSP random segments come from the same chunk). Changing it changes the output.")
    flags.DEFINE_enum("text_format", "lines", list(corpus.TEXT_FORMATS),
                      "'lines': one sentence per line, blank line between documents; 'paragraphs': prose files.")
    flags.DEFINE_string("prefix", "train", "Shard file-name prefix.")
    flags.DEFINE_bool("overwrite", False, "Replace shards with the same prefix already in output_dir.")
    flags.DEFINE_bool("progress", True, "Show a progress bar (only on a terminal).")
    flags.mark_flags_as_required(["input_file", "output_dir", "vocab_file"])


def _main(argv) -> None:
    from absl import app, flags  # pylint: disable=import-outside-toplevel
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = flags.FLAGS
    same_names = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "short_seq_prob", "dupe_factor",
                  "sentence_order_prediction", "masking")
    options = DataOptions(whole_word_mask=values.do_whole_word_mask, seed=values.random_seed,
                          **{name: values[name].value for name in same_names})
    try:
        options.validate()
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    create_pretraining_data(values.input_file, values.vocab_file, values.output_dir, options,
                            num_shards=values.num_shards, num_workers=values.num_workers,
                            documents_per_chunk=values.documents_per_chunk, text_format=values.text_format,
                            prefix=values.prefix, progress=values.progress, overwrite=values.overwrite,
                            do_lower_case=values.do_lower_case)


if __name__ == "__main__":
    from absl import app as _app  # pylint: disable=import-outside-toplevel
    _define_flags()
    _app.run(_main)
