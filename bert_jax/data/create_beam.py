"""Pretraining data for corpora beyond one machine: the same per-chunk transform as an Apache Beam pipeline.

`pip install -e .[beam]`, then for example
    python -m bert_jax.data.create_beam --input_file='gs://bucket/text/*.txt' --vocab_file=gs://bucket/vocab.txt \
        --output_dir=gs://bucket/data --num_shards=1024 -- --runner=DataflowRunner --project=... --region=...
(everything after `--` goes to Beam as pipeline options; without it the local DirectRunner runs).

Each input file (any layout bert_jax.data.corpus reads: text, JSON Lines, Parquet, CSV/TSV, .gz or .zst) is read by
one worker and cut into chunks of `documents_per_chunk` documents; each chunk goes through
exactly the `ChunkProcessor` that `bert_jax.data.create` uses (the original create_pretraining_data.py
algorithm per chunk) with `random.Random(f"{seed}:{file_index}/{chunk_index}")`, files numbered in sorted order.
Differences from the single-machine tool, both for the sake of reading files in parallel: a document never spans
two files (the original carries a document on into the next file when a file does not end with a blank line), and
chunk seeds are per file, so the instances are not the single-machine tool's. They are deterministic for a seed:
the same set of records on any runner and any number of workers. Shards hold them in the order the runner writes.
"""

import json
import os

from absl import app
from absl import flags
from absl import logging

from bert_jax import fileio
from bert_jax import runtime
from bert_jax.data import corpus
from bert_jax.data import create
from bert_jax.data import tfrecord
from bert_jax.data import tokenization

_COUNTERS = ("documents", "sentences", "instances", "tokens", "predictions", "random_next")


def _import_beam():
    try:
        import apache_beam as beam  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError("the Beam pipeline needs Apache Beam: pip install -e '.[beam]' (or apache-beam)") from error
    return beam


def file_chunks(file_index: int, path: str, documents_per_chunk: int, text_format: str = "auto",
                text_field: str = "text", skip_bad_records: bool = False, stats: corpus.CorpusStats | None = None):
    """(chunk key, documents) for one file; an empty file yields nothing. See corpus.iter_documents for the rest.
    Prose comes uncut (Paragraphs): ProcessChunk's ChunkProcessor cuts it after the Reshuffle, in parallel, where
    this step has one worker per file."""
    documents = corpus.iter_documents(path, text_format=text_format, text_field=text_field,
                                      skip_bad_records=skip_bad_records, split=False, stats=stats)
    chunk, chunk_index = [], 0
    try:
        for document in documents:
            chunk.append(document)
            if len(chunk) == documents_per_chunk:
                yield f"{file_index}/{chunk_index}", chunk
                chunk, chunk_index = [], chunk_index + 1
    except corpus.EmptyCorpusError:  # raised only for a file that yielded no document
        return
    if chunk:
        yield f"{file_index}/{chunk_index}", chunk


def build_pipeline(pipeline, source: str, tokenizer_path: str, output_dir: str,
                   options: create.DataOptions, *, num_shards: int, documents_per_chunk: int = 2000,
                   text_format: str = "auto", text_field: str = "text", skip_bad_records: bool = False,
                   prefix: str = "train"):
    """Adds the transform to `pipeline` (a beam.Pipeline); returns the write result."""
    beam = _import_beam()
    options.validate()
    files = corpus.resolve_files(source)  # raises FileNotFoundError naming a pattern that matches nothing

    class ReadFile(beam.DoFn):
        def setup(self):
            self.bad_records = beam.metrics.Metrics.counter("bert_jax", "bad_records")

        def process(self, indexed_path):
            stats = corpus.CorpusStats()
            yield from file_chunks(*indexed_path, documents_per_chunk, text_format, text_field, skip_bad_records,
                                   stats)
            self.bad_records.inc(stats.bad_records)

    class ProcessChunk(beam.DoFn):
        def setup(self):
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            self.processor = create.ChunkProcessor(tokenization.load_tokenizer(tokenizer_path), options)
            self.counters = {name: beam.metrics.Metrics.counter("bert_jax", name) for name in _COUNTERS}

        def process(self, task):
            records, stats = self.processor(task)
            for name in _COUNTERS:
                self.counters[name].inc(stats[name])
            yield from records

    return (pipeline
            | "Files" >> beam.Create(list(enumerate(files)))
            | "Chunks" >> beam.ParDo(ReadFile())
            | "Spread" >> beam.Reshuffle()
            | "Instances" >> beam.ParDo(ProcessChunk())
            | "Write" >> beam.io.WriteToTFRecord(
                os.path.join(output_dir, prefix), file_name_suffix=".tfrecord", num_shards=num_shards,
                shard_name_template="-SSSSS-of-NNNNN"))


def run_beam_pipeline(source: str, tokenizer_path: str, output_dir: str, options: create.DataOptions, *,
                      num_shards: int, documents_per_chunk: int = 2000, text_format: str = "auto",
                      text_field: str = "text", skip_bad_records: bool = False, prefix: str = "train",
                      pipeline_args: list[str] | None = None) -> dict:
    """Runs the pipeline to completion and writes `metadata.json` beside the shards; returns the metadata."""
    beam = _import_beam()
    tokenizer = tokenization.load_tokenizer(tokenizer_path)
    if fileio.glob(fileio.join(output_dir, f"{prefix}-*-of-*.tfrecord")):
        raise FileExistsError(f"{output_dir} already holds {prefix}-*.tfrecord shards; choose another --output_dir "
                              "or --prefix")
    pipeline_options = beam.options.pipeline_options.PipelineOptions(pipeline_args or [])
    with beam.Pipeline(options=pipeline_options) as pipeline:
        build_pipeline(pipeline, source, tokenizer_path, output_dir, options, num_shards=num_shards,
                       documents_per_chunk=documents_per_chunk, text_format=text_format, text_field=text_field,
                       skip_bad_records=skip_bad_records, prefix=prefix)
    result = pipeline.result
    counters = {result_counter.key.metric.name: result_counter.committed
                for result_counter in result.metrics().query()["counters"]}
    stats = {name: int(counters.get(name, 0)) for name in (*_COUNTERS, "bad_records")}
    if not stats["instances"]:
        raise ValueError(f"the corpus {source!r} gave no instances: its files hold no non-empty sentences")
    tokenizer.save(os.path.join(output_dir, create.TOKENIZER_DIR))
    layout = tfrecord.layout_of_options(options.masking == "static", options.instances == "pairs")
    metadata = {"format": layout, "features": list(tfrecord.features_of(layout)), "runner": "beam",
                **{key: getattr(options, key) for key in ("max_seq_length", "max_predictions_per_seq",
                                                          "masked_lm_prob", "whole_word_mask", "instances",
                                                          "sentence_order_prediction", "dupe_factor", "seed")},
                "num_shards": num_shards, "files": fileio.glob(fileio.join(output_dir, f"{prefix}-*-of-*.tfrecord")),
                "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                              "do_lower_case": tokenizer.do_lower_case, **tokenizer.special_ids},
                "stats": {**stats, "nsp_random_fraction": stats["random_next"] / stats["instances"],
                          "masked_fraction": stats["predictions"] / max(stats["tokens"], 1)}}
    with fileio.open_file(create.metadata_path(output_dir, prefix), "w") as stream:
        json.dump(metadata, stream, indent=2)
    logging.info("beam: wrote %d instances into %d shards in %s", stats["instances"], num_shards, output_dir)
    return metadata


def _main(argv):
    flag_values = flags.FLAGS
    # absl leaves everything after `--` in argv: those are the Beam pipeline options.
    options = create.options_from_flags(flag_values)
    run_beam_pipeline(flag_values.input_file, flag_values.vocab_file, flag_values.output_dir, options,
                      num_shards=flag_values.num_shards, documents_per_chunk=flag_values.documents_per_chunk,
                      text_format=flag_values.text_format, text_field=flag_values.text_field,
                      skip_bad_records=flag_values.skip_bad_records, prefix=flag_values.prefix,
                      pipeline_args=argv[1:])


if __name__ == "__main__":
    create.define_flags()
    app.run(lambda argv: runtime.run_reporting_user_errors(_main, argv))
