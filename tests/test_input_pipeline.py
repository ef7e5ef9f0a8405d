"""Tests of bert_jax.data.input_pipeline against records written by the original google-research/bert tools."""

import itertools
import json
import pathlib

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import input_pipeline
from bert_jax.data import masking
from bert_jax.data import sources

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


def test_held_out_batches_keep_every_record_and_pad_the_last_batch(tmp_path):
    _write_records(tmp_path / "eval.tfrecord", range(1, 22))  # 21 records: batches of 8, 8 and 5
    config = _data_config(eval_input_files=str(tmp_path / "eval.tfrecord"), max_seq_length=SMALL_SEQ,
                          max_predictions_per_seq=SMALL_PRED)
    iterator = input_pipeline.make_iterator(config, split="eval", batch_size=8, vocab_size=VOCAB_SIZE, seed=0)
    batches = list(iterator)
    assert [batch["input_ids"].shape for batch in batches] == [(8, SMALL_SEQ)] * 3
    weights = np.concatenate([batch["nsp_weights"] for batch in batches])
    np.testing.assert_array_equal(weights, [1.0] * 21 + [0.0] * 3)
    decoded = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}
    assert decoded["input_ids"][:21, 1].tolist() == list(range(1, 22))  # each record once, in file order
    np.testing.assert_array_equal(decoded["masked_lm_weights"][:21], [[1.0, 0.0]] * 21)
    for name, values in decoded.items():  # padding rows are zeros in every feature, weights included
        assert not values[21:].any(), name
    # What a process whose share has run out feeds: the same structure, all zero.
    empty = iterator.empty_batch()
    assert {name: (value.shape, value.dtype) for name, value in empty.items()} == {
        name: (value.shape, value.dtype) for name, value in batches[0].items()}
    assert not any(value.any() for value in empty.values())
    # Training batches (endless, never padded) carry no weights.
    train = next(input_pipeline.make_iterator(_data_config(input_files=str(tmp_path / "eval.tfrecord"),
                                                           max_seq_length=SMALL_SEQ,
                                                           max_predictions_per_seq=SMALL_PRED),
                                              split="train", batch_size=8, vocab_size=VOCAB_SIZE, seed=0))
    assert "nsp_weights" not in train


def test_held_out_files_are_checked_up_front(tmp_path):
    pattern = str(tmp_path / "missing-*.tfrecord")
    with pytest.raises(FileNotFoundError, match="--config.data.eval_input_files"):
        input_pipeline.check_eval_files(_data_config(eval_input_files=pattern))
    assert input_pipeline.check_eval_files(_data_config()) == [str(SEQ128_WWM)]
    with pytest.raises(ValueError, match=r"'input_ids' has length 128 but --config\.data\.max_seq_length=64"):
        input_pipeline.check_eval_files(_data_config(max_seq_length=64))


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
    train = next(sources.make_iterator(config, split="train", batch_size=4, vocab_size=VOCAB_SIZE, seed=7))
    evaluation = next(sources.make_iterator(config, split="eval", batch_size=4, vocab_size=VOCAB_SIZE, seed=7))
    assert train["input_ids"].shape == evaluation["input_ids"].shape == (4, 32)
    assert not np.array_equal(train["input_ids"], evaluation["input_ids"])


# Dynamic masking: unmasked records written by the tests, [CLS] A [SEP] B [SEP] and padding.
PAD, CLS, SEP, MASK = 0, 101, 102, 103
# Ids from here on count as "##" pieces in the whole-word tests: about a third of the tokens.
FIRST_CONTINUATION = 20000


def _write_unmasked(path, rng, count, seq_length=128, min_length=5):
    """Random unmasked records; returns their input_ids [count, seq_length] and lengths."""
    lengths = rng.integers(min_length, seq_length + 1, size=count)
    input_ids = np.zeros((count, seq_length), np.int64)
    segment_ids = np.zeros((count, seq_length), np.int64)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row, length in enumerate(lengths):
            first_sep = int(rng.integers(2, length - 2))  # both segments hold at least one token
            tokens = rng.integers(MASK + 1, VOCAB_SIZE, size=length)
            tokens[0], tokens[first_sep], tokens[length - 1] = CLS, SEP, SEP
            input_ids[row, :length] = tokens
            segment_ids[row, first_sep + 1:length] = 1
            features = {
                "input_ids": _int_feature(input_ids[row]),
                "input_mask": _int_feature((np.arange(seq_length) < length).astype(np.int64)),
                "segment_ids": _int_feature(segment_ids[row]),
                "next_sentence_labels": _int_feature([row % 2]),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return input_ids, lengths


def _num_to_predict(lengths, max_predictions, prob=0.15):
    # The original rule, with Python's round; [CLS] and the two [SEP]s count as tokens but are never candidates.
    wanted = [min(max_predictions, max(1, round(int(length) * prob))) for length in lengths]
    return np.minimum(wanted, np.asarray(lengths) - 3)


def _read_all(path, **kwargs):
    kwargs.setdefault("batch_size", 250)
    kwargs.setdefault("max_predictions_per_seq", 20)
    kwargs.setdefault("training", False)
    kwargs.setdefault("seed", 0)
    dataset = input_pipeline.tfrecord_dataset(str(path), max_seq_length=128, vocab_size=VOCAB_SIZE, **kwargs)
    batches = list(dataset.as_numpy_iterator())
    return {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}


def _originals(batch):
    """input_ids with masked_lm_ids written back: the tokens before masking."""
    input_ids = batch["input_ids"].copy()
    for row, (positions, labels, weights) in enumerate(zip(
            batch["masked_lm_positions"], batch["masked_lm_ids"], batch["masked_lm_weights"])):
        real = weights > 0
        input_ids[row, positions[real]] = labels[real]
    return input_ids


def _check_dynamic_batch(batch, original_ids, lengths, max_predictions):
    """Rules every dynamically masked batch obeys; returns the chosen positions per row."""
    assert {name: value.dtype for name, value in batch.items()} == {
        "input_ids": np.int32, "input_mask": np.int32, "segment_ids": np.int32, "masked_lm_positions": np.int32,
        "masked_lm_ids": np.int32, "masked_lm_weights": np.float32, "next_sentence_labels": np.int32}
    assert batch["masked_lm_positions"].shape == (len(lengths), max_predictions)
    np.testing.assert_array_equal(batch["input_mask"], np.arange(128)[None] < lengths[:, None])
    np.testing.assert_array_equal(_originals(batch), original_ids)
    chosen = []
    for row, length in enumerate(lengths):
        weights = batch["masked_lm_weights"][row]
        count = int(weights.sum())
        np.testing.assert_array_equal(weights, np.arange(max_predictions) < count)
        positions = batch["masked_lm_positions"][row]
        assert (np.diff(positions[:count]) > 0).all(), "positions ascend, so they are also distinct"
        assert not positions[count:].any() and not batch["masked_lm_ids"][row, count:].any()
        assert (positions[:count] > 0).all() and (positions[:count] < length).all()
        assert not np.isin(original_ids[row, positions[:count]], [PAD, CLS, SEP]).any()
        np.testing.assert_array_equal(batch["masked_lm_ids"][row, :count], original_ids[row, positions[:count]])
        unchosen = np.setdiff1d(np.arange(128), positions[:count])
        np.testing.assert_array_equal(batch["input_ids"][row, unchosen], original_ids[row, unchosen])
        chosen.append(positions[:count])
    return chosen


def test_dynamic_masking_follows_the_bert_rule(tmp_path):
    rng = np.random.default_rng(0)
    original_ids, lengths = _write_unmasked(tmp_path / "unmasked.tfrecord", rng, 2000)
    batch = _read_all(tmp_path / "unmasked.tfrecord")
    chosen = _check_dynamic_batch(batch, original_ids, lengths, max_predictions=20)
    counts = np.array([len(positions) for positions in chosen])
    # Sequences up to 128 tokens want at most round(0.15 * 128) = 19 predictions: the cap of 20 never binds.
    np.testing.assert_array_equal(counts, _num_to_predict(lengths, 20))
    assert abs(counts.sum() / lengths.sum() - 0.15) < 0.01
    np.testing.assert_array_equal(batch["next_sentence_labels"], np.arange(2000) % 2)
    first_sep = np.argmax(original_ids == SEP, axis=1)
    segment_b = (np.arange(128)[None] > first_sep[:, None]) & (np.arange(128)[None] < lengths[:, None])
    np.testing.assert_array_equal(batch["segment_ids"], segment_b)

    labels = np.concatenate([original_ids[row, positions] for row, positions in enumerate(chosen)])
    now = np.concatenate([batch["input_ids"][row, positions] for row, positions in enumerate(chosen)])
    is_mask, kept = now == MASK, now == labels
    is_random = ~is_mask & ~kept
    # About 26,000 predictions: two percentage points are more than ten standard deviations.
    assert abs(is_mask.mean() - 0.8) < 0.02
    assert abs(kept.mean() - 0.1) < 0.02
    assert abs(is_random.mean() - 0.1) < 0.02
    # Random replacements come from the whole vocabulary, specials and ids below the data's included.
    assert now[is_random].min() <= MASK and now[is_random].max() > 0.9 * VOCAB_SIZE


def test_dynamic_masking_caps_predictions(tmp_path):
    rng = np.random.default_rng(1)
    original_ids, lengths = _write_unmasked(tmp_path / "unmasked.tfrecord", rng, 250, min_length=60)
    batch = _read_all(tmp_path / "unmasked.tfrecord", max_predictions_per_seq=5)
    chosen = _check_dynamic_batch(batch, original_ids, lengths, max_predictions=5)
    assert [len(positions) for positions in chosen] == [5] * 250


def test_num_to_predict_rounds_like_python(tmp_path):
    # 10 * 0.15 = 1.5 rounds to 2 and 30 * 0.15 = 4.5 to 4 (half to even); 12 * 0.15 = 1.8 to 2; 3 tokens want 1.
    rng = np.random.default_rng(2)
    ids = np.zeros((4, 32), np.int32)
    lengths = np.array([10, 30, 12, 4])
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(MASK + 1, VOCAB_SIZE, size=length)
        ids[row, [0, length - 1]] = CLS, SEP
    batch = {"input_ids": tf.constant(ids), "input_mask": tf.constant((ids > 0).astype(np.int32)),
             "segment_ids": tf.zeros_like(ids), "next_sentence_labels": tf.constant([[0], [1], [0], [1]])}
    masked = input_pipeline.dynamic_mask(batch, max_predictions_per_seq=40, vocab_size=VOCAB_SIZE,
                                         seed=tf.constant([3, 4], tf.int64))
    assert masked["masked_lm_weights"].numpy().sum(axis=1).tolist() == [2, 4, 2, 1]
    # More slots than tokens: the extra ones are padding.
    assert masked["masked_lm_positions"].shape == (4, 40)
    assert masked["next_sentence_labels"].numpy().tolist() == [0, 1, 0, 1]


def _words(ids, length, is_continuation):
    """(start, end) of each whole word of one sequence: a non-"##" candidate and the "##" pieces right after it."""
    words = []
    for position in range(1, length):
        if ids[position] in (CLS, SEP):
            continue
        if is_continuation[ids[position]] and ids[position - 1] not in (CLS, SEP):
            words[-1] = (words[-1][0], position + 1)
        else:
            words.append((position, position + 1))
    return words


def test_whole_word_masking_takes_whole_words_greedily(tmp_path):
    rng = np.random.default_rng(3)
    original_ids, lengths = _write_unmasked(tmp_path / "unmasked.tfrecord", rng, 1000)
    is_continuation = np.arange(VOCAB_SIZE) >= FIRST_CONTINUATION
    batch = _read_all(tmp_path / "unmasked.tfrecord", whole_word_continuation=is_continuation)
    chosen = _check_dynamic_batch(batch, original_ids, lengths, max_predictions=20)
    wanted = [min(20, max(1, round(int(length) * 0.15))) for length in lengths]
    multi_token_words = 0
    for row, length in enumerate(lengths):
        chosen_set = set(chosen[row].tolist())
        words = _words(original_ids[row], length, is_continuation)
        taken = [word for word in words if set(range(*word)) <= chosen_set]
        # Every chosen token belongs to a word chosen whole.
        assert sum(end - start for start, end in taken) == len(chosen_set)
        multi_token_words += sum(end - start > 1 for start, end in taken)
        budget_left = wanted[row] - len(chosen_set)
        assert budget_left >= 0
        # The original skips a word that does not fit and goes on: every word left out is longer than what is left.
        assert all(end - start > budget_left for start, end in words if (start, end) not in taken), row
    assert multi_token_words > 500


def test_whole_word_selection_is_the_original_greedy_scan():
    # Given the visiting order (descending keys at the words' first tokens), the vectorised passes must pick exactly
    # the words that the original's loop picks: take a word if it fits in what is left, else skip it and go on.
    rng = np.random.default_rng(8)
    # Few slots and long words: rows often skip words, and often find none that fits among the first 2 * width.
    rows, seq_length, width = 300, 64, 2
    is_continuation = np.zeros(1000, bool)
    is_continuation[400:] = True  # 60% of the tokens are "##" pieces
    input_ids = rng.integers(MASK + 1, 1000, size=(rows, seq_length))
    lengths = rng.integers(5, seq_length + 1, size=rows)
    input_ids[np.arange(seq_length)[None] >= lengths[:, None]] = PAD
    input_ids[:, 0] = CLS
    input_ids[np.arange(rows), lengths - 1] = SEP
    input_ids[np.arange(rows), lengths // 2] = SEP
    candidate = ~np.isin(input_ids, [PAD, CLS, SEP])
    num_to_predict = rng.integers(1, width + 1, size=rows)
    keys = rng.permutation(rows * seq_length).reshape(rows, seq_length)
    choose = tf.function(masking._choose_whole_words)  # pylint: disable=protected-access

    skipped_then_taken = needs_more_than_first_words = 0
    for row in range(rows):
        # One row at a time: whether the first 2 * width words suffice is decided per batch.
        positions = choose(tf.constant(candidate[row:row + 1]), tf.constant(input_ids[row:row + 1], tf.int32),
                           tf.constant(keys[row:row + 1], tf.int32), tf.constant(num_to_predict[row:row + 1], tf.int32),
                           width, tf.constant(is_continuation)).numpy()[0]
        assert positions.shape == (width,)
        selected = np.zeros(seq_length + 1, bool)  # the last entry collects the unused slots
        selected[positions] = True
        words = _words(input_ids[row], lengths[row], is_continuation)
        expected = np.zeros(seq_length, bool)
        budget, skipped = num_to_predict[row], False
        for visited, (start, end) in enumerate(sorted(words, key=lambda word: -keys[row, word[0]])):
            if end - start <= budget:
                expected[start:end] = True
                budget -= end - start
                skipped_then_taken += skipped
                needs_more_than_first_words += visited >= 2 * width
            else:
                skipped = True
        np.testing.assert_array_equal(selected[:seq_length], expected, err_msg=f"row {row}")
    # Both the cases a single cumulative-sum pass would get wrong and those beyond the first 2 * width words.
    assert skipped_then_taken > 100 and needs_more_than_first_words > 20


def test_dynamic_masks_are_fresh_per_epoch_and_follow_the_seed(tmp_path):
    rng = np.random.default_rng(4)
    # Long enough that two independent masks of one record coincide with negligible probability.
    original_ids, _ = _write_unmasked(tmp_path / "unmasked.tfrecord", rng, 64, min_length=40)

    def masks_by_record(seed, epochs=4):
        dataset = input_pipeline.tfrecord_dataset(
            str(tmp_path / "unmasked.tfrecord"), batch_size=8, max_seq_length=128, max_predictions_per_seq=20,
            training=True, seed=seed, shuffle_buffer=64, vocab_size=VOCAB_SIZE)
        batches = list(itertools.islice(dataset.as_numpy_iterator(), 8 * epochs))
        by_record = {}
        for batch in batches:
            for row, original in enumerate(_originals(batch)):
                record = int(np.flatnonzero((original_ids == original).all(axis=1))[0])
                by_record.setdefault(record, []).append(tuple(batch["masked_lm_positions"][row]))
        return batches, by_record

    batches, by_record = masks_by_record(seed=0)
    # The shuffle buffer blends epochs, so a record is seen about, not exactly, four times.
    assert sorted(by_record) == list(range(64)) and sum(map(len, by_record.values())) == 256
    seen_again = [masks for masks in by_record.values() if len(masks) > 1]
    assert len(seen_again) > 56
    assert all(len(set(masks)) == len(masks) for masks in seen_again)
    again, _ = masks_by_record(seed=0)
    other, _ = masks_by_record(seed=1)
    for left, right in zip(batches, again):
        for name in left:
            np.testing.assert_array_equal(left[name], right[name])
    assert not np.array_equal(batches[0]["input_ids"], other[0]["input_ids"])


def test_the_same_record_gets_new_masks_in_every_batch(tmp_path):
    # One record, written eight times, read as eight batches of one: only the batch number tells them apart.
    rng = np.random.default_rng(10)
    _write_unmasked(tmp_path / "one.tfrecord", rng, 1, min_length=100)
    record = next(tf.data.TFRecordDataset(str(tmp_path / "one.tfrecord")).as_numpy_iterator())
    with tf.io.TFRecordWriter(str(tmp_path / "copies.tfrecord")) as writer:
        for _ in range(8):
            writer.write(record)
    batch = _read_all(tmp_path / "copies.tfrecord", batch_size=1)
    assert len({tuple(positions) for positions in batch["masked_lm_positions"]}) == 8


@pytest.mark.parametrize("path", [SEQ128, SEQ128_WWM])
def test_dynamic_masking_remasks_static_records(path):
    expected = _read_jsonl(path.with_suffix(".jsonl"))
    static = {name: np.array([example[name] for example in expected]) for name in expected[0]}
    original_ids = _originals(static)
    lengths = static["input_mask"].sum(axis=1)
    batch = _read_all(path, batch_size=4, masking="dynamic")
    _check_dynamic_batch(batch, original_ids, lengths, max_predictions=20)
    # New masks: the positions differ from the ones written in the file.
    assert (batch["masked_lm_positions"] != static["masked_lm_positions"]).any(axis=1).mean() > 0.9
    # The same rule as the original tool: as many predictions per example as it wrote.
    np.testing.assert_array_equal(batch["masked_lm_weights"].sum(axis=1), static["masked_lm_weights"].sum(axis=1))


@pytest.mark.parametrize("masking", ["auto", "static"])
def test_masked_records_keep_their_masks_unless_told_otherwise(masking):
    expected = _read_jsonl(SEQ128.with_suffix(".jsonl"))
    batch = _read_all(SEQ128, batch_size=4, masking=masking, whole_word_continuation=np.ones(VOCAB_SIZE, bool))
    for name, values in batch.items():
        want = np.array([example[name] for example in expected])
        np.testing.assert_array_equal(values, want[:, 0] if name == "next_sentence_labels" else want, err_msg=name)


def test_mixed_layouts_in_one_glob_are_an_error(tmp_path):
    _write_records(tmp_path / "part-0.tfrecord", range(1, 4))
    with tf.io.TFRecordWriter(str(tmp_path / "part-1.tfrecord")) as writer:
        features = {name: _int_feature([1] * SMALL_SEQ) for name in ("input_ids", "input_mask", "segment_ids")}
        features["next_sentence_labels"] = _int_feature([0])
        writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    with pytest.raises(ValueError) as error:
        _small_dataset(str(tmp_path / "part-*.tfrecord"), masking="dynamic", vocab_size=VOCAB_SIZE)
    message = str(error.value)
    assert "masked records" in message and "unmasked records" in message
    assert str(tmp_path / "part-0.tfrecord") in message and str(tmp_path / "part-1.tfrecord") in message
    assert "--config.data.input_files" in message


def test_masking_settings_are_checked(tmp_path):
    _write_unmasked(tmp_path / "unmasked.tfrecord", np.random.default_rng(6), 4)
    path = str(tmp_path / "unmasked.tfrecord")
    with pytest.raises(ValueError, match="masking is 'static'; set it to 'dynamic' or 'auto'"):
        _read_all(path, masking="static", batch_size=4)
    with pytest.raises(ValueError, match="--config.data.masking='sometimes' is not one of"):
        _read_all(path, masking="sometimes", batch_size=4)
    with pytest.raises(ValueError, match="masked_lm_prob=1.5"):
        _read_all(path, masked_lm_prob=1.5, batch_size=4)
    with pytest.raises(ValueError, match=r"whole_word_continuation has shape \(10,\)"):
        _read_all(path, whole_word_continuation=np.zeros(10, bool), batch_size=4)
    with pytest.raises(ValueError, match="pass vocab_size"):
        input_pipeline.tfrecord_dataset(path, batch_size=4, max_seq_length=128, max_predictions_per_seq=20,
                                        training=False, seed=0)


def test_make_iterator_reads_masking_settings_from_the_config(tmp_path):
    rng = np.random.default_rng(7)
    original_ids, lengths = _write_unmasked(tmp_path / "unmasked.tfrecord", rng, 16)
    config = _data_config(input_files=str(tmp_path / "unmasked.tfrecord"), masked_lm_prob=0.3, whole_word_mask=True)
    with pytest.raises(ValueError, match="whole_word_mask=True needs the tokenizer's continuation table"):
        input_pipeline.make_iterator(config, split="train", batch_size=16, vocab_size=VOCAB_SIZE, seed=0)
    config.eval_input_files = config.input_files
    is_continuation = np.arange(VOCAB_SIZE) >= FIRST_CONTINUATION
    batch = next(input_pipeline.make_iterator(config, split="eval", batch_size=16, vocab_size=VOCAB_SIZE, seed=0,
                                              whole_word_continuation=is_continuation))
    np.testing.assert_array_equal(batch.pop("nsp_weights"), np.ones(16, np.float32))  # 16 records, no padding
    chosen = _check_dynamic_batch(batch, original_ids, lengths, max_predictions=20)
    wanted = [min(20, max(1, round(int(length) * 0.3))) for length in lengths]
    assert all(len(positions) <= want for positions, want in zip(chosen, wanted))
    assert sum(len(positions) for positions in chosen) > 0.8 * sum(wanted)
    config.masking = "static"
    with pytest.raises(ValueError, match="--config.data.masking is 'static'"):
        input_pipeline.make_iterator(config, split="eval", batch_size=16, vocab_size=VOCAB_SIZE, seed=0,
                                     whole_word_continuation=is_continuation)


def test_replacements_come_from_the_tokenizer_vocabulary(tmp_path):
    # The model pads its vocabulary; random replacements must still be real tokens, below the tokenizer's size.
    _write_unmasked(tmp_path / "unmasked.tfrecord", np.random.default_rng(9), 500, min_length=100)
    config = _data_config(eval_input_files=str(tmp_path / "unmasked.tfrecord"), masked_lm_prob=1.0)
    batch = next(input_pipeline.make_iterator(config, split="eval", batch_size=500, vocab_size=2 * VOCAB_SIZE,
                                              seed=0, tokenizer_vocab_size=VOCAB_SIZE))
    # 500 rows * 20 predictions, 10% of them random: from the model's size, half of them would land above.
    assert 0 < batch["input_ids"].max() < VOCAB_SIZE
    with pytest.raises(ValueError, match="tokenizer_vocab_size=40000 must lie in"):
        input_pipeline.make_iterator(config, split="eval", batch_size=4, vocab_size=VOCAB_SIZE, seed=0,
                                     tokenizer_vocab_size=40000)
