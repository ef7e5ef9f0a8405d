"""Tests of MLM-only instances (create.DataOptions.instances "rows" and "fragments"): full rows of contiguous
text without pairs or next-sentence labels, read by the input pipeline (static and dynamic masks, packed) with NSP
weights of 0, so that a model with an NSP head gets no NSP loss from them."""

import glob
import json
import random

import flax.linen as nn
import jax
import numpy as np
import pytest
import tensorflow as tf

from bert_jax import attention
from bert_jax import model as model_lib
from bert_jax import sharding as sharding_lib
from bert_jax import steps as steps_lib
from bert_jax.data import create
from bert_jax.data import input_pipeline
from bert_jax.data import instances as instances_lib
from bert_jax.data import packing
from bert_jax.data import tfrecord
from bert_jax.data import tokenization
from bert_jax.data.create import DataOptions
from tests import helpers

VOCAB = f"{helpers.FIXTURES}/vocab_uncased.txt"
CLS, SEP = 101, 102
SEQ, PREDICTIONS = 32, 5


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """Documents of 1 to 9 of the fixture's sentences: some shorter than a row, some several rows long."""
    with open(f"{helpers.FIXTURES}/sample_text.txt", encoding="utf-8") as file:
        sentences = [line.strip() for line in file if line.strip()]
    documents, start, size = [], 0, 1
    while start < len(sentences):
        documents.append(sentences[start:start + size])
        start, size = start + size, size % 9 + 1
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(document) for document in documents) + "\n", encoding="utf-8")
    return str(path), documents


def _make(corpus_file, output_dir, **options):
    options = DataOptions(**{"max_seq_length": SEQ, "max_predictions_per_seq": PREDICTIONS, "dupe_factor": 2,
                             **options})
    return create.create_pretraining_data(corpus_file[0], VOCAB, str(output_dir), options, num_workers=0,
                                          progress=False, documents_per_chunk=4)


def _lengths(output_dir):
    records = [record for path in sorted(glob.glob(f"{output_dir}/train-*.tfrecord"))
               for record in tf.data.TFRecordDataset(path).as_numpy_iterator()]
    examples = [tf.train.Example.FromString(record).features.feature for record in records]
    return examples, [sum(example["input_mask"].int64_list.value) for example in examples]


@pytest.fixture(scope="module")
def document_ids(corpus_file):
    tokenizer = tokenization.load_tokenizer(VOCAB)
    return [[ids for ids in tokenizer.encode_batch(document) if ids] for document in corpus_file[1]]


def test_rows_are_full_but_the_last_of_each_pass_and_hold_the_stream(document_ids):
    documents = document_ids
    stream = [token for index, document in enumerate(documents)
              for token in [SEP] * (index > 0) + [token for sentence in document for token in sentence]]
    rows = instances_lib.create_rows(documents, random.Random(0), max_seq_length=SEQ, cls_id=CLS, sep_id=SEP)
    assert all(row.input_ids[0] == CLS and row.input_ids[-1] == SEP and row.next_sentence_label is None
               and set(row.segment_ids) == {0} for row in rows)
    assert [len(row.input_ids) for row in rows[:-1]] == [SEQ] * (len(rows) - 1)
    assert [token for row in rows for token in row.input_ids[1:-1]] == stream
    # A later pass starts elsewhere (a rotation of the reshuffled stream): the same tokens, other rows.
    again = instances_lib.create_rows(documents, random.Random(1), max_seq_length=SEQ, cls_id=CLS, sep_id=SEP,
                                      first_pass=False)
    assert [len(row.input_ids) for row in again[:-1]] == [SEQ] * (len(again) - 1)
    tokens = [token for row in again for token in row.input_ids[1:-1]]
    assert sorted(tokens) == sorted(stream + [SEP]) and tokens != stream


def test_fragments_cut_each_document_alone(document_ids):
    documents = document_ids
    width = SEQ - 2
    for document in documents:
        tokens = [token for sentence in document for token in sentence]
        pieces = [piece.input_ids for piece in instances_lib.create_fragments(
            document, random.Random(0), max_seq_length=SEQ, cls_id=CLS, sep_id=SEP)]
        assert [token for piece in pieces for token in piece[1:-1]] == tokens
        assert all(len(piece) == SEQ for piece in pieces[:-1]) and 2 < len(pieces[-1]) <= SEQ
        # A later pass cuts from an offset; the head before it is one more piece, the text is all there.
        later = [piece.input_ids[1:-1] for piece in instances_lib.create_fragments(
            document, random.Random(3), max_seq_length=SEQ, cls_id=CLS, sep_id=SEP, first_pass=False)]
        if len(tokens) > width:
            assert [token for piece in later[-1:] + later[:-1] for token in piece] == tokens
        else:
            assert later == [tokens]
    assert max(sum(map(len, document)) for document in documents) > 2 * width  # some make several pieces


@pytest.mark.parametrize("kind", ["rows", "fragments"])
def test_records_have_no_label_and_metadata_measures_padding(corpus_file, tmp_path, kind):
    metadata = _make(corpus_file, tmp_path, instances=kind)
    examples, lengths = _lengths(tmp_path)
    assert all("next_sentence_labels" not in example for example in examples)
    assert metadata["format"] == "mlm_masked" and "next_sentence_labels" not in metadata["features"]
    assert metadata["instances"] == kind and metadata["next_sentence_labels"] is None
    assert tfrecord.record_format(glob.glob(f"{tmp_path}/train-*.tfrecord")[0]) == "mlm_masked"
    short = sum(length < SEQ for length in lengths)
    documents = len(corpus_file[1])
    # rows: one short row per chunk and pass (4 documents a chunk); fragments: one per document and pass (two
    # for a later pass, which cuts from an offset).
    limit = 2 * -(-documents // 4) if kind == "rows" else 3 * documents
    assert 0 < short <= limit and len(lengths) > limit
    stats = metadata["stats"]
    assert stats["padding_fraction"] == pytest.approx(1 - sum(lengths) / (len(lengths) * SEQ), abs=1e-4)
    assert stats["instances"] == len(lengths) and stats["nsp_random_fraction"] == 0
    if kind == "fragments":
        packed = stats["packed_padding_fraction"]
        assert packed["pack_window"] == 256 and packed["max_instances_per_row_4"] < stats["padding_fraction"]
    with open(f"{tmp_path}/metadata.json", encoding="utf-8") as file:
        assert json.load(file)["stats"]["padding_fraction"] == stats["padding_fraction"]


def test_pairs_metadata_keeps_its_layout_and_one_glob_holds_one_kind(corpus_file, tmp_path):
    with pytest.raises(ValueError, match=r"DataOptions.instances='rows' \(--instances\): MLM-only .* no sentence"):
        DataOptions(instances="rows", sentence_order_prediction=True).validate()
    metadata = _make(corpus_file, tmp_path / "pairs", masking="none")
    _make(corpus_file, tmp_path / "rows", instances="rows", masking="none")
    files = [glob.glob(f"{tmp_path}/{kind}/train-*.tfrecord")[0] for kind in ("pairs", "rows")]
    with pytest.raises(ValueError, match="mixes sentence-pair records .* and MLM-only rows"):
        tfrecord.check_one_layout(files, "unmasked", "--config.data.input_files")
    assert metadata["format"] == "unmasked" and metadata["instances"] == "pairs"
    assert metadata["features"] == list(tfrecord.UNMASKED_FEATURES) and "packed_padding_fraction" not in (
        metadata["stats"])


@pytest.fixture(scope="module")
def mlm_data(corpus_file, tmp_path_factory):
    """{(instances, masking): the records' glob}."""
    made = {}
    for kind, masking in (("rows", "static"), ("rows", "none"), ("fragments", "static")):
        output_dir = tmp_path_factory.mktemp(f"{kind}_{masking}")
        _make(corpus_file, output_dir, instances=kind, masking=masking)
        made[kind, masking] = f"{output_dir}/train-*.tfrecord"
    return made


def _read(pattern, **kwargs):
    dataset = input_pipeline.tfrecord_dataset(pattern, batch_size=8, max_seq_length=SEQ,
                                              max_predictions_per_seq=PREDICTIONS, training=False, seed=0,
                                              vocab_size=30522, **kwargs)
    return [{name: value.numpy() for name, value in batch.items()} for batch in dataset]


@pytest.mark.parametrize("masking", ["static", "none"])
def test_pipeline_reads_rows_with_no_nsp_weight(mlm_data, masking):
    batches = _read(mlm_data["rows", masking], pad_final_batch=True)
    assert batches
    for batch in batches:
        assert batch["nsp_weights"].shape == batch["next_sentence_labels"].shape == (8,)
        assert not batch["nsp_weights"].any() and not batch["next_sentence_labels"].any()
        real = batch["masked_lm_weights"] > 0
        assert real[batch["input_mask"][:, 0] > 0].any(axis=1).all()  # every record is masked, here or as written
        assert not np.isin(batch["masked_lm_ids"][real], (CLS, SEP, 0)).any()
    with pytest.raises(ValueError, match="unmasked records"):
        _read(mlm_data["rows", "none"], masking="static")


def test_packed_fragments_attend_within_their_document_piece(mlm_data):
    options = packing.PackingOptions(max_instances_per_row=4, max_predictions_per_row=4 * PREDICTIONS, window=64)
    unpacked = _read(mlm_data["fragments", "static"], pad_final_batch=True)
    rows = _read(mlm_data["fragments", "static"], packing=options)
    assert packing.padding_fraction(rows) < packing.padding_fraction(unpacked)
    pieces = {tuple(batch["input_ids"][row, :batch["input_mask"][row].sum()])
              for batch in unpacked for row in range(len(batch["input_ids"]))}
    for batch in rows:
        assert not batch["nsp_weights"].any()  # no slot carries an NSP label
        for row in range(len(batch["input_ids"])):
            instance_ids, position_ids = batch["instance_ids"][row], batch["position_ids"][row]
            for instance in range(1, instance_ids.max() + 1):
                tokens = np.flatnonzero(instance_ids == instance)
                # One contiguous block, positions from 0, [CLS] ... [SEP]: one whole piece of one document.
                np.testing.assert_array_equal(tokens, np.arange(tokens[0], tokens[0] + len(tokens)))
                np.testing.assert_array_equal(position_ids[tokens], np.arange(len(tokens)))
                assert tuple(batch["input_ids"][row, tokens]) in pieces
            # The attention mask the model builds from instance ids keeps each piece to itself.
            mask = np.asarray(attention.boolean_mask(attention.SegmentMask(instance_ids[None])))[0, 0]
            real = instance_ids > 0
            np.testing.assert_array_equal(mask[real], (instance_ids[:, None] == instance_ids[None, :])[real])


def test_bert_gets_no_nsp_loss_or_gradient_from_mlm_rows(mlm_data):
    config = helpers.tiny_config()
    config.model.num_layers, config.model.hidden_size, config.model.num_heads = 1, 32, 4
    config.model.intermediate_size = 64
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    batch = _read(mlm_data["rows", "none"])[0]
    # Ids folded into the tiny model's vocabulary: which words they are does not matter here, a small head does.
    batch.update({name: batch[name] % helpers.TINY_VOCAB for name in ("input_ids", "masked_lm_ids")})
    params = jax.jit(lambda rng: nn.meta.unbox(model.init(rng, **steps_lib.model_inputs(batch)))["params"])(
        jax.random.key(0))
    grad_fn = jax.jit(steps_lib.make_grad_fn(model, sharding_lib.logical_rules(config.mesh)))
    denominators = steps_lib.batch_denominators(batch)
    (loss, metrics), grads = grad_fn(params, batch, jax.random.key(1), *denominators)
    assert float(denominators[1]) == 1.0  # no NSP weight: a denominator of 1, not 0 (0 / 0 would be NaN)
    assert float(metrics["nsp_loss"]) == 0.0 and float(metrics["nsp_accuracy"]) == 0.0
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(metrics["mlm_loss"]))
    assert not any(np.asarray(leaf).any() for leaf in jax.tree.leaves(grads["nsp_head"]))
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(grads))
