"""Corpora as they are distributed (bert_jax.data.corpus_formats): JSON Lines (plain, .gz, .zst), Parquet, CSV and TSV
give the instances of the same documents in the original layout; bad records stop a run with one message (or are
skipped and counted); files that are not what their names say are refused, never read as text lines."""

import csv
import gzip
import io
import json
import logging
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bert_jax import record_framing
from bert_jax.data import corpus
from bert_jax.data import corpus_formats
from bert_jax.data import create
from tests import helpers

SAMPLE_TEXT = f"{helpers.FIXTURES}/sample_text.txt"
VOCAB = f"{helpers.FIXTURES}/vocab_uncased.txt"
OPTIONS = create.DataOptions(dupe_factor=2, seed=11)


def _documents():
    """sample_text.txt's documents, keeping the sentences that corpus.split_sentences gives back unchanged: a record's
    lines are split again, so only those read back as themselves whatever splitter it uses."""
    documents = [[sentence for sentence in document if corpus.split_sentences(sentence) == [sentence]]
                 for document in corpus.iter_documents(SAMPLE_TEXT, text_format="lines")]
    assert len(documents) == 3 and all(documents) and sum(map(len, documents)) >= 20
    return documents


def _texts(documents):
    # A blank record (dropped as a document without sentences, not a bad one) between the real ones.
    return ["\n".join(documents[0]), "   ", *("\n".join(document) for document in documents[1:])]


def _csv_bytes(texts, delimiter):
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, delimiter=delimiter)
    writer.writerow(["id", "text", "url"])
    writer.writerows([index, text, f"https://example.com/{index}"] for index, text in enumerate(texts))
    return buffer.getvalue().encode("utf-8")


def _write_formats(directory, documents):
    """The same documents in every layout: {file name: path}."""
    texts = _texts(documents)
    jsonl = "".join(json.dumps({"id": index, "text": text, "meta": {"lang": "en"}}) + "\n"
                    for index, text in enumerate(texts)).encode("utf-8")
    files = {"corpus.txt": "".join("\n".join(document) + "\n\n" for document in documents).encode("utf-8"),
             "corpus.jsonl": jsonl, "corpus.jsonl.gz": gzip.compress(jsonl),
             # Two frames, as parallel compressors (zstd -T, pzstd) write them: one stream.
             "corpus.jsonl.zst": b"".join(map(zstandard.ZstdCompressor().compress, (jsonl[:100], jsonl[100:]))),
             "corpus.csv": _csv_bytes(texts, ","), "corpus.csv.zst": zstandard.ZstdCompressor().compress(
                 _csv_bytes(texts, ",")), "corpus.tsv": _csv_bytes(texts, "\t")}
    files["corpus.txt.zst"] = zstandard.ZstdCompressor().compress(files["corpus.txt"])
    paths = {}
    for name, data in files.items():
        paths[name] = str(directory / name)
        with open(paths[name], "wb") as file:
            file.write(data)
    paths["corpus.parquet"] = str(directory / "corpus.parquet")
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), paths["corpus.parquet"],
                   row_group_size=2)
    assert pq.ParquetFile(paths["corpus.parquet"]).num_row_groups == 2
    return paths


def _shards(directory):
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name.endswith(".tfrecord")}


def test_every_layout_gives_the_instances_of_the_original_layout(tmp_path):
    documents = _documents()
    paths = _write_formats(tmp_path, documents)
    made = {}
    for name, path in paths.items():
        assert list(corpus.iter_documents(path)) == documents, name
        output_dir = str(tmp_path / f"out-{name}")
        metadata = create.create_pretraining_data(path, VOCAB, output_dir, OPTIONS, num_shards=2, num_workers=0,
                                                  documents_per_chunk=2, progress=False)
        assert metadata["stats"]["documents"] == 3 and metadata["stats"]["bad_records"] == 0, name
        made[name] = _shards(output_dir)
    reference = made.pop("corpus.txt")
    assert len(reference) == 2 and all(reference.values())
    for name, shards in made.items():
        assert shards == reference, f"{name} gave other records than the original layout"
    # An explicit format reads a file whatever its name.
    renamed = str(tmp_path / "records.data")
    os.rename(paths["corpus.jsonl.gz"], renamed + ".gz")
    assert list(corpus.iter_documents(renamed + ".gz", text_format="jsonl")) == documents


def test_parquet_row_group_batches_give_the_documents_of_a_whole_read(tmp_path, monkeypatch):
    texts = [f"Record {index} opens here.\nIts line two.\n\nA third line {index}." if index % 7 else ""
             for index in range(50)]
    path = str(tmp_path / "many.parquet")
    pq.write_table(pa.table({"text": texts, "n": list(range(50))}), path, row_group_size=8)
    assert pq.ParquetFile(path).num_row_groups == 7
    monkeypatch.setattr(corpus_formats, "_PARQUET_BATCH_ROWS", 3)  # batches end inside row groups
    whole = pq.read_table(path).column("text").to_pylist()
    record_document = corpus._record_document  # pylint: disable=protected-access
    expected = [document for document in map(record_document, whole) if document]
    assert list(corpus.iter_documents(path)) == expected
    assert len(expected) == 42 and expected[0] == ["Record 1 opens here.", "Its line two.", "A third line 1."]


def test_remote_files_stream_through_fileio(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    documents = _documents()
    paths = _write_formats(tmp_path, documents)
    # ram:// goes through tf.io.gfile as gs:// does: globbed, and Parquet read by seeking in a GFile.
    remote = f"ram://{tmp_path.name}"
    for name in ("corpus.parquet", "corpus.jsonl.zst", "corpus.tsv"):
        tf.io.gfile.copy(paths[name], f"{remote}/{name}")
    assert list(corpus.iter_documents(f"{remote}/corpus.*")) == documents * 3


def _bad_cases(tmp_path):
    """(file, message parts): each holds good records, then a bad one, then good ones again."""
    good = [{"text": f"Good record {index} has a sentence.\nAnd another one."} for index in range(3)]

    def jsonl(name, bad_line):
        path = tmp_path / name
        path.write_bytes(b"".join([*(json.dumps(record).encode() + b"\n" for record in good), bad_line,
                                   json.dumps(good[0]).encode() + b"\n"]))
        return str(path)

    def parquet(name, table, row_group_size=2):
        path = str(tmp_path / name)
        pq.write_table(table, path, row_group_size=row_group_size)
        return path

    good_texts = [record["text"] for record in good]
    return [
        (jsonl("missing.jsonl", b'{"content": "No text field."}\n'), ["line 4", "'text' is missing", "'content'"]),
        (jsonl("number.jsonl", b'{"text": 42}\n'), ["line 4", "'text' is a number, not a string"]),
        (jsonl("null.jsonl", b'{"text": null}\n'), ["line 4", "'text' is null"]),
        (jsonl("broken.jsonl", b'{"text": "cut off\n'), ["line 4", "not a JSON line"]),
        (jsonl("array.jsonl", b'["text"]\n'), ["line 4", "holds an array, not an object"]),
        (parquet("null.parquet", pa.table({"text": [*good_texts, None, good_texts[0]]})),
         ["row group 1, row 1", "'text' is null", "holds 1 null 'text' values"]),
        (parquet("nocolumn.parquet", pa.table({"body": good_texts})), ["no column 'text'", "'body'", "all 3 rows"]),
        (parquet("ints.parquet", pa.table({"text": [1, 2, 3]})), ["column 'text' holds int64, not strings"]),
        (str(tmp_path / "nocolumn.csv"), ["line 1 (the header)", "no column 'text'", "'body'"]),
        (str(tmp_path / "short.tsv"), ["line 3", "none in column 'text'"]),
    ]


def _write_bad_csvs(tmp_path):
    (tmp_path / "nocolumn.csv").write_text("id,body\n1,Some text.\n", encoding="utf-8")
    (tmp_path / "short.tsv").write_text("id\ttext\n1\tGood one here.\n2\n", encoding="utf-8")


def test_each_bad_record_stops_the_run_with_one_message_and_nothing_written(tmp_path, monkeypatch):
    _write_bad_csvs(tmp_path)
    framed = []
    frame_record = record_framing.frame_record
    monkeypatch.setattr(record_framing, "frame_record", lambda record: framed.append(record) or frame_record(record))
    for index, (path, parts) in enumerate(_bad_cases(tmp_path)):
        output_dir = tmp_path / f"out{index}"
        framed.clear()
        # A chunk per document: the first chunks' records are in the (hidden) shards when the bad record is met.
        with pytest.raises(corpus_formats.BadRecordError) as raised:
            create.create_pretraining_data(path, VOCAB, str(output_dir), OPTIONS, num_shards=2, num_workers=0,
                                           documents_per_chunk=1, progress=False)
        message = str(raised.value)
        for part in [repr(path), *parts, "--skip_bad_records"]:
            assert part in message, (path, message)
        assert not os.listdir(output_dir), f"{path}: a failed run left {os.listdir(output_dir)}"
        assert framed or "nocolumn" in path or "ints" in path, f"{path}: nothing was written before the bad record"


def test_skip_bad_records_skips_counts_and_warns_once_per_file(tmp_path, caplog):
    _write_bad_csvs(tmp_path)
    cases = _bad_cases(tmp_path)
    jsonl_files = [path for path, _ in cases if path.endswith(".jsonl")]
    stats = corpus.CorpusStats()
    with caplog.at_level(logging.WARNING, logger=corpus_formats.__name__):
        documents = list(corpus.iter_documents(",".join(jsonl_files), skip_bad_records=True, stats=stats))
    assert len(documents) == 4 * len(jsonl_files) and stats.bad_records == len(jsonl_files)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == len(jsonl_files)
    assert all("skipped 1 bad record(s)" in warning and "line 4" in warning for warning in warnings)
    # A file without the column counts its every row; the counts reach metadata.json.
    source = ",".join(path for path, _ in cases if path.endswith((".parquet", ".tsv")))
    metadata = create.create_pretraining_data(source, VOCAB, str(tmp_path / "out"), OPTIONS, num_workers=0,
                                              skip_bad_records=True, progress=False)
    assert metadata["stats"]["bad_records"] == 1 + 3 + 3 + 1
    assert json.loads((tmp_path / "out" / "metadata.json").read_text())["stats"]["bad_records"] == 8


def test_files_that_are_not_what_their_names_say_are_refused(tmp_path):
    documents = _documents()
    paths = _write_formats(tmp_path, documents)
    lying = {"parquet.txt": ("corpus.parquet", "is a Parquet file"), "gzip.txt": ("corpus.jsonl.gz", "gzip"),
             "zstd.jsonl": ("corpus.jsonl.zst", "Zstandard"), "records.txt": ("corpus.jsonl", "looks like JSON Lines")}
    for name, (original, message) in lying.items():
        path = str(tmp_path / name)
        os.link(paths[original], path)
        with pytest.raises(corpus_formats.UnknownFileFormatError, match=message):
            create.create_pretraining_data(path, VOCAB, str(tmp_path / "out"), OPTIONS, num_workers=0,
                                           progress=False)
        assert not os.listdir(tmp_path / "out")
    with pytest.raises(corpus_formats.UnknownFileFormatError, match="rename it gzip.txt.gz"):
        list(corpus.iter_documents(str(tmp_path / "gzip.txt")))
    # Binary data (NUL bytes) is refused even as explicit "lines"; JSON-looking lines are read when asked to.
    (tmp_path / "utf16.txt").write_bytes("Some text.\n".encode("utf-16"))
    with pytest.raises(corpus_formats.UnknownFileFormatError, match="11 of its first 24 bytes are NUL bytes"):
        list(corpus.iter_documents(str(tmp_path / "utf16.txt"), text_format="lines"))
    assert list(corpus.iter_documents(str(tmp_path / "records.txt"), text_format="lines"))[0][0].startswith('{"id"')
    (tmp_path / "stray.txt").write_bytes(b"A stray \x00 in crawled text.\n" + b"Is still text.\n" * 10)
    assert len(list(corpus.iter_documents(str(tmp_path / "stray.txt")))[0]) == 11


def test_the_command_line_prints_one_message_for_a_bad_record(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "A good record."}\n{"body": "Not one."}\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.data.create", f"--input_file={path}", f"--vocab_file={VOCAB}",
         f"--output_dir={tmp_path / 'out'}", "--num_workers=0", "--noprogress"],
        capture_output=True, text=True, check=False, cwd=helpers.ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(helpers.ROOT)})
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("bert_jax: error: ")]
    assert len(errors) == 1 and f"{path}', line 2: field 'text' is missing" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not os.listdir(tmp_path / "out")


def test_the_driver_makes_its_data_from_json_lines(tmp_path):
    from bert_jax import job_config  # pylint: disable=import-outside-toplevel
    from bert_jax.data import workdir  # pylint: disable=import-outside-toplevel
    from configs import pretrain  # pylint: disable=import-outside-toplevel
    paths = _write_formats(tmp_path, _documents())
    config = pretrain.get_config("size=tiny,data=corpus")
    config.data.corpus, config.data.vocab_file = paths["corpus.jsonl.zst"], VOCAB
    config.data.eval_every_nth_document = 0
    job_config.validate(config, "train", 8)
    prepared = workdir.prepare(config, str(tmp_path / "run"))
    ready = json.loads((tmp_path / "run" / "data" / "READY.json").read_text())
    assert ready["stats"]["train"]["documents"] == 3 and prepared.data.source == "tfrecord"
    assert ready["settings"]["corpus_field"] == "text" and ready["settings"]["corpus_format"] == "auto"
    # A workdir made before these settings existed ("lines", no field) is still the same data for a text corpus.
    old = {key: value for key, value in ready["settings"].items() if key not in ("corpus_field", "skip_bad_records")}
    text_config = pretrain.get_config("size=tiny,data=corpus")
    text_config.data.corpus = paths["corpus.txt"]
    saved_settings = workdir._saved_settings  # pylint: disable=protected-access
    assert saved_settings({**old, "corpus_format": "lines"}, text_config)["corpus_format"] == "auto"
    assert saved_settings({**old, "corpus_format": "lines"}, config)["corpus_format"] == "lines"  # records differ
    for field, value, message in (("corpus_format", "xml", "--config.data.corpus_format='xml'"),
                                  ("corpus_field", "", "--config.data.corpus_field=''")):
        bad = pretrain.get_config("size=tiny,data=corpus")
        bad.data[field] = value
        with pytest.raises(ValueError, match=message):
            job_config.validate(bad, "train", 8)


def test_the_format_benchmarks_corpora_hold_the_same_documents_in_every_format(tmp_path):
    """bert_jax.benchmarks.data --mode=formats times each format on the same documents: its writers give, read back,
    the same documents as its original-layout text (a record's lines are split again, which may cut a sentence in two
    and moves whitespace, so each document's characters other than whitespace are compared)."""
    from bert_jax.benchmarks import data as benchmark  # pylint: disable=import-outside-toplevel
    read = {}
    for fmt in benchmark.FORMATS:
        path = str(tmp_path / f"corpus.{fmt}")
        benchmark.write_corpus(path, fmt, 60_000)
        read[fmt] = ["".join("".join(document).split()) for document in corpus.iter_documents(path)]
    assert len(read["txt"]) >= 20
    assert all(documents == read["txt"] for documents in read.values()), {
        fmt: len(documents) for fmt, documents in read.items()}


def test_prose_cut_into_sentences_by_the_workers_gives_the_records_of_the_cut_text(tmp_path):
    """create cuts records' prose into sentences in its worker processes (iter_documents(split=False), then
    ChunkProcessor); the records are those of the same sentences cut first and written in the original layout."""
    lines = [line for line in open(SAMPLE_TEXT, encoding="utf-8").read().split("\n\n") if line.strip()]
    prose = [" ".join(document.split("\n")) for document in lines]  # each document one paragraph of prose
    jsonl = tmp_path / "prose.jsonl"
    jsonl.write_text("".join(json.dumps({"text": text}) + "\n" for text in prose), encoding="utf-8")
    cut = list(corpus.iter_documents(str(jsonl)))
    assert all(isinstance(document, corpus.Paragraphs) and len(document) == 1
               for document in corpus.iter_documents(str(jsonl), split=False))
    assert sum(map(len, cut)) > 2 * len(cut)  # the prose really was cut
    text = tmp_path / "cut.txt"
    text.write_text("".join("\n".join(document) + "\n\n" for document in cut), encoding="utf-8")
    made = []
    for path in (jsonl, text):
        output_dir = str(tmp_path / f"out-{path.name}")
        create.create_pretraining_data(str(path), VOCAB, output_dir, OPTIONS, num_workers=2, documents_per_chunk=1,
                                       progress=False)
        made.append(_shards(output_dir))
    assert made[0] == made[1] and all(made[0].values())
