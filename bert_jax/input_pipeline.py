"""Input pipeline: pretraining TFRecords (original google-research/bert layout) or synthetic data -> numpy batches.

Every function here returns host-local batches of `batch_size` sequences for this process; turning them into one
global jax.Array is the sharding module's job. Batches are dicts of numpy arrays:
input_ids, input_mask, segment_ids int32 [B, S]; masked_lm_positions, masked_lm_ids int32 [B, P];
masked_lm_weights float32 [B, P]; next_sentence_labels int32 [B].
"""

from typing import Iterator

from absl import logging
import numpy as np
import tensorflow as tf

# tf.data only needs the CPU. Left alone, TensorFlow would reserve accelerator memory that JAX needs.
try:
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):  # devices already initialised, or no GPU support compiled in
    pass

# Special ids of the original BERT WordPiece vocabularies.
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 101, 102, 103

_SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")
_PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")

_INPUT_FILES_FLAG = "--config.data.input_files"
_EVAL_INPUT_FILES_FLAG = "--config.data.eval_input_files"


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """The tf.io.parse_example spec of the original create_pretraining_data.py records."""
    spec = {name: tf.io.FixedLenFeature([max_seq_length], tf.int64) for name in _SEQUENCE_FEATURES}
    spec["masked_lm_positions"] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64)
    spec["masked_lm_ids"] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64)
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    return spec


def expand_globs(patterns: str, *, flag: str = _INPUT_FILES_FLAG) -> list[str]:
    """Comma-separated globs (local or gs://) -> sorted, de-duplicated file list.

    `flag` is the config field the patterns came from, so that an error tells the user what to change.
    """
    pieces = [piece.strip() for piece in (patterns or "").split(",") if piece.strip()]
    if not pieces:
        raise ValueError(f"{flag} is empty: set it to a comma-separated list of TFRecord globs")
    files = set()
    for pattern in pieces:
        matches = tf.io.gfile.glob(pattern)
        if not matches:
            raise FileNotFoundError(f"no files match {pattern!r}; fix {flag} (comma-separated globs, local or gs://)")
        files.update(matches)
    return sorted(files)


def check_record_layout(path: str, max_seq_length: int, max_predictions_per_seq: int) -> None:
    """Compares the first record of `path` with the configured lengths.

    A mismatch would otherwise surface as an opaque parse error deep inside tf.data, or not at all.
    """
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
        example = tf.train.Example.FromString(first[0])
    except Exception as error:  # protobuf's DecodeError type depends on the protobuf backend
        raise ValueError(f"the first record of {path} is not a tf.train.Example ({error}); "
                         "expected the output of create_pretraining_data.py") from error

    features = example.features.feature
    expected = {name: (spec.shape[0], spec.dtype)
                for name, spec in feature_spec(max_seq_length, max_predictions_per_seq).items()}
    for name, (expected_length, dtype) in expected.items():
        if name not in features:
            raise ValueError(f"{path} has no feature {name!r} (it has {sorted(features)}); "
                             "expected the original BERT pretraining layout written by create_pretraining_data.py")
        kind = "float_list" if dtype == tf.float32 else "int64_list"
        if features[name].WhichOneof("kind") != kind:
            raise ValueError(f"{path}: feature {name!r} is a {features[name].WhichOneof('kind')}, expected {kind}")
        found_length = len(getattr(features[name], kind).value)
        if found_length != expected_length:
            if name in _SEQUENCE_FEATURES:
                fix = f"set --config.data.max_seq_length={found_length} to match the data, or regenerate the data"
            elif name in _PREDICTION_FEATURES:
                fix = (f"set --config.data.max_predictions_per_seq={found_length} to match the data, "
                       "or regenerate the data")
            else:
                fix = "regenerate the data with create_pretraining_data.py"
            raise ValueError(f"{path}: feature {name!r} has length {found_length} but the config expects "
                             f"{expected_length}; {fix}")


def _parse_batch(serialized, spec):
    batch = tf.io.parse_example(serialized, spec)
    # int32 is what the model's embedding lookups and one-hots want, and halves the host-to-device transfer.
    batch = {name: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value for name, value in batch.items()}
    batch["next_sentence_labels"] = tf.squeeze(batch["next_sentence_labels"], axis=-1)
    return batch


def tfrecord_dataset(patterns: str, *, batch_size: int, max_seq_length: int, max_predictions_per_seq: int,
                     training: bool, seed: int, process_index: int = 0, process_count: int = 1,
                     shuffle_buffer: int = 10000, num_parallel_reads: int = 8,
                     flag: str = _INPUT_FILES_FLAG) -> tf.data.Dataset:
    """Batches of this process's share of the records in `patterns`; `batch_size` is per process.

    Training shuffles (seeded), interleaves files and repeats forever; evaluation reads a fixed order once.
    Partial batches are dropped, so every batch has exactly `batch_size` rows.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is outside [0, process_count={process_count})")
    files = expand_globs(patterns, flag=flag)
    check_record_layout(files[0], max_seq_length, max_predictions_per_seq)

    # Whole files per process when there are enough of them (each reads only its own); otherwise every process
    # reads everything in the same order and keeps every process_count-th record.
    shard_records = len(files) < process_count
    if not shard_records:
        files = files[process_index::process_count]
    logging.info("input %s: process %d/%d reads %d file(s)%s", patterns, process_index, process_count, len(files),
                 " and shards records" if shard_records else "")

    file_dataset = tf.data.Dataset.from_tensor_slices(files)
    if training and not shard_records:
        # Not when sharding records: a per-process file order would break the disjointness of the shards.
        file_dataset = file_dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if training:
        file_dataset = file_dataset.repeat()
    records = file_dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=max(1, min(num_parallel_reads, len(files))),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if shard_records:
        records = records.shard(process_count, process_index)
    if training:
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)

    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    dataset = records.batch(batch_size, drop_remainder=True)
    # Parsing a whole batch at once is one vectorised op rather than batch_size small ones.
    dataset = dataset.map(lambda serialized: _parse_batch(serialized, spec), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)

    # A resumed or repeated run must see the same batches for the same seed.
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options)


def synthetic_batches(*, batch_size: int, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int,
                      seed: int, process_index: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Endless random batches shaped like the TFRecord ones, for benchmarks and tests without data.

    They follow the rules real BERT data obeys (trailing padding, two segments, distinct masked positions inside
    the real tokens), so a model or loss bug shows up here as it would on real data.
    """
    if max_seq_length < 4:
        raise ValueError(f"synthetic data needs max_seq_length >= 4, got {max_seq_length}")
    if not 1 <= max_predictions_per_seq <= max_seq_length:
        raise ValueError(f"synthetic data needs 1 <= max_predictions_per_seq <= max_seq_length, "
                         f"got {max_predictions_per_seq} and {max_seq_length}")
    if vocab_size < 2:
        raise ValueError(f"synthetic data needs vocab_size >= 2, got {vocab_size}")
    use_specials = vocab_size > MASK_ID
    # Ordinary tokens avoid [PAD] always, and the special ids too when the vocab is big enough to hold them.
    first_token = MASK_ID + 1 if vocab_size > MASK_ID + 1 else 1
    rng = np.random.default_rng((seed, process_index))
    positions_in_row = np.arange(max_seq_length)[None, :]
    prediction_slots = np.arange(max_predictions_per_seq)[None, :]
    rows = np.arange(batch_size)[:, None]

    while True:
        lengths = rng.integers(max(4, max_seq_length // 2), max_seq_length + 1, size=batch_size)
        # Last token of segment A: segment A and B are both non-empty.
        split = rng.integers(2, lengths - 1)
        real = positions_in_row < lengths[:, None]
        is_split = positions_in_row == split[:, None]
        is_last = positions_in_row == (lengths - 1)[:, None]

        # Zipf-distributed tokens, like words in text: a model can learn their frequencies, so the loss of a
        # smoke run falls, while every id of the vocab still occurs.
        zipf = rng.zipf(1.5, size=(batch_size, max_seq_length)) - 1
        input_ids = first_token + zipf % (vocab_size - first_token)
        maskable = real & (positions_in_row > 0)
        if use_specials:
            input_ids[:, 0] = CLS_ID
            input_ids[is_split | is_last] = SEP_ID
            maskable &= ~(is_split | is_last)
        input_ids = np.where(real, input_ids, PAD_ID)
        segment_ids = (real & (positions_in_row > split[:, None])).astype(np.int32)

        # About 15% of the tokens are predicted, as in BERT, but never more than the slots or the candidates.
        num_predictions = np.minimum.reduce([
            np.full(batch_size, max_predictions_per_seq),
            np.maximum(1, np.round(0.15 * lengths).astype(np.int64)),
            maskable.sum(axis=1),
        ])
        # Sorting random keys picks distinct candidates; non-candidates get keys past every candidate's.
        keys = np.where(maskable, rng.random((batch_size, max_seq_length)), 2.0)
        chosen = np.argsort(keys, axis=1)[:, :max_predictions_per_seq]
        is_prediction = prediction_slots < num_predictions[:, None]
        # Ascending positions with the padding slots last, the order create_pretraining_data.py writes.
        masked_lm_positions = np.sort(np.where(is_prediction, chosen, max_seq_length), axis=1)
        masked_lm_positions = np.where(is_prediction, masked_lm_positions, 0)
        masked_lm_ids = np.where(is_prediction, input_ids[rows, masked_lm_positions], 0)

        if use_specials:
            replacement = np.full((batch_size, max_predictions_per_seq), MASK_ID)
        else:
            replacement = rng.integers(first_token, vocab_size, size=(batch_size, max_predictions_per_seq))
        row_index = np.broadcast_to(rows, is_prediction.shape)
        input_ids[row_index[is_prediction], masked_lm_positions[is_prediction]] = replacement[is_prediction]

        yield {
            "input_ids": input_ids.astype(np.int32),
            "input_mask": real.astype(np.int32),
            "segment_ids": segment_ids,
            "masked_lm_positions": masked_lm_positions.astype(np.int32),
            "masked_lm_ids": masked_lm_ids.astype(np.int32),
            "masked_lm_weights": is_prediction.astype(np.float32),
            "next_sentence_labels": rng.integers(0, 2, size=batch_size).astype(np.int32),
        }


def check_batch(batch: dict[str, np.ndarray], *, vocab_size: int, source: str) -> None:
    """Host-side sanity check of one batch, before it reaches the device.

    An id >= vocab_size is the classic silent failure of BERT: on accelerators the embedding gather clamps or reads
    garbage instead of failing, and the loss turns NaN thousands of steps later.
    """
    max_seq_length = batch["input_ids"].shape[-1]
    id_fields = [name for name in ("input_ids", "masked_lm_ids") if batch[name].size]
    if id_fields:
        name = max(id_fields, key=lambda field: batch[field].max())
        max_id = int(batch[name].max())
        if max_id >= vocab_size:
            raise ValueError(f"{name} from {source} holds token id {max_id} but the model's vocab_size is "
                             f"{vocab_size}, so the embedding lookup would read past its table (on accelerators "
                             "that gives garbage and NaN losses, not an error): set --config.model.vocab_size to "
                             f"the size of the vocabulary the data was made with (at least {max_id + 1}), or "
                             "regenerate the data with the model's vocabulary")
        name = min(id_fields, key=lambda field: batch[field].min())
        if batch[name].min() < 0:
            raise ValueError(f"{name} from {source} holds negative token id {int(batch[name].min())}; "
                             "the data is corrupt, regenerate it")
    positions = batch["masked_lm_positions"]
    if positions.size and (positions.min() < 0 or positions.max() >= max_seq_length):
        bad = int(positions.max()) if positions.max() >= max_seq_length else int(positions.min())
        raise ValueError(f"masked_lm_positions from {source} holds {bad}, outside [0, {max_seq_length}); "
                         "the data does not match --config.data.max_seq_length or is corrupt")
    segment_ids = batch["segment_ids"]
    if segment_ids.size and (segment_ids.min() < 0 or segment_ids.max() >= 2):
        raise ValueError(f"segment_ids from {source} span [{int(segment_ids.min())}, {int(segment_ids.max())}], "
                         "outside [0, 2); BERT has two segments")


def make_iterator(data_config, *, split: str, batch_size: int, vocab_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """This process's batches for `split` ("train" or "eval") from the source named in `data_config`.

    Training is endless; the caller decides how many eval batches to take.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    training = split == "train"
    if data_config.source == "synthetic":
        # A different seed keeps evaluation batches distinct from training ones.
        return synthetic_batches(batch_size=batch_size, max_seq_length=data_config.max_seq_length,
                                 max_predictions_per_seq=data_config.max_predictions_per_seq, vocab_size=vocab_size,
                                 seed=seed if training else seed + 1, process_index=process_index)
    if data_config.source == "tfrecord":
        patterns = data_config.input_files if training else data_config.eval_input_files
        dataset = tfrecord_dataset(
            patterns,
            batch_size=batch_size,
            max_seq_length=data_config.max_seq_length,
            max_predictions_per_seq=data_config.max_predictions_per_seq,
            training=training,
            seed=seed,
            process_index=process_index,
            process_count=process_count,
            shuffle_buffer=data_config.shuffle_buffer,
            num_parallel_reads=data_config.num_parallel_reads,
            flag=_INPUT_FILES_FLAG if training else _EVAL_INPUT_FILES_FLAG,
        )
        return _checked(dataset.as_numpy_iterator(), vocab_size=vocab_size, source=patterns)
    raise ValueError(f"unknown --config.data.source={data_config.source!r}; choose 'synthetic' or 'tfrecord'")


def _checked(batches, *, vocab_size, source):
    for batch in batches:
        check_batch(batch, vocab_size=vocab_size, source=source)
        yield batch
