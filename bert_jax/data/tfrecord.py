"""The on-disk format of pretraining data: TFRecord files of tf.train.Example in google-research/bert's layout.

Four layouts, told apart by their features:
  "masked"    the original create_pretraining_data.py layout (MASKED_FEATURES), masks fixed when the data was written;
  "unmasked"  only the sequences and the next-sentence label (UNMASKED_FEATURES); the input pipeline masks them
              afresh each time they are read;
  "mlm_masked", "mlm_unmasked"  the same without next_sentence_labels (MLM_MASKED_FEATURES, MLM_UNMASKED_FEATURES):
              masked-LM-only rows of contiguous text, which have no sentence pair to label.

Writing (`serialize_example`; the framing and `TFRecordWriter` are bert_jax.record_framing's, shared with the
metrics' event files) is done by hand and never imports TensorFlow: it takes seconds and hundreds of MB to import,
which making data from local text into local shards should not pay, and the protobuf classes would cost more than
making the instances. Reading (`feature_spec`) and the checks that a file holds the layout a config expects
import it when called.
"""

from __future__ import annotations

import concurrent.futures
import struct
from typing import Sequence

from bert_jax.record_framing import TFRecordWriter  # noqa: F401  (re-exported: the writer of this format)

SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")  # int64 [max_seq_length]
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")  # [max_predictions_per_seq]
# The original's feature order (an OrderedDict): fixed here so that equal instances are equal bytes.
MASKED_FEATURES = (*SEQUENCE_FEATURES, *PREDICTION_FEATURES, "next_sentence_labels")
UNMASKED_FEATURES = (*SEQUENCE_FEATURES, "next_sentence_labels")
MLM_MASKED_FEATURES = MASKED_FEATURES[:-1]
MLM_UNMASKED_FEATURES = SEQUENCE_FEATURES
LAYOUTS = ("masked", "unmasked", "mlm_masked", "mlm_unmasked")
_LAYOUT_FEATURES = dict(zip(LAYOUTS, (MASKED_FEATURES, UNMASKED_FEATURES, MLM_MASKED_FEATURES,
                                      MLM_UNMASKED_FEATURES)))


def is_masked(layout: str) -> bool:
    """Whether records of `layout` carry static masks."""
    return layout in ("masked", "mlm_masked")


def has_nsp_label(layout: str) -> bool:
    """Whether records of `layout` carry next_sentence_labels (the MLM-only layouts do not)."""
    return layout in ("masked", "unmasked")


def layout_of_options(masked: bool, nsp_label: bool) -> str:
    """The layout a writer produces: static masks or not, a next-sentence label or not."""
    return ("" if nsp_label else "mlm_") + ("masked" if masked else "unmasked")


def features_of(layout: str) -> tuple[str, ...]:
    return _LAYOUT_FEATURES[layout]

# A BERT example is a few kilobytes; a larger length in a record header means the file is something else.
_MAX_PEEK_BYTES = 1 << 26


def _tf():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf


# ---------------------------------------------------------------------------------------------------------------
# The spec the reader parses with.


def feature_spec(max_seq_length: int, max_predictions_per_seq: int, layout: str = "masked") -> dict:
    """The tf.io.parse_example spec of pretraining records in `layout` (one of LAYOUTS)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'masked' or 'unmasked' (or 'mlm_masked', 'mlm_unmasked'), got {layout!r}")
    tf = _tf()
    names = _LAYOUT_FEATURES[layout]
    lengths = {**dict.fromkeys(SEQUENCE_FEATURES, max_seq_length),
               **dict.fromkeys(PREDICTION_FEATURES, max_predictions_per_seq), "next_sentence_labels": 1}
    return {name: tf.io.FixedLenFeature([lengths[name]], tf.float32 if name == "masked_lm_weights" else tf.int64)
            for name in names}


# ---------------------------------------------------------------------------------------------------------------
# The writer: tf.train.Example encoding by hand (the framing is bert_jax.record_framing's).


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


def serialize_example(instance, *, max_seq_length: int, max_predictions_per_seq: int) -> bytes:
    """A tf.train.Example of an instances.TrainingInstance in the original layout and feature order, padded to the
    given lengths. Unmasked instances (positions None) get the unmasked layout's features only, and instances
    without a label (next_sentence_label None) no next_sentence_labels (the MLM-only layouts)."""
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
    if instance.next_sentence_label is not None:
        entries.append(_entry("next_sentence_labels", _INT64_LIST, _VARINTS[instance.next_sentence_label]))
    body = b"".join(entries)
    return b"\x0a" + (_VARINTS[len(body)] if len(body) < len(_VARINTS) else _varint(len(body))) + body


# ---------------------------------------------------------------------------------------------------------------
# The checks: does a file hold the layout the config expects?


def _first_example(path: str):
    """The first record of `path` as a tf.train.Example, through TF's own reader: slow to start, but it checks CRCs
    and says what is wrong with a file that is not a TFRecord file."""
    tf = _tf()
    try:
        first = list(tf.data.TFRecordDataset(path).take(1).as_numpy_iterator())
    except tf.errors.OpError as error:
        # TF wraps the useful part ("corrupted record at 0") in graph-function and op names.
        reason = error.message.split("}}")[-1].split(" [Op:")[0].strip()
        raise ValueError(f"{path} is not a readable TFRecord file ({type(error).__name__}: {reason}); "
                         "expected uncompressed TFRecords of tf.train.Example as written by create_pretraining_data.py"
                         ) from error
    if not first:
        size = tf.io.gfile.stat(path).length
        if size:  # TF reads a file too short for one record header as an empty one
            raise ValueError(f"{path} is not a TFRecord file: its {size} bytes hold no complete record")
        raise ValueError(f"{path} holds no records; remove it from the input globs or regenerate it")
    try:
        return tf.train.Example.FromString(first[0])
    except Exception as error:  # protobuf's DecodeError type depends on the protobuf backend
        raise ValueError(f"the first record of {path} is not a tf.train.Example ({error}); "
                         "expected the output of create_pretraining_data.py") from error


def _layout_of(features) -> str:
    # A record with any masked_lm_* feature is held to a masked layout, so that its errors name what
    # create_pretraining_data.py would have written; one without next_sentence_labels is an MLM-only row.
    masked = any(name in features for name in PREDICTION_FEATURES)
    return layout_of_options(masked, "next_sentence_labels" in features)


def record_format(path: str) -> str:
    """The layout of `path` from its first record: "masked" (static masks, the original layout), "unmasked", or
    their MLM-only forms without next_sentence_labels, "mlm_masked" and "mlm_unmasked".

    The record is read straight from the file, about a thousand times faster than through a TFRecordDataset, which
    counts when every shard of a large corpus is checked; anything unexpected goes through TF's reader, which
    explains the problem.
    """
    tf = _tf()
    try:
        with tf.io.gfile.GFile(path, "rb") as file:
            header = file.read(12)  # uint64 length, then a CRC of the length
            length = int.from_bytes(header[:8], "little")
            if len(header) == 12 and length <= _MAX_PEEK_BYTES:
                payload = file.read(length)
                if len(payload) == length:
                    return _layout_of(tf.train.Example.FromString(payload).features.feature)
    except Exception:  # pylint: disable=broad-except  (the checked reader below reports it properly)
        pass
    return _layout_of(_first_example(path).features.feature)


LENGTH_FIELDS = {**dict.fromkeys(SEQUENCE_FEATURES, "max_seq_length"),
                 **dict.fromkeys(PREDICTION_FEATURES, "max_predictions_per_seq")}


def check_record_layout(path: str, max_seq_length: int, max_predictions_per_seq: int, describe_lengths=None) -> str:
    """Compares the first record of `path` with the configured lengths; returns its layout (see `record_format`).

    A mismatch would otherwise surface as an opaque parse error deep inside tf.data, or not at all.
    `describe_lengths`, if given, words the error for the length mismatches: it gets {config field: (feature, the
    file's length)}, the first mismatching feature of each field, and returns the message after the path.
    """
    tf = _tf()
    features = _first_example(path).features.feature
    layout = _layout_of(features)
    mismatches = {}
    expected = {name: (spec.shape[0], spec.dtype)
                for name, spec in feature_spec(max_seq_length, max_predictions_per_seq, layout).items()}
    for name, (expected_length, dtype) in expected.items():
        if name not in features:
            raise ValueError(f"{path} has no feature {name!r} (it has {sorted(features)}); "
                             "expected the original BERT pretraining layout written by create_pretraining_data.py, "
                             "or the unmasked layout for dynamic masking (input_ids, input_mask, segment_ids, "
                             "next_sentence_labels; MLM-only rows without next_sentence_labels)")
        kind = "float_list" if dtype == tf.float32 else "int64_list"
        if features[name].WhichOneof("kind") != kind:
            raise ValueError(f"{path}: feature {name!r} is a {features[name].WhichOneof('kind')}, expected {kind}")
        found_length = len(getattr(features[name], kind).value)
        if found_length != expected_length and describe_lengths is not None and name in LENGTH_FIELDS:
            mismatches.setdefault(LENGTH_FIELDS[name], (name, found_length))
        elif found_length != expected_length:
            if name in SEQUENCE_FEATURES:
                fix = f"set --config.data.max_seq_length={found_length} to match the data, or regenerate the data"
            elif name in PREDICTION_FEATURES:
                fix = (f"set --config.data.max_predictions_per_seq={found_length} to match the data, "
                       "or regenerate the data")
            else:
                fix = "regenerate the data with create_pretraining_data.py"
            raise ValueError(f"{path}: feature {name!r} has length {found_length} but the config expects "
                             f"{expected_length}; {fix}")
    if mismatches:
        raise ValueError(f"{path}{describe_lengths(mismatches)}")
    return layout


def check_one_layout(files: list[str], first_layout: str, flag: str) -> None:
    """One glob must hold one layout: the two parse to different features, so one batch cannot mix them.

    `first_layout` is files[0]'s; `flag` is the config field the files came from, for the error.
    """
    examples = {first_layout: files[0]}
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:  # threads hide remote (gs://) latency
        for path, layout in zip(files[1:], pool.map(record_format, files[1:])):
            examples.setdefault(layout, path)
    if len({has_nsp_label(layout) for layout in examples}) > 1:
        with_label = next(path for layout, path in examples.items() if has_nsp_label(layout))
        without = next(path for layout, path in examples.items() if not has_nsp_label(layout))
        raise ValueError(f"{flag} mixes sentence-pair records (e.g. {with_label}, with next_sentence_labels) and "
                         f"MLM-only rows (e.g. {without}, without them); point {flag} at one kind, or regenerate "
                         "the shards with one --instances")
    if len(examples) > 1:
        examples = {("masked" if is_masked(layout) else "unmasked"): path for layout, path in examples.items()}
        raise ValueError(f"{flag} mixes masked records (e.g. {examples['masked']}, with masked_lm_* features) and "
                         f"unmasked records (e.g. {examples['unmasked']}, without them); point {flag} at one kind, "
                         "or regenerate the shards so that all of them are masked or all unmasked")
