"""Sequence packing: several pretraining instances per row, so that the encoder does not compute padding.

A packed row holds up to `max_instances_per_row` whole instances back to back, then padding. Each instance keeps
its own [CLS] ... [SEP] tokens, segment ids and masked-LM predictions; per token the row says which instance it
belongs to (`instance_ids`, 1..k, 0 for padding) and where it sits in that instance (`position_ids`, restarting
at 0). The model attends within each instance (`instance_ids` become segment ids: model.SegmentMask, a
block-diagonal mask or the splash kernel's segments) and reads one NSP prediction at each instance's [CLS]
(`nsp_positions`), so every instance is computed exactly as it would be alone in a padded row.

The packer is first-fit decreasing over one window of instances (data.pack_window of them): instances go,
longest first, into the first row with room for their tokens, their predictions and one more instance. It is
deterministic, never splits or drops an instance, and is written in TensorFlow ops (a while loop for the placement
choices, vectorised gathers and scatters for the rest), so in tf.data it runs after parsing and dynamic masking
(masks are drawn per instance, as without packing) in tf.data's own threads: in parallel, without holding
Python's GIL against the training loop, and checkpointable with the rest of the iterator. (A tf.numpy_function
packer was 1.5x faster per core here but holds the GIL, and an iterator left alive at interpreter exit deadlocked
the process.) The variable number of packed rows per window is re-batched to `batch_size` rows.

Throughput of the whole input pipeline with packing, on 2 shared CPU cores (input_pipeline.make_iterator, static
masks, batch 64, window 256, the demo corpus): about 38,000 instances/s at max_seq_length 128 (up to 4 per row)
and 24,000 at 512 (up to 8 per row), against 70,000-120,000 unpacked. It scales with the cores tf.data gets;
compare it with the accelerators' consumption on a new kind of host. Padding on that data: 20.6% -> 2.1% of the
tokens at 128 and 55.5% -> 1.7% at 512; a window of 32 packs less tightly (5.2% and 4.5%).

Packed batch layout (B rows of length T, I = max_instances_per_row, P = max_predictions_per_row):
input_ids, input_mask, segment_ids, position_ids, instance_ids int32 [B, T]; masked_lm_positions, masked_lm_ids
int32 [B, P]; masked_lm_weights float32 [B, P]; nsp_positions, next_sentence_labels int32 [B, I]; nsp_weights
float32 [B, I] (1 for a real instance, 0 for an empty slot, and for an instance whose own nsp_weights is 0: an
MLM-only row).

This module imports TensorFlow only where it packs, so config validation works without it; `pack_batch_numpy` is
the same packer in numpy, for a process with no TensorFlow at all.
"""

import dataclasses
import functools

import numpy as np

INSTANCE_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                     "masked_lm_weights", "next_sentence_labels")
PACKED_FEATURES = ("input_ids", "input_mask", "segment_ids", "position_ids", "instance_ids", "masked_lm_positions",
                   "masked_lm_ids", "masked_lm_weights", "nsp_positions", "next_sentence_labels", "nsp_weights")
_TOKEN_FEATURES = ("input_ids", "input_mask", "segment_ids", "position_ids", "instance_ids")
_PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
_INSTANCE_SLOT_FEATURES = ("nsp_positions", "next_sentence_labels", "nsp_weights")
FLOAT_FEATURES = ("masked_lm_weights", "nsp_weights")  # the rest are int32


@dataclasses.dataclass(frozen=True)
class PackingOptions:
    """How rows are packed: at most `max_instances_per_row` instances and `max_predictions_per_row` MLM slots per
    row, from windows of `window` instances (the larger, the tighter the packing)."""

    max_instances_per_row: int
    max_predictions_per_row: int
    window: int

    @classmethod
    def from_config(cls, data_config) -> "PackingOptions | None":
        """The options of `config.data`, or None when data.pack is off."""
        if not data_config.get("pack", False):
            return None
        validate_config(data_config)
        return cls(int(data_config.max_instances_per_row), packed_predictions(data_config),
                   int(data_config.pack_window))


def packed_predictions(data_config) -> int:
    """MLM slots per packed row: data.max_predictions_per_row, or (0) max_predictions_per_seq per instance slot."""
    configured = int(data_config.get("max_predictions_per_row", 0))
    return configured or int(data_config.max_predictions_per_seq) * int(data_config.max_instances_per_row)


def validate_config(data_config) -> None:
    """Checks the packing fields of `config.data` (a no-op when data.pack is off); errors name the field."""
    if not data_config.get("pack", False):
        return
    if data_config.source == "synthetic":
        raise ValueError("--config.data.pack=True packs pretraining records; the synthetic source has none: use "
                         "data.source=tfrecord or corpus, or --config.data.pack=False")
    instances = data_config.get("max_instances_per_row", 0)
    if instances < 1:
        raise ValueError(f"--config.data.max_instances_per_row={instances}: must be >= 1 (e.g. 4 for "
                         "max_seq_length 128, 8 or more for 512)")
    if data_config.get("pack_window", 0) < 1:
        raise ValueError(f"--config.data.pack_window={data_config.get('pack_window', 0)}: must be >= 1 instances "
                         "(e.g. 256; larger windows pack tighter)")
    configured = data_config.get("max_predictions_per_row", 0)
    if configured and configured < data_config.max_predictions_per_seq:
        raise ValueError(f"--config.data.max_predictions_per_row={configured} is below "
                         f"data.max_predictions_per_seq={data_config.max_predictions_per_seq}, so an instance "
                         "could not fit a row: raise it, or set 0 (max_predictions_per_seq * "
                         "max_instances_per_row)")


def feature_widths(max_seq_length: int, options: PackingOptions) -> dict[str, int]:
    """The last dimension of each packed feature (every one is [rows, width])."""
    max_instances_per_row, max_predictions_per_row = options.max_instances_per_row, options.max_predictions_per_row
    return {**dict.fromkeys(_TOKEN_FEATURES, max_seq_length),
            **dict.fromkeys(_PREDICTION_FEATURES, max_predictions_per_row),
            **dict.fromkeys(_INSTANCE_SLOT_FEATURES, max_instances_per_row)}


def _placement(lengths, num_predictions, *, max_seq_length: int, max_instances_per_row: int,
               max_predictions_per_row: int):
    """First-fit decreasing, in TensorFlow ops: (row, slot, token_offset, prediction_offset), each int32 [N].

    Instances are taken longest first (ties in input order); each goes into the first row that still has room for
    its tokens, its predictions and one more instance. Rows not yet used are empty, so "the first row that fits" is
    an open row or else the next new one. Only that choice is sequential (a while loop over the instances); an
    instance's slot and offsets, which count the instances placed before it in its row, are computed afterwards in
    vectorised ops.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    count = tf.shape(lengths)[0]
    order = tf.argsort(-lengths, stable=True)
    sorted_lengths, sorted_predictions = tf.gather(lengths, order), tf.gather(num_predictions, order)

    def place(i, token_room, prediction_room, instances_in_row, targets):
        length, predictions = sorted_lengths[i], sorted_predictions[i]
        fits = ((token_room >= length) & (prediction_room >= predictions)
                & (instances_in_row < max_instances_per_row))
        target = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        chosen = tf.one_hot(target, count, dtype=tf.int32)
        return (i + 1, token_room - chosen * length, prediction_room - chosen * predictions,
                instances_in_row + chosen, targets.write(i, target))

    state = (tf.constant(0), tf.fill([count], max_seq_length), tf.fill([count], max_predictions_per_row),
             tf.zeros([count], tf.int32), tf.TensorArray(tf.int32, size=count))
    targets = tf.while_loop(lambda i, *_: i < count, place, state, parallel_iterations=1)[-1].stack()

    by_row = tf.argsort(targets, stable=True)  # placement steps grouped by row, in placement order within a row
    instance = tf.gather(order, by_row)
    row = tf.gather(targets, by_row)
    starts_row = row != tf.concat([[-1], row], axis=0)[:-1]
    row_start = tf.boolean_mask(tf.range(count), starts_row)
    row_number = tf.cumsum(tf.cast(starts_row, tf.int32)) - 1

    def before_in_row(values):  # sum of `values` over the instances placed earlier in the same row
        total = tf.cumsum(values, exclusive=True)
        return total - tf.gather(total, tf.gather(row_start, row_number))

    def per_instance(values):
        return tf.scatter_nd(instance[:, None], values, [count])

    return (per_instance(row), per_instance(before_in_row(tf.ones([count], tf.int32))),
            per_instance(before_in_row(tf.gather(lengths, instance))),
            per_instance(before_in_row(tf.gather(num_predictions, instance))))


def _pack_tensors(batch, *, max_instances_per_row: int, max_predictions_per_row: int):
    """Packs a batch of N instances (tensors in the original layout) into R <= N rows: the packed layout's dict."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    input_mask = tf.cast(batch["input_mask"], tf.int32) > 0
    max_seq_length = input_mask.shape[1]
    count = tf.shape(input_mask)[0]
    lengths = tf.reduce_sum(tf.cast(input_mask, tf.int32), axis=1)
    weights = tf.cast(batch["masked_lm_weights"], tf.float32)
    is_prediction = weights > 0
    num_predictions = tf.reduce_sum(tf.cast(is_prediction, tf.int32), axis=1)
    source_positions = tf.cast(batch["masked_lm_positions"], tf.int32)
    checks = [
        tf.debugging.assert_equal(input_mask, tf.range(max_seq_length)[None, :] < lengths[:, None], message=(
            "packing needs trailing padding: input_mask must be ones then zeros in every instance")),
        tf.debugging.assert_positive(lengths, message=(
            "packing met an instance with no real tokens (input_mask all zero); the data is corrupt")),
        tf.debugging.assert_less_equal(num_predictions, max_predictions_per_row, message=(
            f"an instance has more predictions than the {max_predictions_per_row} slots of a packed row")),
        tf.debugging.assert_equal(is_prediction & (source_positions >= lengths[:, None]), False, message=(
            "a masked_lm_position points at padding; packing would move it into another instance")),
    ]
    with tf.control_dependencies(checks):
        row, slot, token_offset, prediction_offset = _placement(
            lengths, num_predictions, max_seq_length=max_seq_length, max_instances_per_row=max_instances_per_row,
            max_predictions_per_row=max_predictions_per_row)
    num_rows = tf.reduce_max(tf.concat([row, [-1]], axis=0)) + 1

    def scatter(indices, values, width):
        return tf.scatter_nd(indices, values, tf.stack([num_rows, width]))

    real = tf.where(input_mask)  # [tokens, 2]: (instance, token)
    instance, token = tf.cast(real[:, 0], tf.int32), tf.cast(real[:, 1], tf.int32)
    where = tf.stack([tf.gather(row, instance), tf.gather(token_offset, instance) + token], axis=1)
    packed = {
        "input_ids": scatter(where, tf.gather_nd(tf.cast(batch["input_ids"], tf.int32), real), max_seq_length),
        "input_mask": scatter(where, tf.ones_like(token), max_seq_length),
        "segment_ids": scatter(where, tf.gather_nd(tf.cast(batch["segment_ids"], tf.int32), real), max_seq_length),
        "position_ids": scatter(where, token, max_seq_length),
        "instance_ids": scatter(where, tf.gather(slot, instance) + 1, max_seq_length),
    }

    chosen = tf.where(is_prediction)  # [predictions, 2]: (instance, slot in the instance's prediction list)
    instance = tf.cast(chosen[:, 0], tf.int32)
    rank = tf.gather_nd(tf.cumsum(tf.cast(is_prediction, tf.int32), axis=1) - 1, chosen)
    where = tf.stack([tf.gather(row, instance), tf.gather(prediction_offset, instance) + rank], axis=1)
    packed["masked_lm_positions"] = scatter(
        where, tf.gather(token_offset, instance) + tf.gather_nd(source_positions, chosen), max_predictions_per_row)
    packed["masked_lm_ids"] = scatter(where, tf.gather_nd(tf.cast(batch["masked_lm_ids"], tf.int32), chosen),
                                      max_predictions_per_row)
    packed["masked_lm_weights"] = scatter(where, tf.gather_nd(weights, chosen), max_predictions_per_row)

    where = tf.stack([row, slot], axis=1)
    packed["nsp_positions"] = scatter(where, token_offset, max_instances_per_row)
    packed["next_sentence_labels"] = scatter(
        where, tf.reshape(tf.cast(batch["next_sentence_labels"], tf.int32), [count]), max_instances_per_row)
    # An instance's own nsp_weights where it has them (0 for MLM-only rows, which have no label), else 1.
    nsp_weights = (tf.reshape(tf.cast(batch["nsp_weights"], tf.float32), [count]) if "nsp_weights" in batch
                   else tf.ones([count], tf.float32))
    packed["nsp_weights"] = scatter(where, nsp_weights, max_instances_per_row)
    return packed


@functools.lru_cache(maxsize=None)
def _compiled(function, **options):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.function(functools.partial(function, **options))


def pack_batch(batch: dict[str, np.ndarray], *, max_instances_per_row: int,
               max_predictions_per_row: int) -> dict[str, np.ndarray]:
    """Packs a numpy batch of N instances (the original layout, trailing padding) into R <= N rows of the same
    length, exactly as the tf.data stage does; returns the packed layout (module docstring) as numpy arrays.

    The real tokens of an instance are its first sum(input_mask) tokens; its predictions are the slots with a
    nonzero masked_lm_weight.
    """
    pack = _compiled(_pack_tensors, max_instances_per_row=max_instances_per_row,
                     max_predictions_per_row=max_predictions_per_row)
    packed = pack({name: np.asarray(batch[name]) for name in (*INSTANCE_FEATURES, "nsp_weights") if name in batch})
    return {name: value.numpy() for name, value in packed.items()}


def place_instances(lengths, num_predictions, *, max_seq_length: int, max_instances_per_row: int,
                    max_predictions_per_row: int):
    """The packer's placement of instances with these lengths and prediction counts, as numpy arrays
    (row, slot, token_offset, prediction_offset), each [N]: see `_placement`."""
    place = _compiled(_placement, max_seq_length=max_seq_length, max_instances_per_row=max_instances_per_row,
                      max_predictions_per_row=max_predictions_per_row)
    return tuple(value.numpy() for value in place(np.asarray(lengths, np.int32),
                                                  np.asarray(num_predictions, np.int32)))


def pack_batch_numpy(batch: dict[str, np.ndarray], *, max_instances_per_row: int,
                     max_predictions_per_row: int) -> dict[str, np.ndarray]:
    """`pack_batch` in numpy alone, for callers without TensorFlow (the GPU check: GPU images often lack it).

    The same placement (first-fit decreasing, `_placement`) and the same layout, so its rows equal the tf.data
    packer's (tests/test_packing.py compares them); the checks raise ValueError instead of TF's errors."""
    input_mask = np.asarray(batch["input_mask"]) > 0
    count, max_seq_length = input_mask.shape
    lengths = input_mask.sum(1)
    is_prediction = np.asarray(batch["masked_lm_weights"], np.float32) > 0
    num_predictions = is_prediction.sum(1)
    source_positions = np.asarray(batch["masked_lm_positions"], np.int64)
    if not np.array_equal(input_mask, np.arange(max_seq_length)[None] < lengths[:, None]):
        raise ValueError("packing needs trailing padding: input_mask must be ones then zeros in every instance")
    if (lengths == 0).any():
        raise ValueError("packing met an instance with no real tokens (input_mask all zero); the data is corrupt")
    if (num_predictions > max_predictions_per_row).any():
        raise ValueError(f"an instance has more predictions than the {max_predictions_per_row} slots of a packed row")
    if (is_prediction & (source_positions >= lengths[:, None])).any():
        raise ValueError("a masked_lm_position points at padding; packing would move it into another instance")

    row, slot, token_offset, prediction_offset, opened = _place_numpy(
        lengths, num_predictions, max_seq_length=max_seq_length, max_instances_per_row=max_instances_per_row,
        max_predictions_per_row=max_predictions_per_row)
    widths = feature_widths(max_seq_length, PackingOptions(max_instances_per_row, max_predictions_per_row, count))
    packed = {name: np.zeros((opened, width), np.float32 if name in FLOAT_FEATURES else np.int32)
              for name, width in widths.items()}
    instance, token = np.nonzero(input_mask)
    where = (row[instance], token_offset[instance] + token)
    packed["input_ids"][where] = np.asarray(batch["input_ids"])[instance, token]
    packed["input_mask"][where] = 1
    packed["segment_ids"][where] = np.asarray(batch["segment_ids"])[instance, token]
    packed["position_ids"][where] = token
    packed["instance_ids"][where] = slot[instance] + 1
    instance, chosen = np.nonzero(is_prediction)
    rank = (np.cumsum(is_prediction, axis=1) - 1)[instance, chosen]
    where = (row[instance], prediction_offset[instance] + rank)
    packed["masked_lm_positions"][where] = token_offset[instance] + source_positions[instance, chosen]
    packed["masked_lm_ids"][where] = np.asarray(batch["masked_lm_ids"])[instance, chosen]
    packed["masked_lm_weights"][where] = np.asarray(batch["masked_lm_weights"], np.float32)[instance, chosen]
    where = (row, slot)
    packed["nsp_positions"][where] = token_offset
    packed["next_sentence_labels"][where] = np.asarray(batch["next_sentence_labels"]).reshape(count)
    packed["nsp_weights"][where] = (np.asarray(batch["nsp_weights"], np.float32).reshape(count)
                                    if "nsp_weights" in batch else 1.0)
    return packed


def _place_numpy(lengths, num_predictions, *, max_seq_length: int, max_instances_per_row: int,
                 max_predictions_per_row: int):
    """`_placement` in numpy: (row, slot, token_offset, prediction_offset, number of rows)."""
    count = len(lengths)
    row, slot, token_offset, prediction_offset = (np.zeros(count, np.int64) for _ in range(4))
    tokens_used, predictions_used, instances_in_row = (np.zeros(count, np.int64) for _ in range(3))
    opened = 0
    # Sequential, as `_placement`'s while loop, over the rows opened so far.
    for instance in np.argsort(-np.asarray(lengths), kind="stable"):
        fits = ((tokens_used[:opened] + lengths[instance] <= max_seq_length)
                & (predictions_used[:opened] + num_predictions[instance] <= max_predictions_per_row)
                & (instances_in_row[:opened] < max_instances_per_row))
        target = int(np.argmax(fits)) if fits.any() else opened
        opened = max(opened, target + 1)
        row[instance], slot[instance] = target, instances_in_row[target]
        token_offset[instance], prediction_offset[instance] = tokens_used[target], predictions_used[target]
        tokens_used[target] += lengths[instance]
        predictions_used[target] += num_predictions[instance]
        instances_in_row[target] += 1
    return row, slot, token_offset, prediction_offset, opened


def packed_padding_fraction(length_counts: dict[int, int], *, max_seq_length: int, max_instances_per_row: int,
                            window: int, max_windows: int = 64, seed: int = 0) -> float:
    """The padding fraction of records with these lengths ({tokens: records}) packed as the input pipeline packs
    them: windows of `window` records in shuffled order (training reads them shuffled), each packed alone; at most
    `max_windows` windows are simulated, a sample of a large corpus. Predictions are not limiting (the default
    data.max_predictions_per_row holds max_predictions_per_seq per instance slot)."""
    lengths = np.repeat(np.array(list(length_counts), np.int64), np.array(list(length_counts.values()), np.int64))
    if not len(lengths):
        return 0.0
    lengths = np.random.default_rng(seed).permutation(lengths)[:window * max_windows]
    rows = 0
    for start in range(0, len(lengths), window):
        part = lengths[start:start + window]
        rows += _place_numpy(part, np.zeros_like(part), max_seq_length=max_seq_length,
                             max_instances_per_row=max_instances_per_row, max_predictions_per_row=1)[-1]
    return 1.0 - float(lengths.sum()) / (rows * max_seq_length)


def padding_stats(length_counts: dict[int, int], *, max_seq_length: int, packed: bool, seed: int = 0,
                  window: int = 256, max_instances_per_row=(4, 8)) -> dict:
    """metadata.json's padding figures of records with these lengths ({tokens: records}): "padding_fraction" as
    written and, if `packed`, "packed_padding_fraction" packed as the input pipeline packs them (data.pack_window's
    default window, data.max_instances_per_row's default 4 and a larger 8 for long rows)."""
    tokens, records = sum(length * count for length, count in length_counts.items()), sum(length_counts.values())
    stats = {"padding_fraction": round(1.0 - tokens / (records * max_seq_length), 4) if records else 0.0}
    if packed:
        stats["packed_padding_fraction"] = {"pack_window": window, **{
            f"max_instances_per_row_{instances}": round(packed_padding_fraction(
                length_counts, max_seq_length=max_seq_length, max_instances_per_row=instances, window=window,
                seed=seed), 4) for instances in max_instances_per_row}}
    return stats


def pack_dataset(dataset, *, batch_size: int, max_seq_length: int, options: PackingOptions):
    """A tf.data stage: batches of instances in, batches of `batch_size` packed rows out (partial ones dropped).

    Each input batch is one packing window (any number of instances). The packer is TensorFlow ops, so it runs in
    tf.data's threads without Python, in parallel, and the iterator stays checkpointable (rows left over from a
    window wait in `batch`'s buffer, which is saved with it).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    widths = feature_widths(max_seq_length, options)

    def pack(batch):
        packed = _pack_tensors(batch, max_instances_per_row=options.max_instances_per_row,
                               max_predictions_per_row=options.max_predictions_per_row)
        for name, value in packed.items():
            value.set_shape([None, widths[name]])
        return packed

    dataset = dataset.map(pack, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.unbatch().batch(batch_size, drop_remainder=True)


def padding_fraction(batches) -> float:
    """The fraction of token slots that are padding over an iterable of batches (dicts with input_mask)."""
    padding = total = 0
    for batch in batches:
        mask = np.asarray(batch["input_mask"])
        padding += int(mask.size - np.count_nonzero(mask))
        total += mask.size
    return padding / total if total else 0.0
