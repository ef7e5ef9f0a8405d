"""Tests of bert_jax.data.create: exact agreement with the original google-research/bert tool, the statistics
of the instances it makes, determinism across workers and shards, and errors on bad input."""

import collections
import glob
import json
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import corpus
from bert_jax.data import create
from bert_jax.data import input_pipeline
from bert_jax.data import instances
from bert_jax.data import tfrecord
from bert_jax.data import tokenization
from bert_jax.data.create import DataOptions

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "google_bert"
SAMPLE_TEXT = str(FIXTURES / "sample_text.txt")
VOCAB = str(FIXTURES / "vocab_uncased.txt")
CLS, SEP, MASK = 101, 102, 103
# The flags the fixture records were made with.
FIXTURE_OPTIONS = DataOptions(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15, dupe_factor=5,
                              seed=12345, short_seq_prob=0.1)
# The feature spec of the original run_pretraining.py input_fn_builder.
ORIGINAL_NAME_TO_FEATURES = {
    "input_ids": tf.io.FixedLenFeature([128], tf.int64),
    "input_mask": tf.io.FixedLenFeature([128], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([128], tf.int64),
    "masked_lm_positions": tf.io.FixedLenFeature([20], tf.int64),
    "masked_lm_ids": tf.io.FixedLenFeature([20], tf.int64),
    "masked_lm_weights": tf.io.FixedLenFeature([20], tf.float32),
    "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
}


def _records(pattern):
    # In batches: one eager step per record would cost more than making the records.
    return [record for path in sorted(glob.glob(str(pattern)))
            for batch in tf.data.TFRecordDataset(path).batch(4096) for record in batch.numpy().tolist()]


def _parse(records, spec=None):
    """Each record as {feature: array}, parsed by TensorFlow in one call (not one eager call per record)."""
    spec = spec or ORIGINAL_NAME_TO_FEATURES
    if not records:
        return []
    parsed = {name: value.numpy() for name, value in tf.io.parse_example(records, spec).items()}
    return [{name: value[index] for name, value in parsed.items()} for index in range(len(records))]


def _varint(data, position):
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, position


def _feature_entries(record):
    """{feature name: the bytes of its map entry} of a serialized tf.train.Example, plus the names in file order."""
    assert record[0] == 0x0A
    length, position = _varint(record, 1)
    assert position + length == len(record)
    entries, order = {}, []
    while position < len(record):
        assert record[position] == 0x0A
        length, start = _varint(record, position + 1)
        entry = record[position:start + length]
        name_length, name_start = _varint(record, start + 1)
        name = record[name_start:name_start + name_length].decode()
        entries[name] = entry
        order.append(name)
        position = start + length
    return entries, order


def _in_feature_order(record, order):
    """The same Example with its feature-map entries (an unordered protobuf map) re-ordered, bytes otherwise kept."""
    entries, _ = _feature_entries(record)
    body = b"".join(entries[name] for name in order)
    out = bytearray(b"\x0a")
    length = len(body)
    while length > 0x7F:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + body


def _make(source, output_dir, options=FIXTURE_OPTIONS, **kwargs):
    kwargs.setdefault("num_workers", 0)
    kwargs.setdefault("progress", False)
    return create.create_pretraining_data(source, kwargs.pop("vocab", VOCAB), str(output_dir), options, **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return tokenization.load_tokenizer(VOCAB)


# ---------------------------------------------------------------------------------------------------------------
# Agreement with the original tool.


@pytest.mark.parametrize("whole_word_mask,fixture,count", [(False, "sample_seq128.tfrecord", 60),
                                                           (True, "sample_seq128_wwm.tfrecord", 64)])
def test_reproduces_original_records_byte_for_byte(tmp_path, whole_word_mask, fixture, count):
    options = DataOptions(**{**FIXTURE_OPTIONS.__dict__, "whole_word_mask": whole_word_mask})
    summary = _make(SAMPLE_TEXT, tmp_path, options, num_shards=1)
    ours = _records(tmp_path / "train-00000-of-00001.tfrecord")
    expected = _records(FIXTURES / fixture)
    assert len(ours) == len(expected) == count == summary["stats"]["instances"]
    for index, (record, original) in enumerate(zip(ours, expected)):
        # The original's feature-map order varies from process to process (protobuf maps are unordered); every
        # entry's bytes, and so the whole record once the entries are in our order, must be identical.
        _, order = _feature_entries(record)
        assert order == list(tfrecord.MASKED_FEATURES)
        assert record == _in_feature_order(original, order), f"record {index} differs"
        assert tf.train.Example.FromString(record) == tf.train.Example.FromString(original)


def test_command_line_with_original_flag_names_reproduces_fixture(tmp_path):
    command = [sys.executable, "-m", "bert_jax.data.create", f"--input_file={SAMPLE_TEXT}",
               f"--output_dir={tmp_path}", f"--vocab_file={VOCAB}", "--do_lower_case=True", "--max_seq_length=128",
               "--max_predictions_per_seq=20", "--masked_lm_prob=0.15", "--random_seed=12345", "--dupe_factor=5",
               "--do_whole_word_mask=True", "--num_workers=2", "--noprogress"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    ours = _records(tmp_path / "train-00000-of-00001.tfrecord")
    expected = _records(FIXTURES / "sample_seq128_wwm.tfrecord")
    assert [tf.train.Example.FromString(r) for r in ours] == [tf.train.Example.FromString(r) for r in expected]


def test_truncate_seq_pair_matches_deleting_one_token_per_draw():
    def reference(tokens_a, tokens_b, max_num_tokens, rng):  # the original's loop
        while len(tokens_a) + len(tokens_b) > max_num_tokens:
            trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
            if rng.random() < 0.5:
                del trunc_tokens[0]
            else:
                trunc_tokens.pop()

    lengths = random.Random(0)
    for trial in range(300):
        a = list(range(lengths.randint(1, 300)))
        b = list(range(1000, 1000 + lengths.randint(1, 300)))
        limit = lengths.randint(2, 200)
        expected_a, expected_b, rng_expected = list(a), list(b), random.Random(trial)
        reference(expected_a, expected_b, limit, rng_expected)
        rng = random.Random(trial)
        instances.truncate_seq_pair(a, b, limit, rng)
        assert (a, b) == (expected_a, expected_b)
        assert rng.getstate() == rng_expected.getstate()


def test_serialize_example_matches_protobuf():
    instance = instances.TrainingInstance([CLS, 7592, MASK, SEP, 30000, SEP], [0, 0, 0, 0, 1, 1], [2], [2088], 1)
    record = tfrecord.serialize_example(instance, max_seq_length=8, max_predictions_per_seq=3)
    expected = tf.train.Example(features=tf.train.Features(feature={
        "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[101, 7592, 103, 102, 30000, 102, 0, 0])),
        "input_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=[1] * 6 + [0] * 2)),
        "segment_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[0, 0, 0, 0, 1, 1, 0, 0])),
        "masked_lm_positions": tf.train.Feature(int64_list=tf.train.Int64List(value=[2, 0, 0])),
        "masked_lm_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[2088, 0, 0])),
        "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 0.0, 0.0])),
        "next_sentence_labels": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
    }))
    assert tf.train.Example.FromString(record) == expected
    assert record == _in_feature_order(expected.SerializeToString(), tfrecord.MASKED_FEATURES)
    unmasked = tfrecord.serialize_example(instance._replace(masked_lm_positions=None, masked_lm_ids=None),
                                                  max_seq_length=8, max_predictions_per_seq=3)
    assert set(tf.train.Example.FromString(unmasked).features.feature) == set(tfrecord.UNMASKED_FEATURES)
    with pytest.raises(ValueError, match="max_seq_length=5"):
        tfrecord.serialize_example(instance, max_seq_length=5, max_predictions_per_seq=3)


# ---------------------------------------------------------------------------------------------------------------
# Statistics on a generated corpus.


@pytest.fixture(scope="module")
def long_document_corpus(tmp_path_factory):
    """6000 demo-corpus sentences of 4-30 words in 30 documents of 200.

    The original forces "random next" (label 1) whenever a pair would come from a single segment: at a document's
    end, or throughout a document whose random short target is below its sentence lengths. On short documents that
    lifts label 1 well above half (58% on the demo corpus, for the original tool as for ours); long documents make
    it rare, so there the labels must be balanced.
    """
    sentences = [line for line in corpus.demo_corpus_text().split("\n") if 4 <= len(line.split()) <= 30]
    path = tmp_path_factory.mktemp("corpus") / "long_documents.txt"
    documents = [sentences[start:start + 200] for start in range(0, min(len(sentences), 6000), 200)]
    path.write_text("".join("\n".join(document) + "\n\n" for document in documents), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def static_runs(long_document_corpus, tmp_path_factory):
    """static_runs(whole_word_mask): (summary, parsed examples) of a dupe_factor=2 run on the long documents, made
    on first use, so that a test needing one run does not make both."""
    runs = {}

    def run(whole_word_mask):
        if whole_word_mask not in runs:
            output_dir = tmp_path_factory.mktemp("wwm" if whole_word_mask else "static")
            options = DataOptions(dupe_factor=2, whole_word_mask=whole_word_mask, seed=7)
            summary = _make(long_document_corpus, output_dir, options, documents_per_chunk=10)
            runs[whole_word_mask] = (summary, _parse(_records(output_dir / "train-*.tfrecord")))
        return runs[whole_word_mask]

    return run


@pytest.fixture(scope="module")
def long_document_streams(long_document_corpus, tokenizer):
    """_document_streams of the long documents, for the tests that find segments in them (read only)."""
    return _document_streams(long_document_corpus, tokenizer)


def _original_ids(example):
    ids = example["input_ids"].copy()
    count = int(example["masked_lm_weights"].sum())
    ids[example["masked_lm_positions"][:count]] = example["masked_lm_ids"][:count]
    return ids, example["masked_lm_positions"][:count]


def test_instances_have_the_original_structure(static_runs):
    for summary, examples in map(static_runs, (False, True)):
        assert len(examples) == summary["stats"]["instances"] > 2000
        for example in examples:
            ids, positions = _original_ids(example)
            length = int(example["input_mask"].sum())
            assert 5 <= length <= 128
            assert (example["input_mask"][:length] == 1).all() and not example["input_ids"][length:].any()
            seps = np.flatnonzero(ids[:length] == SEP)
            assert ids[0] == CLS and len(seps) == 2 and seps[1] == length - 1 and 1 < seps[0] < length - 2
            expected_segments = np.r_[np.zeros(seps[0] + 1), np.ones(length - seps[0] - 1), np.zeros(128 - length)]
            np.testing.assert_array_equal(example["segment_ids"], expected_segments)
            # Specials are never predicted, and never replaced.
            assert not np.isin(ids[positions], [CLS, SEP]).any()
            assert example["input_ids"][0] == CLS and (example["input_ids"][seps] == SEP).all()
            assert len(positions) <= 20 and (np.diff(positions) > 0).all()
            assert not example["masked_lm_weights"][len(positions):].any()


def test_masked_lm_follows_the_original_rule(static_runs):
    summary, examples = static_runs(False)
    predictions = tokens = masked = kept = 0
    for example in examples:
        ids, positions = _original_ids(example)
        length = int(example["input_mask"].sum())
        # num_to_predict = min(max_predictions, max(1, round(length * 0.15))), length counting [CLS] and [SEP]s.
        assert len(positions) == min(20, max(1, int(round(length * 0.15))))
        predictions += len(positions)
        tokens += length
        written = example["input_ids"][positions]
        masked += int((written == MASK).sum())
        kept += int((written == ids[positions]).sum())
    replaced = predictions - masked - kept
    assert abs(predictions / tokens - 0.15) < 0.01  # rounding keeps it just under 15% of the real tokens
    assert summary["stats"]["predictions"] == predictions and summary["stats"]["tokens"] == tokens
    assert abs(masked / predictions - 0.8) < 0.02
    assert abs(kept / predictions - 0.1) < 0.02
    assert abs(replaced / predictions - 0.1) < 0.02


def test_next_sentence_labels_are_balanced_and_true(static_runs, long_document_corpus, long_document_streams,
                                                    tmp_path):
    # A document that draws a short target (short_seq_prob) pairs single sentences, all forced to label 1, so with
    # few documents the share swings with how many drew one (56% here); without short targets it must be ~50%.
    summary = _make(long_document_corpus, tmp_path, DataOptions(dupe_factor=2, short_seq_prob=0.0, seed=7),
                    documents_per_chunk=10)
    labels = np.array([example["next_sentence_labels"][0] for example in _parse(_records(tmp_path / "train-*"))])
    assert abs(labels.mean() - 0.5) < 0.03
    assert summary["stats"]["nsp_random_fraction"] == pytest.approx(labels.mean())

    summary, examples = static_runs(False)
    labels = np.array([example["next_sentence_labels"][0] for example in examples])
    assert summary["stats"]["nsp_random_fraction"] == pytest.approx(labels.mean())
    streams = long_document_streams
    random_pairs = random_pairs_that_follow = 0
    for example, label in list(zip(examples, labels))[:400]:
        first, second = _segments({**example, "input_ids": _original_ids(example)[0]})
        if label == 0:  # B is the text right after A (truncation only trims the outer ends)
            assert _follows(streams, first, second)
        elif min(first.count(" "), second.count(" ")) > 8:  # long enough to tell where they come from
            random_pairs += 1
            random_pairs_that_follow += _follows(streams, first, second)
    # The demo text repeats some sentences in several places, so a random B can, rarely, also follow A.
    assert random_pairs > 50 and random_pairs_that_follow <= 0.05 * random_pairs


def test_whole_word_masking_keeps_words_together(static_runs, tokenizer):
    continuation = tokenizer.is_continuation
    _, examples = static_runs(True)
    words_masked = partially_masked = 0
    for example in examples:
        ids, positions = _original_ids(example)
        length = int(example["input_mask"].sum())
        # Words as the original groups them: a "##" piece joins the nearest earlier piece that is not [CLS]/[SEP].
        words = []
        for index in range(length):
            if ids[index] in (CLS, SEP):
                continue
            if words and continuation[ids[index]]:
                words[-1].append(index)
            else:
                words.append([index])
        chosen = set(positions.tolist())
        for word in words:
            hits = sum(index in chosen for index in word)
            words_masked += hits == len(word) and len(word) > 1
            partially_masked += 0 < hits < len(word)
        assert len(positions) <= min(20, max(1, int(round(length * 0.15))))
    assert partially_masked == 0
    assert words_masked > 100  # multi-piece words were in fact masked, whole


def test_static_records_read_through_input_pipeline(long_document_corpus, tmp_path):
    _make(long_document_corpus, tmp_path, DataOptions(dupe_factor=1, seed=3), num_shards=2, documents_per_chunk=10)
    dataset = input_pipeline.tfrecord_dataset(str(tmp_path / "train-*.tfrecord"), batch_size=8, max_seq_length=128,
                                              max_predictions_per_seq=20, training=False, seed=0)
    batch = next(iter(dataset.as_numpy_iterator()))
    assert batch["input_ids"].shape == (8, 128) and batch["masked_lm_weights"].shape == (8, 20)
    assert (batch["input_ids"][:, 0] == CLS).all() and (batch["input_ids"] == MASK).any()


# ---------------------------------------------------------------------------------------------------------------
# Determinism, shards and workers.


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """40 demo documents: several chunks of 10."""
    documents = [document for document in corpus.demo_corpus_text().split("\n\n") if document.strip()][:40]
    path = tmp_path_factory.mktemp("small") / "small.txt"
    path.write_text("".join(document + "\n\n" for document in documents), encoding="utf-8")
    return str(path)


def test_same_seed_same_bytes_for_any_workers_and_shards(small_corpus, tmp_path, monkeypatch):
    options = DataOptions(dupe_factor=2, seed=99)
    in_process = _make(small_corpus, tmp_path / "a", options, num_workers=0, documents_per_chunk=10)
    assert in_process["stats"]["chunks"] == 4
    _make(small_corpus, tmp_path / "b", options, num_workers=2, documents_per_chunk=10)
    _make(small_corpus, tmp_path / "c", options, num_workers=2, documents_per_chunk=10, num_shards=4)
    single = _records(tmp_path / "a" / "train-00000-of-00001.tfrecord")
    assert pathlib.Path(tmp_path / "b" / "train-00000-of-00001.tfrecord").read_bytes() == \
        pathlib.Path(tmp_path / "a" / "train-00000-of-00001.tfrecord").read_bytes()
    shards = [_records(tmp_path / "c" / f"train-{index:05d}-of-00004.tfrecord") for index in range(4)]
    # Round-robin across chunk boundaries: shard k holds records k, k+4, ... of the one-file order.
    assert shards == [single[index::4] for index in range(4)]
    assert collections.Counter(sum(shards, [])) == collections.Counter(single)

    different_seed = _make(small_corpus, tmp_path / "d", DataOptions(dupe_factor=2, seed=100), documents_per_chunk=10)
    other = _records(tmp_path / "d" / "train-00000-of-00001.tfrecord")
    assert other != single and len(set(other) & set(single)) < len(single) // 10
    assert different_seed["stats"]["documents"] == in_process["stats"]["documents"] == 40

    # A corpus of one chunk is made in this process whatever num_workers: starting workers (each imports the
    # calling program's modules first) would only add their start-up.
    monkeypatch.setattr(create.multiprocessing, "get_context",
                        lambda method: pytest.fail(f"a {method} worker pool was started for one chunk"))
    one_chunk = _make(small_corpus, tmp_path / "e", options, num_workers=2, documents_per_chunk=40)
    assert one_chunk["stats"]["chunks"] == 1 and one_chunk["stats"]["documents"] == 40


def test_chunk_seeds_are_distinct_and_stable():
    # Chunk 0 is seeded exactly like the original tool; the others from a string, hashed with SHA-512 by random,
    # so the values below hold on every run and machine (PYTHONHASHSEED plays no part).
    assert create.chunk_seed(12345, 0) == 12345
    draws = [random.Random(create.chunk_seed(12345, index)).random() for index in range(1, 50)]
    assert draws[:2] == [0.5019036358008617, 0.772379500264701] and len(set(draws)) == len(draws)


def test_metadata_and_tokenizer_describe_the_data(small_corpus, tmp_path, tokenizer):
    summary = _make(small_corpus, tmp_path, DataOptions(dupe_factor=1, whole_word_mask=True), num_shards=2,
                    documents_per_chunk=10)
    on_disk = json.loads((tmp_path / "metadata.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["format"] == "masked" and on_disk["whole_word_mask"] is True
    assert on_disk["files"] == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert on_disk["stats"]["instances"] == len(_records(tmp_path / "train-*.tfrecord"))
    assert on_disk["tokenizer"]["vocab_size"] == 30522 and on_disk["tokenizer"]["mask_id"] == MASK
    saved = tokenization.load_tokenizer(str(tmp_path / "tokenizer"))
    assert saved.vocab_words == tokenizer.vocab_words and saved.do_lower_case
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no temporary files left


# ---------------------------------------------------------------------------------------------------------------
# Sentence-order prediction and unmasked output.


def _document_streams(path, tokenizer):
    """Each document of a one-sentence-per-line file as one string of its token ids, for substring search."""
    streams = []
    for document in corpus.iter_documents(path):
        ids = [token for sentence in tokenizer.encode_batch(document) for token in sentence]
        streams.append(" " + " ".join(map(str, ids)) + " ")
    return streams


def _segments(example):
    length = int(example["input_mask"].sum())
    first_sep = int(np.flatnonzero(example["input_ids"][:length] == SEP)[0])
    as_text = lambda ids: " " + " ".join(map(str, ids)) + " "
    return as_text(example["input_ids"][1:first_sep]), as_text(example["input_ids"][first_sep + 1:length - 1])


def _follows(streams, first, second):
    for stream in streams:
        start = stream.find(first)
        if start >= 0 and stream.find(second, start + len(first) - 1) >= 0:
            return True
    return False


UNMASKED_SPEC = {name: ORIGINAL_NAME_TO_FEATURES[name] for name in tfrecord.UNMASKED_FEATURES}


def test_sentence_order_prediction(long_document_corpus, long_document_streams, tmp_path):
    options = DataOptions(dupe_factor=1, sentence_order_prediction=True, masking="none", seed=5)
    summary = _make(long_document_corpus, tmp_path, options, documents_per_chunk=10)
    examples = _parse(_records(tmp_path / "train-*.tfrecord"), UNMASKED_SPEC)
    labels = np.array([example["next_sentence_labels"][0] for example in examples])
    assert abs(labels.mean() - 0.5) < 0.03 and summary["stats"]["nsp_random_fraction"] == pytest.approx(labels.mean())
    assert "swapped" in summary["next_sentence_labels"]
    streams = long_document_streams
    for example, label in list(zip(examples, labels))[:300]:
        first, second = _segments(example)
        # Label 0: B is the text after A in one document; label 1: the two are swapped.
        assert _follows(streams, first, second) if label == 0 else _follows(streams, second, first)


def test_unmasked_records_hold_real_text_and_feed_dynamic_masking(long_document_corpus, long_document_streams,
                                                                  tokenizer, tmp_path):
    summary = _make(long_document_corpus, tmp_path, DataOptions(dupe_factor=1, masking="none"),
                    documents_per_chunk=10)
    assert summary["format"] == "unmasked" and summary["stats"]["predictions"] == 0
    records = _records(tmp_path / "train-*.tfrecord")
    assert {name for record in records for name in tf.train.Example.FromString(record).features.feature} == \
        set(tfrecord.UNMASKED_FEATURES)
    examples = _parse(records, UNMASKED_SPEC)
    assert not any((example["input_ids"] == MASK).any() for example in examples)
    streams = long_document_streams
    for example in examples[:200]:
        first, second = _segments(example)
        assert any(first in stream for stream in streams) and any(second in stream for stream in streams)
        if example["next_sentence_labels"][0] == 0:
            assert _follows(streams, first, second)
    dataset = input_pipeline.tfrecord_dataset(str(tmp_path / "train-*.tfrecord"), batch_size=8, max_seq_length=128,
                                              max_predictions_per_seq=20, training=False, seed=0,
                                              vocab_size=tokenizer.vocab_size)
    batch = next(iter(dataset.as_numpy_iterator()))
    assert (batch["input_ids"] == MASK).any() and batch["masked_lm_weights"].sum() > 0


# ---------------------------------------------------------------------------------------------------------------
# Bad input.


def test_empty_corpus_is_an_error_naming_it(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n   \n")
    with pytest.raises(ValueError, match="blank.txt"):
        _make(str(blank), tmp_path / "out1")
    no_tokens = tmp_path / "control_characters.txt"
    no_tokens.write_text("\x01\x02\n\x03\n\n\x04\n")
    with pytest.raises(ValueError, match="control_characters.txt.*no document has a sentence with any token"):
        _make(str(no_tokens), tmp_path / "out2")
    assert not glob.glob(str(tmp_path / "out2" / "*train*"))  # nothing half-written left behind


def test_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_corpus.txt"):
        _make(str(tmp_path / "no_such_corpus.txt"), tmp_path / "out")


def test_non_utf8_lines_are_skipped_and_counted(tmp_path):
    text = pathlib.Path(SAMPLE_TEXT).read_bytes()
    path = tmp_path / "with_bad_line.txt"
    path.write_bytes(b"\xff\xfe not utf-8 \xc3\x28\n" + text)
    summary = _make(str(path), tmp_path / "out")
    assert summary["stats"]["skipped_lines"] == 1
    assert json.loads((tmp_path / "out" / "metadata.json").read_text())["stats"]["skipped_lines"] == 1
    # The bad line is simply absent: the output is the fixture's.
    assert [tf.train.Example.FromString(r) for r in _records(tmp_path / "out" / "train-*.tfrecord")] == \
        [tf.train.Example.FromString(r) for r in _records(FIXTURES / "sample_seq128.tfrecord")]


def test_vocab_without_mask_token_is_an_error_naming_the_file(tmp_path):
    vocab = tmp_path / "vocab_no_mask.txt"
    vocab.write_text("".join(word + "\n" for word in pathlib.Path(VOCAB).read_text().split("\n")[:-1]
                             if word != "[MASK]"))
    with pytest.raises(ValueError, match=r"vocab_no_mask.txt.*\[MASK\]"):
        _make(SAMPLE_TEXT, tmp_path / "out", vocab=str(vocab))


def test_existing_shards_are_never_overwritten_unless_asked(tmp_path):
    _make(SAMPLE_TEXT, tmp_path, DataOptions(dupe_factor=1), num_shards=3)
    before = {path: pathlib.Path(path).read_bytes() for path in glob.glob(str(tmp_path / "train-*"))}
    with pytest.raises(FileExistsError, match=f"{tmp_path}.*overwrite"):
        _make(SAMPLE_TEXT, tmp_path, DataOptions(dupe_factor=2), num_shards=1)
    assert {path: pathlib.Path(path).read_bytes() for path in glob.glob(str(tmp_path / "train-*"))} == before
    _make(SAMPLE_TEXT, tmp_path, DataOptions(dupe_factor=2), num_shards=1, prefix="eval")  # another prefix is fine
    assert (tmp_path / "eval.metadata.json").exists()
    _make(SAMPLE_TEXT, tmp_path, DataOptions(dupe_factor=2), num_shards=1, overwrite=True)
    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "train-*"))) == \
        ["train-00000-of-00001.tfrecord"]  # the stale 3-shard set is gone
    assert json.loads((tmp_path / "metadata.json").read_text())["dupe_factor"] == 2


def test_document_filter_and_a_failed_run_leaves_nothing_behind(small_corpus, tmp_path):
    kept = _make(small_corpus, tmp_path / "even", DataOptions(dupe_factor=1), document_filter=lambda i: i % 2 == 0,
                 documents_per_chunk=10)
    assert kept["stats"]["documents"] == 20

    def failing_filter(index):
        if index == 25:
            raise RuntimeError("filter failed at document 25")
        return True

    with pytest.raises(RuntimeError, match="document 25"):
        _make(small_corpus, tmp_path / "failed", DataOptions(dupe_factor=1), document_filter=failing_filter,
              documents_per_chunk=10, num_workers=2, num_shards=2)
    assert os.listdir(tmp_path / "failed") == []  # neither shards nor their temporary files


@pytest.mark.parametrize("field,value", [("max_seq_length", 4), ("masking", "dynamic"), ("masked_lm_prob", 0.0),
                                         ("dupe_factor", 0), ("short_seq_prob", 1.5),
                                         ("max_predictions_per_seq", 0)])
def test_bad_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"DataOptions.{field}="):
        DataOptions(**{field: value}).validate()


def test_local_data_creation_does_not_import_tensorflow(tmp_path):
    # TensorFlow costs seconds and ~600 MB: a local run must not load it in the process feeding the workers.
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bert_jax.data import create; "
              f"create.create_pretraining_data({SAMPLE_TEXT!r}, {VOCAB!r}, {str(tmp_path)!r}, "
              "create.DataOptions(dupe_factor=1), num_workers=0, progress=False); print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "False"
