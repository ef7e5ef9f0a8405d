"""Input-pipeline benchmark: `python -m bert_jax.benchmarks.input --num_records=100000 --batch_size=256`.

Writes random pretraining records (unmasked ones, and masked ones for the static row) to --data_dir or a temporary
directory, then times the whole training pipeline of bert_jax.data.input_pipeline: read, shuffle, batch, parse, mask,
prefetch and as_numpy_iterator. One table row per layout: sequences/s over --batches batches after --warmup, the
median of --repeats fresh pipelines (other load on the machine shows up as a wide range).
The records follow the BERT layout ([CLS] A [SEP] B [SEP], trailing padding) with lengths spread over
[seq_length / 2, seq_length], so the masking does the work it does on real data.
"""

import os
import statistics
import tempfile
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bert_jax.data import input_pipeline

flags.DEFINE_string("data_dir", "", "Where to write (or find, if present) the records; empty means a temp dir.")
flags.DEFINE_integer("num_records", 100_000, "Records of each layout.")
flags.DEFINE_integer("num_files", 8, "Shards of each layout.")
flags.DEFINE_integer("seq_length", 128, "max_seq_length.")
flags.DEFINE_integer("max_predictions", 20, "max_predictions_per_seq.")
flags.DEFINE_integer("batch_size", 256, "Sequences per batch.")
flags.DEFINE_integer("vocab_size", 30522, "Token ids are drawn from [104, vocab_size).")
flags.DEFINE_float("continuation_fraction", 0.125,
                   "Share of the vocabulary (the top ids) treated as '##' pieces for whole-word masking.")
flags.DEFINE_integer("warmup", 50, "Untimed batches first (fills the shuffle buffer and lets AUTOTUNE settle).")
flags.DEFINE_integer("batches", 1000, "Timed batches.")
flags.DEFINE_integer("repeats", 3, "Fresh pipelines timed per row; the table shows their median (and range).")
flags.DEFINE_list("rows", ["static", "dynamic", "dynamic_wwm", "remask"],
                  "Rows to measure: static (masked records as written), dynamic (unmasked records), dynamic_wwm "
                  "(the same with whole-word masking), remask (masked records, masked afresh).")
FLAGS = flags.FLAGS

_ROWS = {  # row -> (record layout, masking, whole-word masking)
    "static": ("masked", "static", False),
    "dynamic": ("unmasked", "auto", False),
    "dynamic_wwm": ("unmasked", "auto", True),
    "remask": ("masked", "dynamic", False),
}


def _int64_feature(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def write_records(directory: str, layout: str, *, num_records: int, num_files: int, seq_length: int,
                  max_predictions: int, vocab_size: int, seed: int = 0) -> str:
    """Random records of `layout` ("masked" or "unmasked") in `num_files` shards; returns their glob."""
    rng = np.random.default_rng(seed)
    pattern = os.path.join(directory, f"{layout}-*.tfrecord")
    if len(tf.io.gfile.glob(pattern)) == num_files:
        return pattern  # written by an earlier run with the same --data_dir
    positions_in_row = np.arange(seq_length)
    for shard in range(num_files):
        with tf.io.TFRecordWriter(os.path.join(directory, f"{layout}-{shard:05d}-of-{num_files:05d}.tfrecord")) as w:
            for _ in range(shard * num_records // num_files, (shard + 1) * num_records // num_files):
                length = int(rng.integers(seq_length // 2, seq_length + 1))
                first_sep = int(rng.integers(2, length - 2))
                input_ids = np.zeros(seq_length, np.int64)
                input_ids[:length] = rng.integers(input_pipeline.MASK_ID + 1, vocab_size, size=length)
                input_ids[[0, first_sep, length - 1]] = (input_pipeline.CLS_ID, input_pipeline.SEP_ID,
                                                         input_pipeline.SEP_ID)
                features = {
                    "input_ids": _int64_feature(input_ids),
                    "input_mask": _int64_feature((positions_in_row < length).astype(np.int64)),
                    "segment_ids": _int64_feature(((positions_in_row > first_sep) & (positions_in_row < length))
                                                  .astype(np.int64)),
                    "next_sentence_labels": _int64_feature([int(rng.integers(2))]),
                }
                if layout == "masked":
                    # Static masks as create_pretraining_data.py writes them: all [MASK], which is enough to time.
                    count = min(max_predictions, max(1, round(length * 0.15)))
                    candidates = np.setdiff1d(np.arange(1, length - 1), [first_sep])
                    positions = np.sort(rng.choice(candidates, size=count, replace=False))
                    labels = input_ids[positions].copy()
                    input_ids[positions] = input_pipeline.MASK_ID
                    padding = [0] * (max_predictions - count)
                    features["input_ids"] = _int64_feature(input_ids)
                    features["masked_lm_positions"] = _int64_feature(list(positions) + padding)
                    features["masked_lm_ids"] = _int64_feature(list(labels) + padding)
                    features["masked_lm_weights"] = tf.train.Feature(
                        float_list=tf.train.FloatList(value=[1.0] * count + padding))
                w.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return pattern


def measure(pattern: str, *, masking: str, whole_word_continuation, batch_size: int, seq_length: int,
            max_predictions: int, vocab_size: int, warmup: int, batches: int) -> float:
    """Sequences/s of the training pipeline, as the training loop consumes it (numpy batches)."""
    dataset = input_pipeline.tfrecord_dataset(
        pattern, batch_size=batch_size, max_seq_length=seq_length, max_predictions_per_seq=max_predictions,
        training=True, seed=0, masking=masking, whole_word_continuation=whole_word_continuation,
        vocab_size=vocab_size)
    iterator = dataset.as_numpy_iterator()
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - start)


def main(argv):
    del argv
    unknown = set(FLAGS.rows) - set(_ROWS)
    if unknown:
        raise app.UsageError(f"--rows: unknown {sorted(unknown)}; choose from {list(_ROWS)}")
    with tempfile.TemporaryDirectory() as temp_dir:
        directory = FLAGS.data_dir or temp_dir
        tf.io.gfile.makedirs(directory)
        continuation = np.arange(FLAGS.vocab_size) >= round(FLAGS.vocab_size * (1 - FLAGS.continuation_fraction))
        patterns = {}
        for layout in sorted({_ROWS[row][0] for row in FLAGS.rows}):
            start = time.perf_counter()
            patterns[layout] = write_records(directory, layout, num_records=FLAGS.num_records,
                                             num_files=FLAGS.num_files, seq_length=FLAGS.seq_length,
                                             max_predictions=FLAGS.max_predictions, vocab_size=FLAGS.vocab_size)
            print(f"{layout} records: {patterns[layout]} ({time.perf_counter() - start:.1f} s)")
        print(f"{os.cpu_count()} CPUs, seq_length {FLAGS.seq_length}, max_predictions {FLAGS.max_predictions}, "
              f"{FLAGS.batches} batches after {FLAGS.warmup} warmup")
        print(f"{'row':<12} {'records':<9} {'masking':<8} {'whole-word':<10} {'batch':>6} {'seq/s':>10}  range")
        for row in FLAGS.rows:
            layout, masking, whole_word = _ROWS[row]
            rates = [measure(patterns[layout], masking=masking,
                             whole_word_continuation=continuation if whole_word else None,
                             batch_size=FLAGS.batch_size, seq_length=FLAGS.seq_length,
                             max_predictions=FLAGS.max_predictions, vocab_size=FLAGS.vocab_size,
                             warmup=FLAGS.warmup, batches=FLAGS.batches) for _ in range(FLAGS.repeats)]
            effective = "static" if masking == "static" else "dynamic"
            print(f"{row:<12} {layout:<9} {effective:<8} {'on' if whole_word else 'off':<10} "
                  f"{FLAGS.batch_size:>6} {statistics.median(rates):>10,.0f}  {min(rates):,.0f}-{max(rates):,.0f}")


if __name__ == "__main__":
    app.run(main)
