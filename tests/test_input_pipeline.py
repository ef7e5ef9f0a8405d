"""Tests of bert_jax.input_pipeline against records written by the original google-research/bert tools."""

import itertools
import json
import pathlib

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from bert_jax import input_pipeline

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "google_bert"
SEQ128 = FIXTURES / "sample_seq128.tfrecord"
SEQ128_WWM = FIXTURES / "sample_seq128_wwm.tfrecord"
VOCAB_SIZE = 30522

# Small records written by the tests themselves.
SMALL_SEQ, SMALL_PRED = 8, 2


def _data_config(**overrides):
    config = ml_collections.ConfigDict({
        "source": "tfrecord",
        "input_files": str(SEQ128),
        "eval_input_files": str(SEQ128_WWM),
        "max_seq_length": 128,
        "max_predictions_per_seq": 20,
        "shuffle_buffer": 100,
        "num_parallel_reads": 4,
    })
    config.update(overrides)
    return config


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _int_feature(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _write_records(path, record_ids):
    """Writes one small valid example per id; the id sits in input_ids[1] so tests can tell records apart."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record_id in record_ids:
            features = {
                "input_ids": _int_feature([101, record_id, 102] + [0] * (SMALL_SEQ - 3)),
                "input_mask": _int_feature([1, 1, 1] + [0] * (SMALL_SEQ - 3)),
                "segment_ids": _int_feature([0] * SMALL_SEQ),
                "masked_lm_positions": _int_feature([1, 0]),
                "masked_lm_ids": _int_feature([record_id, 0]),
                "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 0.0])),
                "next_sentence_labels": _int_feature([record_id % 2]),
            }
            example = tf.train.Example(features=tf.train.Features(feature=features))
            writer.write(example.SerializeToString())


def _small_dataset(patterns, **kwargs):
    kwargs.setdefault("batch_size", 1)
    kwargs.setdefault("training", False)
    kwargs.setdefault("seed", 0)
    return input_pipeline.tfrecord_dataset(
        patterns, max_seq_length=SMALL_SEQ, max_predictions_per_seq=SMALL_PRED, **kwargs)


def _record_ids(dataset, num_batches=None):
    batches = itertools.islice(dataset.as_numpy_iterator(), num_batches)
    return [int(record_id) for batch in batches for record_id in batch["input_ids"][:, 1]]


@pytest.mark.parametrize("path,batch_size,count", [(SEQ128, 4, 60), (SEQ128_WWM, 8, 64)])
def test_decodes_original_records_exactly(path, batch_size, count):
    expected = _read_jsonl(path.with_suffix(".jsonl"))
    assert len(expected) == count
    dataset = input_pipeline.tfrecord_dataset(str(path), batch_size=batch_size, max_seq_length=128,
                                              max_predictions_per_seq=20, training=False, seed=0)
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == count // batch_size
    decoded = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}
    assert set(decoded) == set(expected[0])
    for name, values in decoded.items():
        want = np.array([example[name] for example in expected])
        if name == "next_sentence_labels":
            assert values.shape == (count,)
            want = want[:, 0]
        assert values.dtype == (np.float32 if name == "masked_lm_weights" else np.int32), name
        np.testing.assert_array_equal(values, want, err_msg=name)
    # Guards against a comparison that passes on all-zero data.
    assert decoded["masked_lm_weights"].sum() > count
    assert set(decoded["next_sentence_labels"]) == {0, 1}


def test_feature_spec_matches_original_layout():
    spec = input_pipeline.feature_spec(128, 20)
    assert {name: (tuple(feature.shape), feature.dtype) for name, feature in spec.items()} == {
        "input_ids": ((128,), tf.int64),
        "input_mask": ((128,), tf.int64),
        "segment_ids": ((128,), tf.int64),
        "masked_lm_positions": ((20,), tf.int64),
        "masked_lm_ids": ((20,), tf.int64),
        "masked_lm_weights": ((20,), tf.float32),
        "next_sentence_labels": ((1,), tf.int64),
    }


def test_expand_globs_sorts_and_deduplicates(tmp_path):
    for name in ("b.tfrecord", "a.tfrecord", "c.txt"):
        (tmp_path / name).write_bytes(b"")
    files = input_pipeline.expand_globs(f"{tmp_path}/*.tfrecord, {tmp_path}/a.tfrecord,")
    assert files == [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]


def test_glob_matching_nothing_names_pattern_and_flag(tmp_path):
    pattern = f"{tmp_path}/missing-*.tfrecord"
    with pytest.raises(FileNotFoundError) as error:
        input_pipeline.expand_globs(f"{SEQ128},{pattern}")
    assert pattern in str(error.value)
    assert "--config.data.input_files" in str(error.value)


def test_empty_patterns_name_the_field():
    with pytest.raises(ValueError, match="--config.data.eval_input_files"):
        input_pipeline.make_iterator(_data_config(eval_input_files=""), split="eval", batch_size=4,
                                     vocab_size=VOCAB_SIZE, seed=0)


@pytest.mark.parametrize("lengths,feature,fix", [
    ((256, 20), "input_ids", "--config.data.max_seq_length=128"),
    ((128, 40), "masked_lm_positions", "--config.data.max_predictions_per_seq=20"),
])
def test_length_mismatch_names_file_feature_and_fix(lengths, feature, fix):
    with pytest.raises(ValueError) as error:
        input_pipeline.tfrecord_dataset(str(SEQ128), batch_size=4, max_seq_length=lengths[0],
                                        max_predictions_per_seq=lengths[1], training=False, seed=0)
    message = str(error.value)
    assert str(SEQ128) in message
    assert repr(feature) in message
    assert fix in message
    assert str(max(lengths)) in message


def test_missing_feature_is_named(tmp_path):
    path = tmp_path / "no_nsp.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        features = {name: _int_feature([1] * SMALL_SEQ) for name in ("input_ids", "input_mask", "segment_ids")}
        writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    with pytest.raises(ValueError, match="no feature 'masked_lm_positions'"):
        input_pipeline.check_record_layout(str(path), SMALL_SEQ, SMALL_PRED)


def test_non_tfrecord_file_is_a_clear_error(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"this is a text corpus, not a TFRecord file\n" * 20)
    with pytest.raises(ValueError, match="not a readable TFRecord") as error:
        input_pipeline.check_record_layout(str(path), 128, 20)
    assert str(path) in str(error.value)
    assert "corrupted record" in str(error.value)


def test_file_shorter_than_a_record_header_is_not_called_empty(tmp_path):
    path = tmp_path / "tiny.bin"
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="not a TFRecord file: its 3 bytes hold no complete record"):
        input_pipeline.check_record_layout(str(path), 128, 20)


def test_record_that_is_not_an_example_is_a_clear_error(tmp_path):
    path = tmp_path / "bytes.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(b"\xff" * 16)
    with pytest.raises(ValueError, match="not a tf.train.Example"):
        input_pipeline.check_record_layout(str(path), 128, 20)


def test_empty_file_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.tfrecord"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="holds no records"):
        input_pipeline.tfrecord_dataset(str(path), batch_size=4, max_seq_length=128, max_predictions_per_seq=20,
                                        training=False, seed=0)


def test_id_beyond_vocab_is_caught_before_the_device():
    batches = input_pipeline.make_iterator(_data_config(), split="train", batch_size=4, vocab_size=1000, seed=0)
    with pytest.raises(ValueError) as error:
        next(batches)
    message = str(error.value)
    assert "vocab_size is 1000" in message
    assert "--config.model.vocab_size" in message
    assert str(SEQ128) in message
    max_id = int(message.split("holds token id ")[1].split()[0])
    assert max_id >= 1000
    assert f"at least {max_id + 1}" in message


def test_vocab_check_is_exact_at_the_boundary():
    # One eval batch holds the whole file, whose largest id (in input_ids or masked_lm_ids) is known from the jsonl.
    expected = _read_jsonl(SEQ128.with_suffix(".jsonl"))
    max_id = max(max(example["input_ids"] + example["masked_lm_ids"]) for example in expected)
    config = _data_config(eval_input_files=str(SEQ128))
    with pytest.raises(ValueError, match=f"holds token id {max_id} but the model's vocab_size is {max_id}"):
        next(input_pipeline.make_iterator(config, split="eval", batch_size=60, vocab_size=max_id, seed=0))
    batch = next(input_pipeline.make_iterator(config, split="eval", batch_size=60, vocab_size=max_id + 1, seed=0))
    assert batch["input_ids"].shape == (60, 128)


def test_check_batch_rejects_bad_positions_and_segments():
    batch = next(input_pipeline.synthetic_batches(batch_size=2, max_seq_length=16, max_predictions_per_seq=4,
                                                  vocab_size=500, seed=0))
    input_pipeline.check_batch(batch, vocab_size=500, source="synthetic")
    bad_position = dict(batch, masked_lm_positions=np.full_like(batch["masked_lm_positions"], 16))
    with pytest.raises(ValueError, match=r"masked_lm_positions .* holds 16"):
        input_pipeline.check_batch(bad_position, vocab_size=500, source="synthetic")
    bad_segment = dict(batch, segment_ids=np.full_like(batch["segment_ids"], 2))
    with pytest.raises(ValueError, match="segment_ids"):
        input_pipeline.check_batch(bad_segment, vocab_size=500, source="synthetic")
    negative = dict(batch, masked_lm_ids=-batch["masked_lm_ids"] - 1)
    with pytest.raises(ValueError, match="negative token id"):
        input_pipeline.check_batch(negative, vocab_size=500, source="synthetic")


def test_make_iterator_reads_train_and_eval_files():
    config = _data_config()
    train = next(input_pipeline.make_iterator(config, split="train", batch_size=4, vocab_size=VOCAB_SIZE, seed=0))
    eval_batches = input_pipeline.make_iterator(config, split="eval", batch_size=8, vocab_size=VOCAB_SIZE, seed=0)
    first_eval = next(eval_batches)
    assert train["input_ids"].shape == (4, 128)
    wwm = _read_jsonl(SEQ128_WWM.with_suffix(".jsonl"))
    np.testing.assert_array_equal(first_eval["input_ids"], [example["input_ids"] for example in wwm[:8]])
    # Evaluation reads the file once: 64 records make exactly eight batches.
    assert len(list(eval_batches)) == 7


def test_unknown_source_names_the_flag():
    with pytest.raises(ValueError, match="--config.data.source"):
        input_pipeline.make_iterator(_data_config(source="tfds"), split="train", batch_size=4,
                                     vocab_size=VOCAB_SIZE, seed=0)


def test_processes_split_files_disjointly(tmp_path):
    _write_records(tmp_path / "part-0.tfrecord", range(1, 6))
    _write_records(tmp_path / "part-1.tfrecord", range(6, 11))
    _write_records(tmp_path / "part-2.tfrecord", range(11, 16))
    pattern = str(tmp_path / "part-*.tfrecord")
    first = _record_ids(_small_dataset(pattern, process_index=0, process_count=2))
    second = _record_ids(_small_dataset(pattern, process_index=1, process_count=2))
    # Files 0 and 2 go to process 0, file 1 to process 1.
    assert sorted(first) == [1, 2, 3, 4, 5, 11, 12, 13, 14, 15]
    assert sorted(second) == [6, 7, 8, 9, 10]


def test_processes_split_single_file_by_record(tmp_path):
    _write_records(tmp_path / "only.tfrecord", range(1, 11))
    first = _record_ids(_small_dataset(str(tmp_path / "only.tfrecord"), process_index=0, process_count=2))
    second = _record_ids(_small_dataset(str(tmp_path / "only.tfrecord"), process_index=1, process_count=2))
    assert first == [1, 3, 5, 7, 9]
    assert second == [2, 4, 6, 8, 10]


def test_training_order_depends_only_on_seed(tmp_path):
    for part in range(4):
        _write_records(tmp_path / f"part-{part}.tfrecord", range(1 + 16 * part, 17 + 16 * part))
    pattern = str(tmp_path / "part-*.tfrecord")

    def first_ids(seed):
        return _record_ids(_small_dataset(pattern, batch_size=4, training=True, seed=seed, shuffle_buffer=64),
                           num_batches=64)

    seed0 = first_ids(0)
    assert seed0 == first_ids(0)
    assert seed0 != first_ids(1)
    # 64 batches of 4 are four passes over the 64 records: training repeats, each pass shuffled.
    assert len(seed0) == 256
    assert set(seed0) == set(range(1, 65))
    # Records are shuffled, not just files: one file's records do not come out in their written order.
    from_first_file = [record_id for record_id in seed0[:64] if record_id <= 16]
    assert from_first_file != sorted(from_first_file)


def test_synthetic_batches_are_valid_bert_input():
    batches = input_pipeline.synthetic_batches(batch_size=16, max_seq_length=64, max_predictions_per_seq=10,
                                               vocab_size=VOCAB_SIZE, seed=3)
    batch = next(batches)
    expected = {
        "input_ids": ((16, 64), np.int32), "input_mask": ((16, 64), np.int32), "segment_ids": ((16, 64), np.int32),
        "masked_lm_positions": ((16, 10), np.int32), "masked_lm_ids": ((16, 10), np.int32),
        "masked_lm_weights": ((16, 10), np.float32), "next_sentence_labels": ((16,), np.int32),
    }
    assert {name: (value.shape, value.dtype) for name, value in batch.items()} == expected
    input_pipeline.check_batch(batch, vocab_size=VOCAB_SIZE, source="synthetic")

    for row in range(16):
        length = int(batch["input_mask"][row].sum())
        assert 4 <= length <= 64
        np.testing.assert_array_equal(batch["input_mask"][row], np.arange(64) < length)
        assert not batch["input_ids"][row, length:].any() and batch["input_ids"][row, :length].all()
        assert batch["input_ids"][row, 0] == input_pipeline.CLS_ID
        assert batch["input_ids"][row, length - 1] == input_pipeline.SEP_ID
        segments = batch["segment_ids"][row, :length]
        assert segments[0] == 0 and segments[-1] == 1 and (np.diff(segments) >= 0).all()
        assert not batch["segment_ids"][row, length:].any()

        weights = batch["masked_lm_weights"][row]
        count = int(weights.sum())
        assert 1 <= count < 10 and set(weights) <= {0.0, 1.0}
        np.testing.assert_array_equal(weights, np.arange(10) < count)
        positions = batch["masked_lm_positions"][row]
        assert len(set(positions[:count])) == count
        assert (positions[:count] > 0).all() and (positions[:count] < length).all()
        assert not positions[count:].any() and not batch["masked_lm_ids"][row, count:].any()
        assert (batch["input_ids"][row, positions[:count]] == input_pipeline.MASK_ID).all()
        assert (batch["masked_lm_ids"][row, :count] > input_pipeline.MASK_ID).all()
    assert set(batch["next_sentence_labels"]) == {0, 1}


def test_synthetic_batches_small_vocab_and_determinism():
    def take(seed, count=3):
        batches = input_pipeline.synthetic_batches(batch_size=8, max_seq_length=16, max_predictions_per_seq=3,
                                                   vocab_size=50, seed=seed)
        return [next(batches) for _ in range(count)]

    first, again, other = take(0), take(0), take(1)
    for batch in first:
        input_pipeline.check_batch(batch, vocab_size=50, source="synthetic")
        real = batch["input_mask"].astype(bool)
        assert (batch["input_ids"][real] > 0).all() and (batch["input_ids"] < 50).all()
    for left, right in zip(first, again):
        for name in left:
            np.testing.assert_array_equal(left[name], right[name])
    assert not np.array_equal(first[0]["input_ids"], other[0]["input_ids"])
    # Successive batches differ: the generator does not replay one batch.
    assert not np.array_equal(first[0]["input_ids"], first[1]["input_ids"])


def test_synthetic_source_eval_differs_from_train():
    config = _data_config(source="synthetic", max_seq_length=32, max_predictions_per_seq=5)
    train = next(input_pipeline.make_iterator(config, split="train", batch_size=4, vocab_size=VOCAB_SIZE, seed=7))
    evaluation = next(input_pipeline.make_iterator(config, split="eval", batch_size=4, vocab_size=VOCAB_SIZE, seed=7))
    assert train["input_ids"].shape == evaluation["input_ids"].shape == (4, 32)
    assert not np.array_equal(train["input_ids"], evaluation["input_ids"])
