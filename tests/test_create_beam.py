"""The Beam pipeline (optional extra): the same per-chunk transform, run by Beam's DirectRunner."""

import collections
import glob
import gzip
import json

import pytest
import tensorflow as tf

from bert_jax.data import corpus
from bert_jax.data import create
from bert_jax.data import create_beam
from bert_jax.data import tokenization
from tests import helpers

beam = pytest.importorskip("apache_beam", reason="the Beam pipeline is an optional extra: pip install -e .[beam]")

VOCAB = f"{helpers.FIXTURES}/vocab_uncased.txt"


def _write_corpus(directory):
    text = open(f"{helpers.FIXTURES}/sample_text.txt", encoding="utf-8").read().strip().split("\n\n")
    (directory / "a.txt").write_text("\n\n".join(text[:2]) + "\n\n", encoding="utf-8")
    (directory / "b.txt").write_text("\n\n".join(text[2:]) + "\n", encoding="utf-8")
    (directory / "empty.txt").write_text("\n\n", encoding="utf-8")
    return f"{directory}/*.txt"


@pytest.mark.parametrize("instances", ["pairs", "rows"])
def test_beam_pipeline_writes_the_chunk_transform_of_every_file(instances, tmp_path):
    source = _write_corpus(tmp_path)
    options = create.DataOptions(dupe_factor=3, seed=7, instances=instances)
    metadata = create_beam.run_beam_pipeline(source, VOCAB, str(tmp_path / "out"), options, num_shards=2,
                                             documents_per_chunk=2)
    written = [record for path in sorted(glob.glob(str(tmp_path / "out" / "train-*-of-00002.tfrecord")))
               for record in tf.data.TFRecordDataset(path).as_numpy_iterator()]
    # The same records as running the single-machine ChunkProcessor over each file's chunks.
    processor = create.ChunkProcessor(tokenization.load_tokenizer(VOCAB), options)
    expected = []
    for index, path in enumerate(sorted(glob.glob(source))):
        for task in create_beam.file_chunks(index, path, 2):
            expected.extend(processor(task)[0])
    assert collections.Counter(written) == collections.Counter(expected)
    assert len(written) == metadata["stats"]["instances"] > 10
    saved = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert saved["format"] == {"pairs": "masked", "rows": "mlm_masked"}[instances] and saved["num_shards"] == 2
    assert saved["instances"] == instances
    # And the records are the original layout: they parse with the original feature spec (MLM-only rows: no label).
    example = tf.train.Example.FromString(written[0]).features.feature
    assert len(example["input_ids"].int64_list.value) == 128
    assert len(example["masked_lm_positions"].int64_list.value) == 20
    assert ("next_sentence_labels" in example) == (instances == "pairs")


def test_beam_pipeline_refuses_to_overwrite_and_names_missing_input(tmp_path):
    options = create.DataOptions(dupe_factor=1)
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        create_beam.run_beam_pipeline(str(tmp_path / "nothing-here*.txt"), VOCAB, str(tmp_path / "out"),
                                      options, num_shards=1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train-00000-of-00001.tfrecord").write_bytes(b"")
    with pytest.raises(FileExistsError, match="already holds"):
        create_beam.run_beam_pipeline(_write_corpus(tmp_path), VOCAB, str(tmp_path / "out"), options,
                                      num_shards=1)


def test_beam_pipeline_reads_json_lines_as_create_does(tmp_path):
    """JSON Lines (one compressed) give the records of the same documents in the original layout, and each file's
    documents are create's (corpus.iter_documents in one process)."""
    # The sentences that read back as themselves: a record's lines are cut into sentences again.
    documents = [[sentence for sentence in document if corpus.split_sentences(sentence) == [sentence]]
                 for document in corpus.iter_documents(f"{helpers.FIXTURES}/sample_text.txt", text_format="lines")]
    layouts = {"text": tmp_path / "text", "jsonl": tmp_path / "jsonl"}
    for directory in layouts.values():
        directory.mkdir()
    for index, document in enumerate(documents):
        (layouts["text"] / f"{index}.txt").write_text("\n".join(document) + "\n\n", encoding="utf-8")
        line = json.dumps({"text": "\n".join(document), "id": index}) + "\n" + json.dumps({"id": -1}) + "\n"
        (layouts["jsonl"] / (f"{index}.jsonl.gz" if index else f"{index}.jsonl")).write_bytes(
            gzip.compress(line.encode()) if index else line.encode())
    options = create.DataOptions(dupe_factor=2, seed=3)
    written = {}
    for name, directory in layouts.items():
        metadata = create_beam.run_beam_pipeline(f"{directory}/*", VOCAB, str(tmp_path / f"out-{name}"), options,
                                                 num_shards=2, documents_per_chunk=2, skip_bad_records=True)
        assert metadata["stats"]["bad_records"] == (len(documents) if name == "jsonl" else 0)
        written[name] = collections.Counter(
            record for path in sorted(glob.glob(str(tmp_path / f"out-{name}" / "train-*.tfrecord")))
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator())
    assert written["jsonl"] == written["text"] and sum(written["jsonl"].values()) > 10
    # Records' prose reaches the workers uncut, and cuts into the sentences of a single process's reading.
    for path in sorted(glob.glob(f"{layouts['jsonl']}/*")):
        chunks = list(create_beam.file_chunks(0, path, 100, skip_bad_records=True))
        assert all(isinstance(document, corpus.Paragraphs) for _, chunk in chunks for document in chunk)
        assert [corpus.sentences_of(document) for _, chunk in chunks for document in chunk] == list(
            corpus.iter_documents(path, skip_bad_records=True))
