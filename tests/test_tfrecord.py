"""Tests of bert_jax.data.tfrecord: what it writes parses with its spec and passes its checks, a file that does not
fit the config fails naming the file and the fix, and the framing is TensorFlow's."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import record_framing
from bert_jax.data import instances
from bert_jax.data import tfrecord

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "google_bert"
SEQ128 = FIXTURES / "sample_seq128.tfrecord"
CLS, SEP, MASK = 101, 102, 103
SEQ, PRED = 10, 3
# Ids past 2**15 and 2**21 take the encoder's slow varint paths.
MASKED = [instances.TrainingInstance([CLS, 7592, MASK, SEP, 30000, SEP], [0, 0, 0, 0, 1, 1], [2], [2088], 1),
          instances.TrainingInstance([CLS, 5, SEP, 6, 2**21 + 3, MASK, 7, SEP], [0, 0, 0, 1, 1, 1, 1, 1], [1, 5, 6],
                                     [9, 40000, 8], 0)]
UNMASKED = [instance._replace(masked_lm_positions=None, masked_lm_ids=None) for instance in MASKED]


def _write(path, records):
    writer = record_framing.TFRecordWriter(str(path))
    for record in records:
        writer.write(record)
    writer.close()
    return str(path)


def _write_instances(path, examples, max_seq_length=SEQ, max_predictions_per_seq=PRED):
    return _write(path, [tfrecord.serialize_example(instance, max_seq_length=max_seq_length,
                                                    max_predictions_per_seq=max_predictions_per_seq)
                         for instance in examples])


def _padded(values, length):
    return list(values) + [0] * (length - len(values))


@pytest.mark.parametrize("layout, examples", [("masked", MASKED), ("unmasked", UNMASKED)])
def test_written_records_parse_with_the_spec_and_pass_the_layout_check(tmp_path, layout, examples):
    path = _write_instances(tmp_path / f"{layout}.tfrecord", examples)
    assert tfrecord.record_format(path) == layout
    assert tfrecord.check_record_layout(path, SEQ, PRED) == layout
    spec = tfrecord.feature_spec(SEQ, PRED, layout)
    assert tuple(spec) == (tfrecord.MASKED_FEATURES if layout == "masked" else tfrecord.UNMASKED_FEATURES)
    parsed = [{name: value.numpy().tolist() for name, value in tf.io.parse_single_example(record, spec).items()}
              for record in tf.data.TFRecordDataset(path)]
    assert len(parsed) == len(examples)
    for instance, example in zip(examples, parsed):
        length = len(instance.input_ids)
        assert example["input_ids"] == _padded(instance.input_ids, SEQ)
        assert example["input_mask"] == _padded([1] * length, SEQ)
        assert example["segment_ids"] == _padded(instance.segment_ids, SEQ)
        assert example["next_sentence_labels"] == [instance.next_sentence_label]
        if layout == "masked":
            count = len(instance.masked_lm_positions)
            assert example["masked_lm_positions"] == _padded(instance.masked_lm_positions, PRED)
            assert example["masked_lm_ids"] == _padded(instance.masked_lm_ids, PRED)
            assert example["masked_lm_weights"] == _padded([1.0] * count, PRED)


@pytest.mark.parametrize("layout, examples, lengths, feature, fix", [
    ("masked", MASKED, (2 * SEQ, PRED), "input_ids", f"set --config.data.max_seq_length={SEQ}"),
    ("masked", MASKED, (SEQ, PRED + 2), "masked_lm_positions", f"set --config.data.max_predictions_per_seq={PRED}"),
    ("unmasked", UNMASKED, (SEQ + 1, PRED), "input_ids", f"set --config.data.max_seq_length={SEQ}"),
])
def test_a_layout_the_config_does_not_expect_names_the_file_and_the_fix(tmp_path, layout, examples, lengths, feature,
                                                                       fix):
    path = _write_instances(tmp_path / f"{layout}.tfrecord", examples)
    with pytest.raises(ValueError) as error:
        tfrecord.check_record_layout(path, *lengths)
    message = str(error.value)
    assert message.startswith(path) and repr(feature) in message and fix in message


def test_one_glob_of_both_layouts_is_refused_naming_a_file_of_each_and_the_field(tmp_path):
    files = [_write_instances(tmp_path / "a.tfrecord", MASKED), _write_instances(tmp_path / "b.tfrecord", MASKED),
             _write_instances(tmp_path / "c.tfrecord", UNMASKED)]
    tfrecord.check_one_layout(files[:2], "masked", "--config.data.input_files")
    with pytest.raises(ValueError) as error:
        tfrecord.check_one_layout(files, "masked", "--config.data.input_files")
    message = str(error.value)
    assert files[0] in message and files[2] in message and "point --config.data.input_files at one kind" in message


def test_feature_spec_matches_original_layout():
    spec = tfrecord.feature_spec(128, 20)
    assert {name: (tuple(feature.shape), feature.dtype) for name, feature in spec.items()} == {
        "input_ids": ((128,), tf.int64),
        "input_mask": ((128,), tf.int64),
        "segment_ids": ((128,), tf.int64),
        "masked_lm_positions": ((20,), tf.int64),
        "masked_lm_ids": ((20,), tf.int64),
        "masked_lm_weights": ((20,), tf.float32),
        "next_sentence_labels": ((1,), tf.int64),
    }
    assert tfrecord.check_record_layout(str(SEQ128), 128, 20) == tfrecord.record_format(str(SEQ128)) == "masked"
    with pytest.raises(ValueError, match="layout must be 'masked' or 'unmasked'"):
        tfrecord.feature_spec(128, 20, "static")


def test_hand_framed_tfrecords_equal_tensorflows(tmp_path):
    records = [b"", b"x", bytes(range(256)) * 5, "é".encode()]
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "theirs.tfrecord"
    _write(ours, records)
    with tf.io.TFRecordWriter(str(theirs)) as reference:
        for record in records:
            reference.write(record)
    assert ours.read_bytes() == theirs.read_bytes()
    assert list(tf.data.TFRecordDataset(str(ours)).as_numpy_iterator()) == records


def test_missing_feature_is_named(tmp_path):
    int_feature = lambda values: tf.train.Feature(int64_list=tf.train.Int64List(value=values))  # noqa: E731
    features = {name: int_feature([1] * 8) for name in ("input_ids", "input_mask", "segment_ids")}
    features.update(masked_lm_ids=int_feature([1, 2]), next_sentence_labels=int_feature([0]))
    path = _write(tmp_path / "no_positions.tfrecord",
                  [tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()])
    with pytest.raises(ValueError, match="no feature 'masked_lm_positions'"):
        tfrecord.check_record_layout(path, 8, 2)
    # The sequences alone, without a next-sentence label, are MLM-only rows for dynamic masking.
    for name in ("masked_lm_ids", "next_sentence_labels"):
        del features[name]
    path = _write(tmp_path / "mlm_only.tfrecord",
                  [tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()])
    assert tfrecord.check_record_layout(path, 8, 2) == tfrecord.record_format(path) == "mlm_unmasked"


def test_non_tfrecord_file_is_a_clear_error(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"this is a text corpus, not a TFRecord file\n" * 20)
    with pytest.raises(ValueError, match="not a readable TFRecord") as error:
        tfrecord.check_record_layout(str(path), 128, 20)
    assert str(path) in str(error.value)
    assert "corrupted record" in str(error.value)
    # The fast reader hands what it cannot read to the checked one, which explains it.
    with pytest.raises(ValueError, match="not a readable TFRecord"):
        tfrecord.record_format(str(path))


def test_file_shorter_than_a_record_header_is_not_called_empty(tmp_path):
    path = tmp_path / "tiny.bin"
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="not a TFRecord file: its 3 bytes hold no complete record"):
        tfrecord.check_record_layout(str(path), 128, 20)


def test_record_that_is_not_an_example_is_a_clear_error(tmp_path):
    path = _write(tmp_path / "bytes.tfrecord", [b"\xff" * 16])
    with pytest.raises(ValueError, match="not a tf.train.Example"):
        tfrecord.check_record_layout(path, 128, 20)
