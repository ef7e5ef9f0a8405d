"""Input pipeline: pretraining TFRecords (original google-research/bert layout) -> numpy batches.

Records with static masks are read as written; unmasked records (no masked_lm_* features) are masked here, in
tf.data, with fresh masks each time a record is read (`dynamic_mask`). MLM-only rows (no next_sentence_labels) get
next_sentence_labels 0 and nsp_weights 0, so that a model with an NSP head learns nothing from them for NSP.

Every function here returns host-local batches of `batch_size` sequences for this process; turning them into one
global jax.Array is the sharding module's job. Batches are dicts of numpy arrays:
input_ids, input_mask, segment_ids int32 [B, S]; masked_lm_positions, masked_lm_ids int32 [B, P];
masked_lm_weights float32 [B, P]; next_sentence_labels int32 [B].
With data.pack, rows are packed instances instead, in the layout of bert_jax.data.packing (position_ids, instance_ids,
nsp_positions and nsp_weights besides; NSP fields [B, max_instances_per_row]).

Held-out batches (make_iterator's "eval" split) cover every record once: the last batch is filled up to B rows with
all-zero padding rows, and every batch carries nsp_weights (float32 [B] unpacked: 1 for a record, 0 for padding; packed
rows have theirs already), so that padding weighs 0 for both MLM (masked_lm_weights) and NSP.
"""

from typing import Iterator

from absl import logging
import numpy as np
import tensorflow as tf

from bert_jax.data import packing as packing_lib
from bert_jax.data import synthetic
from bert_jax.data.synthetic import SyntheticBatches, synthetic_batch, synthetic_batches  # noqa: F401  (re-exported)
from bert_jax.data import tfrecord
from bert_jax.data import verify
from bert_jax.data.masking import CLS_ID, MASK_ID, PAD_ID, SEP_ID  # noqa: F401  (re-exported for callers)
from bert_jax.data.masking import check_masking_args, dynamic_mask, restore_original_tokens

# tf.data only needs the CPU. Left alone, TensorFlow would reserve accelerator memory that JAX needs.
try:
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):  # devices already initialised, or no GPU support compiled in
    pass

_INPUT_FILES_FLAG = "--config.data.input_files"
_EVAL_INPUT_FILES_FLAG = "--config.data.eval_input_files"

_MASKING_MODES = ("auto", "static", "dynamic")


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


def _parse_batch(serialized, spec):
    batch = tf.io.parse_example(serialized, spec)
    # int32 is what the model's embedding lookups and one-hots want, and halves the host-to-device transfer.
    batch = {name: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value for name, value in batch.items()}
    if "next_sentence_labels" in batch:
        batch["next_sentence_labels"] = tf.squeeze(batch["next_sentence_labels"], axis=-1)
    else:  # MLM-only rows: a label of weight 0 (added by _without_nsp), so that every batch has the same fields
        batch["next_sentence_labels"] = tf.zeros(tf.shape(batch["input_ids"])[:1], tf.int32)
    return batch


def _without_nsp(batch):
    """MLM-only rows weigh 0 for NSP: no loss, gradient or accuracy from a label they do not have."""
    return dict(batch, nsp_weights=tf.zeros(tf.shape(batch["input_ids"])[:1], tf.float32))


def _use_dynamic_masking(masking: str, layout: str, flag: str) -> bool:
    if masking not in _MASKING_MODES:
        raise ValueError(f"--config.data.masking={masking!r} is not one of {_MASKING_MODES}: 'auto' masks unmasked "
                         "records dynamically and keeps the masks of masked ones, 'static' requires masked records, "
                         "'dynamic' re-masks every record each time it is read")
    if masking == "static" and not tfrecord.is_masked(layout):
        raise ValueError(f"{flag} holds unmasked records (no masked_lm_* features) but --config.data.masking is "
                         "'static'; set it to 'dynamic' or 'auto' to mask them in the input pipeline")
    return masking == "dynamic" or not tfrecord.is_masked(layout)


def _pad_rows(batch, batch_size: int):
    """`batch` filled up to `batch_size` rows with zeros, plus nsp_weights: padding rows weigh 0 for NSP, and for MLM
    through their zero masked_lm_weights. (Packed rows carry nsp_weights per instance slot already.)"""
    if "nsp_weights" not in batch:
        batch = dict(batch, nsp_weights=tf.ones_like(batch["next_sentence_labels"], tf.float32))
    missing = batch_size - tf.shape(batch["input_ids"])[0]
    padded = {}
    for name, value in batch.items():
        rows = tf.pad(value, [[0, missing]] + [[0, 0]] * (value.shape.rank - 1))
        rows.set_shape([batch_size, *value.shape[1:]])  # a static shape: every process's batches have one
        padded[name] = rows
    return padded


def tfrecord_dataset(patterns: str, *, batch_size: int, max_seq_length: int, max_predictions_per_seq: int,
                     training: bool, seed: int, process_index: int = 0, process_count: int = 1,
                     shuffle_buffer: int = 10000, num_parallel_reads: int = 8,
                     flag: str = _INPUT_FILES_FLAG, masking: str = "auto", masked_lm_prob: float = 0.15,
                     special_ids=(PAD_ID, CLS_ID, SEP_ID, MASK_ID), whole_word_continuation=None,
                     vocab_size: int | None = None,
                     packing: packing_lib.PackingOptions | None = None,
                     pad_final_batch: bool = False) -> tf.data.Dataset:
    """Batches of this process's share of the records in `patterns`; `batch_size` is per process.

    Training shuffles (seeded), interleaves files and repeats forever; evaluation reads a fixed order once.
    Every batch has exactly `batch_size` rows: a final partial batch is dropped, or with `pad_final_batch` (reading
    once, training=False) kept and filled up with all-zero rows, every batch then carrying nsp_weights (1 for a
    record or instance, 0 for padding) so that weighted sums count each record exactly once.

    `masking`: "auto" keeps the masks of masked records and masks unmasked ones dynamically; "static" requires
    masked records; "dynamic" masks every record afresh each time it is read (masked records get their original
    tokens back first). Dynamic masks depend on (seed, process_index, batch number) only, so a run is repeatable
    while every batch, and every epoch, gets new ones. Dynamic masking needs `vocab_size`, for the random
    replacements; `whole_word_continuation` (numpy bool [vocab_size], True for "##" pieces) masks whole words.

    With `packing`, records are read (and masked) in windows of packing.window instances, each window is packed
    into rows (bert_jax.data.packing) and the rows are batched `batch_size` at a time.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is outside [0, process_count={process_count})")
    if pad_final_batch and training:
        raise ValueError("pad_final_batch is for data read once (training=False); training data repeats forever")
    files = expand_globs(patterns, flag=flag)
    layout = tfrecord.check_record_layout(files[0], max_seq_length, max_predictions_per_seq)
    tfrecord.check_one_layout(files, layout, flag)
    dynamic = _use_dynamic_masking(masking, layout, flag)
    if dynamic:
        check_masking_args(masked_lm_prob, vocab_size, special_ids, whole_word_continuation)
    elif whole_word_continuation is not None:
        logging.warning("input %s: the records carry static masks, so whole-word masking has no effect", patterns)

    files, shard_records = _this_process_files(files, process_index, process_count)
    verify.check_framing(files, flag=flag)  # a shard cut short fails here, not steps into the run
    logging.info("input %s: process %d/%d reads %d file(s)%s, %s records, %s masking", patterns, process_index,
                 process_count, len(files), " and shards records" if shard_records else "", layout,
                 "dynamic" if dynamic else "static")
    records = _read_records(files, shard_records=shard_records, training=training, seed=seed,
                            process_index=process_index, process_count=process_count,
                            shuffle_buffer=shuffle_buffer, num_parallel_reads=num_parallel_reads)

    spec = tfrecord.feature_spec(max_seq_length, max_predictions_per_seq, layout)
    # A packing window may be partial (the packer takes any count).
    dataset = (records.batch(batch_size, drop_remainder=not pad_final_batch) if packing is None
               else records.batch(packing.window, drop_remainder=False))
    # Parsing (and masking) a whole batch at once is a few vectorised ops rather than batch_size small ones.
    if dynamic:
        dataset = _parse_and_mask(dataset, spec, layout, seed=seed, process_index=process_index,
                                  max_predictions_per_seq=max_predictions_per_seq, masked_lm_prob=masked_lm_prob,
                                  vocab_size=vocab_size, special_ids=special_ids,
                                  whole_word_continuation=whole_word_continuation)
    else:
        dataset = dataset.map(lambda serialized: _parse_batch(serialized, spec), num_parallel_calls=tf.data.AUTOTUNE)
    if not tfrecord.has_nsp_label(layout):
        dataset = dataset.map(_without_nsp, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = _pack_and_pad(dataset, packing, batch_size=batch_size, max_seq_length=max_seq_length,
                            pad_final_batch=pad_final_batch)
    return _deterministic(dataset.prefetch(tf.data.AUTOTUNE))


def _this_process_files(files: list[str], process_index: int, process_count: int) -> tuple[list[str], bool]:
    """The files this process reads, and whether it must also shard their records."""
    # Whole files per process when there are enough of them (each reads only its own); otherwise every process
    # reads everything in the same order and keeps every process_count-th record.
    shard_records = len(files) < process_count
    if not shard_records:
        files = files[process_index::process_count]
    return files, shard_records


def _read_records(files: list[str], *, shard_records: bool, training: bool, seed: int, process_index: int,
                  process_count: int, shuffle_buffer: int, num_parallel_reads: int) -> tf.data.Dataset:
    """This process's serialized records from `files`: shuffled and repeated forever when training."""
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
    return records


def _parse_and_mask(dataset: tf.data.Dataset, spec, layout: str, *, seed: int, process_index: int,
                    max_predictions_per_seq: int, masked_lm_prob: float, vocab_size: int | None, special_ids,
                    whole_word_continuation) -> tf.data.Dataset:
    """Batches of serialized records -> parsed batches with fresh dynamic masks."""
    # Processes differ in the seed's second word, batches in the fold-in of their number.
    process_seed = tf.constant([seed, process_index], tf.int64)
    continuation = None if whole_word_continuation is None else tf.constant(whole_word_continuation, tf.bool)

    def parse_and_mask(batch_number, serialized):
        batch = _parse_batch(serialized, spec)
        if tfrecord.is_masked(layout):
            batch = restore_original_tokens(batch)
        return dynamic_mask(batch, max_predictions_per_seq=max_predictions_per_seq,
                            masked_lm_prob=masked_lm_prob, vocab_size=vocab_size, special_ids=special_ids,
                            seed=tf.random.experimental.stateless_fold_in(process_seed, batch_number),
                            whole_word_continuation=continuation)

    return dataset.enumerate().map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE)


def _pack_and_pad(dataset: tf.data.Dataset, packing: packing_lib.PackingOptions | None, *, batch_size: int,
                  max_seq_length: int, pad_final_batch: bool) -> tf.data.Dataset:
    """Parsed batches -> packed rows (with `packing`) and a final batch padded up (with `pad_final_batch`)."""
    if packing is not None:
        # The packer drops a partial batch of rows: read once, it hands over single rows, re-batched here.
        dataset = packing_lib.pack_dataset(dataset, batch_size=1 if pad_final_batch else batch_size,
                                           max_seq_length=max_seq_length, options=packing)
        if pad_final_batch:
            dataset = dataset.unbatch().batch(batch_size)
    if pad_final_batch:
        dataset = dataset.map(lambda batch: _pad_rows(batch, batch_size), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset


def _deterministic(dataset: tf.data.Dataset) -> tf.data.Dataset:
    # A resumed or repeated run must see the same batches for the same seed.
    options = tf.data.Options()
    options.deterministic = True
    # No autotuning thread: deleting an iterator waits out that thread's sleep, which grows through a run (tens of
    # seconds at the end of a run). AUTOTUNE stages then take tf.data's fixed defaults, faster in our input benchmark.
    options.autotune.enabled = False
    return dataset.with_options(options)


class TFRecordBatches:
    """Numpy batches from a tf.data pipeline, checked on the host, with a checkpointable position.

    The position is tf.data's own iterator checkpoint (file order, shuffle buffer, prefetched batches, the batch
    counter that seeds dynamic masks), so a restored iterator yields exactly the batches the original would have.
    A record cut short or failing a CRC (TF's DataLossError names no file) is raised as bert_jax.data.verify's
    DamagedShardError, naming the shard among `files()` (default: every file of `source`), its byte and the fix; a
    record that does not parse as the first one did (another layout) likewise, as a ValueError.
    """

    def __init__(self, dataset: tf.data.Dataset, *, vocab_size: int, source: str, files=None,
                 flag: str = _INPUT_FILES_FLAG):
        self._iterator = iter(dataset)
        self._vocab_size = vocab_size
        self._source = source
        self._files = files  # a callable giving the files this process reads: asked only when one is damaged
        self._flag = flag
        self.position = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        try:
            batch = {name: value.numpy() for name, value in next(self._iterator).items()}
        except tf.errors.DataLossError as error:  # a record cut short or failing a CRC; TF names no file
            files = self._files() if self._files is not None else expand_globs(self._source, flag=self._flag)
            raise verify.damaged_shard_error(files, error.message, source=self._source, flag=self._flag) from None
        except tf.errors.InvalidArgumentError as error:  # a record of another layout than the first record's
            files = self._files() if self._files is not None else expand_globs(self._source, flag=self._flag)
            raise verify.unparsable_record_error(files, error.message, source=self._source,
                                                 flag=self._flag) from error
        check_batch(batch, vocab_size=self._vocab_size, source=self._source)
        self.position += 1
        return batch

    def empty_batch(self) -> dict[str, np.ndarray]:
        """A batch of all-zero rows shaped like the others: with held-out data, every weight in it is 0. A process
        whose share of the held-out set has run out feeds these while the others still have batches."""
        return {name: np.zeros(spec.shape, spec.dtype.as_numpy_dtype)
                for name, spec in self._iterator.element_spec.items()}

    def save_state(self, path: str) -> None:
        tf.train.Checkpoint(iterator=self._iterator).write(path)
        synthetic.write_position(path, self.position)

    def restore_state(self, path: str) -> None:
        tf.train.Checkpoint(iterator=self._iterator).read(path).assert_consumed()
        self.position = synthetic.read_position(path)


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
                  process_count: int = 1, whole_word_continuation=None, tokenizer_vocab_size: int | None = None,
                  process_rows=None) -> Iterator[dict[str, np.ndarray]]:
    """This process's batches for `split` ("train" or "eval") from the TFRecords named in `data_config` (a run reads
    them through bert_jax.data.sources.make_iterator, which sends data.source='synthetic' to bert_jax.data.synthetic).

    Training is endless. Held-out TFRecords are read once, their last batch padded with zero-weight rows (see the
    module's docstring). `vocab_size` is the model's embedding
    rows, which every id must stay below. Dynamic masking draws its random replacements from the tokenizer's
    vocabulary, [0, tokenizer_vocab_size) (default vocab_size): pass the real size where the model pads its
    vocabulary, so that no replacement is a padding row. With data.whole_word_mask it also needs
    `whole_word_continuation` (numpy bool [tokenizer_vocab_size], True for the tokenizer's "##" pieces).
    `process_rows` is the synthetic source's (every source takes the same arguments); records ignore it.
    """
    del process_rows
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    training = split == "train"
    packing = packing_lib.PackingOptions.from_config(data_config)  # None unless data.pack; checks the fields
    if data_config.source == "tfrecord":
        patterns = data_config.input_files if training else data_config.eval_input_files
        whole_word_mask = data_config.get("whole_word_mask", False)
        if tokenizer_vocab_size is not None and not 0 < tokenizer_vocab_size <= vocab_size:
            raise ValueError(f"tokenizer_vocab_size={tokenizer_vocab_size} must lie in [1, vocab_size={vocab_size}]: "
                             "the model's vocabulary must hold every token id; set --config.model.vocab_size")
        if whole_word_mask and whole_word_continuation is None:
            raise ValueError("--config.data.whole_word_mask=True needs the tokenizer's continuation table: pass "
                             "whole_word_continuation (bool per vocabulary id, True for '##' pieces) to "
                             "make_iterator, or set --config.data.whole_word_mask=False")
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
            masking=data_config.get("masking", "auto"),
            masked_lm_prob=data_config.get("masked_lm_prob", 0.15),
            special_ids=tuple(data_config.get("special_ids", (PAD_ID, CLS_ID, SEP_ID, MASK_ID))),
            whole_word_continuation=whole_word_continuation if whole_word_mask else None,
            vocab_size=tokenizer_vocab_size or vocab_size,
            packing=packing,
            pad_final_batch=not training,
        )
        flag = _INPUT_FILES_FLAG if training else _EVAL_INPUT_FILES_FLAG

        def files():  # asked only when a shard turns out damaged
            return _this_process_files(expand_globs(patterns, flag=flag), process_index, process_count)[0]
        return TFRecordBatches(dataset, vocab_size=vocab_size, source=patterns, files=files, flag=flag)
    raise ValueError(f"unknown --config.data.source={data_config.source!r}; choose 'synthetic' or 'tfrecord'")


# The config field that sets the length of each feature the records hold per sequence or per prediction.
def check_eval_files(data_config, *, mode: str = "train") -> list[str]:
    """Checks the held-out files (data.eval_input_files) at start-up, as the training files are checked when their
    input starts: they exist, hold one layout that data.masking can read, and the first one has the configured
    max_seq_length / max_predictions_per_seq. Returns the files.

    Training reads them only at its first evaluation, after train.eval_every steps; this finds a problem before the
    first step. With mode="train" a length mismatch is fixed in the held-out files, never in the config (the
    training data has the configured lengths); with mode="eval" either one may change.
    """
    flag = _EVAL_INPUT_FILES_FLAG
    files = expand_globs(data_config.eval_input_files, flag=flag)
    lengths = {"max_seq_length": data_config.max_seq_length,
               "max_predictions_per_seq": data_config.max_predictions_per_seq}

    def describe(found):  # {config field: (feature, the file's length)}
        mismatches = "; ".join(f"feature {name!r} has length {length} but --config.data.{field}={lengths[field]}"
                               for field, (name, length) in found.items())
        configured = " and ".join(f"{field}={lengths[field]}" for field in found)
        if mode == "eval":
            files_lengths = " and ".join(f"--config.data.{field}={length}" for field, (_, length) in found.items())
            fix = (f"set {files_lengths} to evaluate at the files' lengths, or point {flag} at held-out files made "
                   f"with {configured}")
        else:
            fix = (f"held-out files must be made with the training's {configured}, the lengths of "
                   f"{_INPUT_FILES_FLAG}: regenerate them with {configured}, or point {flag} at files that have "
                   "them (changing the config's lengths instead would no longer fit the training data)")
        return f" ({flag}): {mismatches}; {fix}"

    layout = tfrecord.check_record_layout(files[0], lengths["max_seq_length"], lengths["max_predictions_per_seq"],
                                          describe_lengths=describe)
    tfrecord.check_one_layout(files, layout, flag)
    verify.check_framing(files, flag=flag)
    _use_dynamic_masking(data_config.get("masking", "auto"), layout, flag)
    return files
