"""Pretraining data: corpus documents -> sentence-pair instances -> masked LM -> sharded TFRecords.

The algorithm is google-research/bert's create_pretraining_data.py, re-implemented on token ids. The corpus is
streamed in chunks of `documents_per_chunk` documents (in corpus order), and each chunk is processed exactly as the
original processes its whole input: `rng = random.Random(chunk_seed)`, shuffle the chunk's documents, then
`dupe_factor` passes creating instances document by document (masking each one as it is made), then shuffle the
chunk's instances. Every random draw happens in the original's order, so:

  * a corpus that fits in one chunk gives exactly the original tool's examples for the same seed (chunk 0 uses
    `seed` itself); the records are byte-identical up to the order of the feature-map entries, which protobuf
    leaves unspecified (the original's order changes from process to process; ours is always input_ids,
    input_mask, segment_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights, next_sentence_labels);
  * a larger corpus is the original algorithm applied per chunk. The one difference: a "random next" segment B
    for next-sentence prediction is drawn from another document of the same chunk, not of the whole corpus.

Worker processes handle chunks in parallel while the parent streams the corpus and deals records round-robin
into `num_shards` files; with at most two chunks per worker in flight, memory does not grow with the corpus. The
same seed, corpus and documents_per_chunk give the same bytes for any num_workers, the same records for any
num_shards.

Beyond the original:
  * sentence_order_prediction (ALBERT's SOP): B is always the text that really follows A; with probability 0.5
    A and B are swapped. next_sentence_labels is 1 when swapped, 0 for the original order, so "1 = not the true
    continuation" means the same as for NSP. A chunk of a single sentence is cut at a random token to get a pair.
  * masking="none": records hold only input_ids, input_mask, segment_ids and next_sentence_labels, for a
    pipeline that masks dynamically. (Skipping the masking draws changes the rng sequence, so these instances are
    not the unmasked twins of a static run.)
  * instances="rows" or "fragments": masked-LM-only instances of contiguous text without pairs or labels (the
    MLM-only layouts, no next_sentence_labels), see bert_jax.data.instances. short_seq_prob does not apply.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import json
import multiprocessing
import os
import posixpath
import random
import sys
import time
from typing import Callable, Iterable, Iterator, Sequence

from absl import logging
import tqdm

from bert_jax import fileio
from bert_jax import record_framing
from bert_jax import runtime
from bert_jax.data import corpus
from bert_jax.data import instances as instances_lib
from bert_jax.data import packing
from bert_jax.data import tfrecord
from bert_jax.data import tokenization
from bert_jax.data.instances import create_instances_from_document, create_masked_lm_predictions

MASKING_MODES = ("static", "none")
INSTANCE_KINDS = instances_lib.INSTANCE_KINDS
METADATA_FILE = "metadata.json"
TOKENIZER_DIR = "tokenizer"


@dataclasses.dataclass
class DataOptions:
    """How instances are made; the defaults are the original tool's flag defaults."""

    max_seq_length: int = 128  # tokens per instance including [CLS] and two [SEP]s; records are padded to it
    max_predictions_per_seq: int = 20  # masked positions per instance; records are padded to it
    masked_lm_prob: float = 0.15  # share of an instance's tokens ([CLS]/[SEP] counted) that is predicted
    short_seq_prob: float = 0.1  # chance that a document aims at a random shorter length
    dupe_factor: int = 10  # passes over each chunk, each with different pairings and masks
    whole_word_mask: bool = False  # mask all pieces of a word together
    sentence_order_prediction: bool = False  # SOP (ALBERT) pairs instead of NSP's random-next pairs
    masking: str = "static"  # "static" writes masks into the records; "none" leaves masking to the input pipeline
    seed: int = 12345  # seeds chunk 0 exactly like the original's --random_seed
    # "pairs" (the original's NSP/SOP sentence pairs), or MLM-only "rows" (a chunk's documents joined by [SEP] and
    # cut into full rows) or "fragments" (each document cut alone, for packing when read); no label for either.
    instances: str = "pairs"

    def validate(self) -> "DataOptions":
        """Raises ValueError naming the first bad field (and its command-line flag)."""
        def bad(field, flag, why):
            return ValueError(f"DataOptions.{field}={getattr(self, field)!r} (--{flag}): {why}")
        if not isinstance(self.max_seq_length, int) or self.max_seq_length < 5:
            raise bad("max_seq_length", "max_seq_length", "must be an integer >= 5 ([CLS], [SEP], [SEP] and at "
                      "least one token for each of the two segments)")
        if self.instances not in INSTANCE_KINDS:
            raise bad("instances", "instances", f"must be one of {INSTANCE_KINDS}")
        if self.instances != "pairs" and self.sentence_order_prediction:
            raise bad("instances", "instances", "MLM-only instances have no sentence pairs to order: use "
                      "instances='pairs' with sentence_order_prediction, or turn it off")
        if self.masking not in MASKING_MODES:
            raise bad("masking", "masking", f"must be one of {MASKING_MODES}")
        if self.masking == "static":
            if not isinstance(self.max_predictions_per_seq, int) or self.max_predictions_per_seq < 1:
                raise bad("max_predictions_per_seq", "max_predictions_per_seq", "must be an integer >= 1")
            if not 0.0 < self.masked_lm_prob <= 1.0:
                raise bad("masked_lm_prob", "masked_lm_prob", "must be in (0, 1]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise bad("short_seq_prob", "short_seq_prob", "must be in [0, 1]")
        if not isinstance(self.dupe_factor, int) or self.dupe_factor < 1:
            raise bad("dupe_factor", "dupe_factor", "must be an integer >= 1")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise bad("seed", "random_seed", "must be an integer")
        return self



# ---------------------------------------------------------------------------------------------------------------
# Chunks: the unit of work, run in worker processes (or in-process with num_workers=0).


def chunk_seed(seed: int, chunk_index: int) -> int | str:
    """Chunk 0 uses the seed itself (so a one-chunk corpus matches the original); the others a string, which
    random.Random hashes with SHA-512: the same on every run, platform and Python version."""
    return seed if chunk_index == 0 else f"{seed}:{chunk_index}"


class ChunkProcessor:
    """Turns one chunk of documents (lists of sentence strings) into serialized, shuffled records."""

    def __init__(self, tokenizer: tokenization.Tokenizer, options: DataOptions):
        self.tokenizer = tokenizer
        self.options = options
        self.mask_fn = None
        if options.masking == "static":
            mask_kwargs = dict(
                masked_lm_prob=options.masked_lm_prob, max_predictions_per_seq=options.max_predictions_per_seq,
                vocab_size=tokenizer.vocab_size, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
                mask_id=tokenizer.mask_id,
                # A list of bools indexes faster than a numpy array in the per-token loop.
                is_continuation=tokenizer.is_continuation.tolist() if options.whole_word_mask else None)
            self.mask_fn = lambda input_ids, rng: create_masked_lm_predictions(input_ids, rng, **mask_kwargs)

    def tokenize(self, documents: Sequence[Sequence[str]]) -> list[list[list[int]]]:
        """Ids per sentence in one batch call; sentences without tokens and then empty documents are dropped."""
        documents = [corpus.sentences_of(document) for document in documents]  # iter_documents(split=False)'s
        sentence_ids = self.tokenizer.encode_batch([sentence for document in documents for sentence in document])
        tokenized, start = [], 0
        for document in documents:
            sentences = [ids for ids in sentence_ids[start:start + len(document)] if ids]
            start += len(document)
            if sentences:
                tokenized.append(sentences)
        return tokenized

    def __call__(self, task: tuple[int, Sequence[Sequence[str]]]) -> tuple[list[bytes], dict]:
        chunk_index, documents = task
        options = self.options
        all_documents = self.tokenize(documents)
        rng = random.Random(chunk_seed(options.seed, chunk_index))
        instances_lib.shuffle(all_documents, rng)
        records = []
        encode = functools.partial(tfrecord.serialize_example, max_seq_length=options.max_seq_length,
                                   max_predictions_per_seq=options.max_predictions_per_seq)
        instances = tokens = predictions = random_next = 0
        lengths = collections.Counter()  # tokens per record: the padding fraction, and packing's, in metadata.json
        for instance in self._instances(all_documents, rng):
            records.append(encode(instance))
            instances += 1
            tokens += len(instance.input_ids)
            lengths[len(instance.input_ids)] += 1
            random_next += instance.next_sentence_label or 0
            if instance.masked_lm_positions is not None:
                predictions += len(instance.masked_lm_positions)
        # The shuffle depends on the count only, so shuffling the bytes matches the original shuffling instances.
        instances_lib.shuffle(records, rng)
        stats = {"corpus_documents": len(documents), "documents": len(all_documents),
                 "sentences": sum(len(document) for document in all_documents), "instances": instances,
                 "tokens": tokens, "predictions": predictions, "random_next": random_next, "lengths": lengths}
        return records, stats

    def _instances(self, all_documents, rng) -> Iterator[instances_lib.TrainingInstance]:
        """The chunk's instances in creation order: dupe_factor passes over its (shuffled) documents."""
        options, cls_id, sep_id = self.options, self.tokenizer.cls_id, self.tokenizer.sep_id
        common = dict(max_seq_length=options.max_seq_length, cls_id=cls_id, sep_id=sep_id, mask_fn=self.mask_fn)
        for pass_index in range(options.dupe_factor):
            if options.instances == "rows":
                yield from instances_lib.create_rows(all_documents, rng, first_pass=pass_index == 0, **common)
                continue
            for document_index in range(len(all_documents)):
                if options.instances == "fragments":
                    yield from instances_lib.create_fragments(all_documents[document_index], rng,
                                                              first_pass=pass_index == 0, **common)
                else:
                    yield from create_instances_from_document(
                        all_documents, document_index, rng, short_seq_prob=options.short_seq_prob,
                        sentence_order_prediction=options.sentence_order_prediction, **common)


_worker_processor: ChunkProcessor | None = None
_worker_error: BaseException | None = None


@contextlib.contextmanager
def _workers_without_main():
    """A spawned worker first imports its parent's __main__, for functions pickled from it. The workers get only this
    module's functions, our tokenizer and options, and text, so they skip it, unless this module is __main__ itself
    (the data command line): the driver's (bert_jax.main) imports JAX, Flax and Orbax, about 2 CPU-s a worker."""
    main = sys.modules.get("__main__")
    if __name__ == "__main__" or main is None:
        yield
        return
    spec, path = getattr(main, "__spec__", None), main.__dict__.pop("__file__", None)
    main.__spec__ = None  # multiprocessing reads the attribute, and an absent one would raise
    try:
        yield
    finally:
        main.__spec__ = spec
        if path is not None:
            main.__file__ = path


def _init_worker(tokenizer: tokenization.Tokenizer, options: DataOptions) -> None:
    # Each worker is one process on one core: the tokenizer's own thread pool would only oversubscribe the machine.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _worker_processor, _worker_error
    try:
        _worker_processor = ChunkProcessor(tokenizer, options)  # the tokenizer was rebuilt when unpickled
    except BaseException as error:  # pylint: disable=broad-except
        # Raised from an initializer, it would make the pool restart workers forever; a task reports it instead.
        _worker_error = error


def _run_in_worker(task):
    if _worker_error is not None:
        raise RuntimeError(f"pretraining-data worker failed to start: {_worker_error!r}") from _worker_error
    return _worker_processor(task)


def _chunks(documents: Iterable[list[str]], documents_per_chunk: int) -> Iterator[tuple[int, list[list[str]]]]:
    chunk = []
    chunk_index = 0
    for document in documents:
        chunk.append(document)
        if len(chunk) == documents_per_chunk:
            yield chunk_index, chunk
            chunk_index += 1
            chunk = []
    if chunk:
        yield chunk_index, chunk


def _ordered_bounded_map(pool, function, tasks: Iterable, max_in_flight: int) -> Iterator:
    """Like pool.imap, in order, but never reads more than `max_in_flight` tasks ahead: Pool.imap would pull the
    whole input iterator (the corpus) into its queue as fast as it can be read."""
    pending = collections.deque()
    for task in tasks:
        pending.append(pool.apply_async(function, (task,)))
        if len(pending) >= max_in_flight:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


# ---------------------------------------------------------------------------------------------------------------
# The driver: stream chunks through the workers, write shards, describe the result.


def shard_paths(output_dir: str, prefix: str, num_shards: int) -> list[str]:
    return [fileio.join(output_dir, f"{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord")
            for index in range(num_shards)]


def metadata_path(output_dir: str, prefix: str = "train") -> str:
    """metadata.json for the default prefix; `{prefix}.metadata.json` for others (e.g. an eval split beside it)."""
    return fileio.join(output_dir, METADATA_FILE if prefix == "train" else f"{prefix}.{METADATA_FILE}")


def _check_arguments(num_shards, num_workers, documents_per_chunk, prefix) -> None:
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards={num_shards!r} (--num_shards): must be an integer >= 1")
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers={num_workers!r} (--num_workers): must be >= 0 (0 = in this process)")
    if not isinstance(documents_per_chunk, int) or documents_per_chunk < 1:
        raise ValueError(f"documents_per_chunk={documents_per_chunk!r} (--documents_per_chunk): must be >= 1")
    if not prefix or "/" in prefix or prefix.startswith("."):
        raise ValueError(f"prefix={prefix!r} (--prefix): must be a plain file-name prefix such as 'train'")


def create_pretraining_data(source: str, tokenizer_path: str, output_dir: str, options: DataOptions, *,
                            num_shards: int = 1, num_workers: int | None = None, documents_per_chunk: int = 2000,
                            text_format: str = "auto", text_field: str = "text", skip_bad_records: bool = False,
                            prefix: str = "train", progress: bool = True,
                            overwrite: bool = False, do_lower_case: bool | None = None,
                            document_filter: Callable[[int], bool] | None = None) -> dict:
    """Writes `{output_dir}/{prefix}-IIIII-of-NNNNN.tfrecord`, the tokenizer and metadata.json; returns the metadata.

    source, text_format, text_field, skip_bad_records: see corpus.iter_documents. tokenizer_path: see
    tokenization.load_tokenizer (`do_lower_case` is passed on). num_workers: processes (default: all cores; 0 = this
    process; a corpus of one chunk is made in this process whatever the number). Shards already in output_dir with
    the same prefix are an error unless `overwrite`. A run that fails (a bad record, say) leaves no shard: they are
    written under hidden names, renamed only at the end. `document_filter(index)` keeps the corpus document with that
    0-based index when true, e.g. to hold every n-th document out for evaluation.
    """
    started = time.perf_counter()
    options.validate()
    num_workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    _check_arguments(num_shards, num_workers, documents_per_chunk, prefix)
    tokenizer = tokenization.load_tokenizer(tokenizer_path, do_lower_case=do_lower_case)

    pool = None

    def start_pool():
        nonlocal pool
        # Not fork: the tokenizers' thread pools (and TensorFlow, where a caller imported it) do not survive it.
        context = multiprocessing.get_context("spawn")
        with _workers_without_main():
            pool = context.Pool(num_workers, initializer=_init_worker, initargs=(tokenizer, options))
        return pool

    try:
        return _create(source, tokenizer, output_dir, options, start_pool if num_workers > 0 else None, started,
                       num_shards=num_shards, num_workers=num_workers, documents_per_chunk=documents_per_chunk,
                       text_format=text_format, text_field=text_field, skip_bad_records=skip_bad_records,
                       prefix=prefix, progress=progress, overwrite=overwrite, document_filter=document_filter)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()


def _create(source, tokenizer, output_dir, options, start_pool, started, *, num_shards, num_workers,
            documents_per_chunk, text_format, text_field, skip_bad_records, prefix, progress, overwrite,
            document_filter) -> dict:
    existing = fileio.glob(fileio.join(output_dir, f"{prefix}-*-of-*.tfrecord"))
    if existing and not overwrite:
        raise FileExistsError(f"{output_dir} already holds {len(existing)} '{prefix}' shard(s) (e.g. "
                              f"{existing[0]}); refusing to mix or replace data. Fix: choose another output_dir or "
                              "prefix, or pass overwrite=True (--overwrite) to replace them")
    fileio.makedirs(output_dir)
    final_paths = shard_paths(output_dir, prefix, num_shards)
    # Written under hidden names and renamed only after success, so a failed run leaves no file that looks whole.
    temporary_paths = [fileio.join(output_dir, f".{posixpath.basename(path)}.incomplete") for path in final_paths]
    writers = [record_framing.TFRecordWriter(path) for path in temporary_paths]

    corpus_stats = corpus.CorpusStats()
    try:
        results = _chunk_results(source, tokenizer, options, start_pool, corpus_stats, num_workers=num_workers,
                                 documents_per_chunk=documents_per_chunk, text_format=text_format,
                                 text_field=text_field, skip_bad_records=skip_bad_records,
                                 document_filter=document_filter)
        totals = _deal_records(results, writers, progress=progress)
        for writer in writers:
            writer.close()
        _check_not_empty(source, totals, corpus_stats)
        for stale in set(existing) - set(final_paths):
            fileio.remove(stale)
        for temporary, final in zip(temporary_paths, final_paths):
            fileio.rename(temporary, final)
    except BaseException:
        for writer in writers:
            writer.close()
        for path in temporary_paths:
            if fileio.exists(path):
                fileio.remove(path)
        raise

    tokenizer.save(fileio.join(output_dir, TOKENIZER_DIR))
    metadata = _metadata(source, tokenizer, options, corpus_stats, totals, elapsed=time.perf_counter() - started,
                         num_shards=num_shards, documents_per_chunk=documents_per_chunk, text_format=text_format,
                         text_field=text_field, prefix=prefix, final_paths=final_paths)
    with fileio.open_file(metadata_path(output_dir, prefix), "w") as stream:
        stream.write(json.dumps(metadata, indent=2) + "\n")
    _log_summary(metadata["stats"], num_shards, output_dir, has_labels=options.instances == "pairs")
    return metadata


def _chunk_results(source, tokenizer, options, start_pool, corpus_stats, *, num_workers, documents_per_chunk,
                   text_format, text_field, skip_bad_records, document_filter) -> Iterator[tuple[list[bytes], dict]]:
    """The corpus's chunks processed, in corpus order: (records, chunk stats) per chunk, computed lazily. In worker
    processes (`start_pool()` starts them) only for a corpus of more than one chunk."""
    # split=False: the workers cut prose into sentences (ChunkProcessor.tokenize), where the reading process would
    # be the bottleneck; the sentences, and so the records, are the same.
    documents = corpus.iter_documents(source, text_format=text_format, text_field=text_field,
                                      skip_bad_records=skip_bad_records, split=False, stats=corpus_stats)
    if document_filter is not None:
        documents = (document for index, document in enumerate(documents) if document_filter(index))
    tasks = _chunks(documents, documents_per_chunk)
    first_two = list(itertools.islice(tasks, 2)) if start_pool is not None else []
    if start_pool is None or len(first_two) < 2:
        # One chunk is one worker's work: here it needs no worker started (a spawned worker imports the calling
        # program's modules first: the driver's JAX, Flax and Orbax, seconds each time the driver makes data).
        return map(ChunkProcessor(tokenizer, options), itertools.chain(first_two, tasks))
    # Two chunks per worker keep every worker busy while the parent writes, and bound memory.
    return _ordered_bounded_map(start_pool(), _run_in_worker, itertools.chain(first_two, tasks), 2 * num_workers)


def _deal_records(results, writers, *, progress) -> collections.Counter:
    """Writes every chunk's records round-robin into `writers`; returns the chunks' stats summed, plus "chunks"."""
    num_shards = len(writers)
    totals, lengths = collections.Counter(), collections.Counter()
    next_writer = 0
    with tqdm.tqdm(unit=" docs", desc="documents", file=sys.stderr, dynamic_ncols=True,
                   disable=not (progress and sys.stderr.isatty())) as bar:
        for records, chunk_stats in results:
            for offset in range(num_shards):
                write = writers[(next_writer + offset) % num_shards].write
                for record in records[offset::num_shards]:
                    write(record)
            next_writer = (next_writer + len(records)) % num_shards
            lengths.update(chunk_stats["lengths"])
            totals.update({key: value for key, value in chunk_stats.items() if key != "lengths"})
            totals["chunks"] += 1
            bar.update(chunk_stats["corpus_documents"])
            bar.set_postfix(instances=totals["instances"], refresh=False)
    totals["lengths"] = lengths  # records per token count, for the padding figures
    return totals


def _check_not_empty(source, totals, corpus_stats) -> None:
    if not totals["documents"]:
        raise ValueError(f"corpus {source!r}: no document has a sentence with any token under this tokenizer "
                         f"({corpus_stats.documents} documents read). Fix: check the source and text_format")
    if not totals["instances"]:
        raise ValueError(f"corpus {source!r}: no instance could be made from {totals['documents']} documents "
                         "(each needs at least two tokens for sentence_order_prediction). Fix: use more text")


def _metadata(source, tokenizer, options, corpus_stats, totals, *, elapsed, num_shards, documents_per_chunk,
              text_format, text_field, prefix, final_paths) -> dict:
    layout = tfrecord.layout_of_options(options.masking == "static", options.instances == "pairs")
    return {
        "format": layout,
        "features": list(tfrecord.features_of(layout)),
        **{field: value for field, value in dataclasses.asdict(options).items() if field != "masking"},
        "next_sentence_labels": (None if options.instances != "pairs"  # MLM-only rows: no pair, no label
                                 else "0 = original order, 1 = A and B swapped" if options.sentence_order_prediction
                                 else "0 = B follows A, 1 = B is from a random document"),
        "num_shards": num_shards, "documents_per_chunk": documents_per_chunk, "source": source,
        "text_format": text_format, "text_field": text_field, "prefix": prefix,
        "files": [posixpath.basename(path) for path in final_paths],
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                      "do_lower_case": tokenizer.do_lower_case, **tokenizer.special_ids, "directory": TOKENIZER_DIR},
        "stats": {
            "files": corpus_stats.files, "skipped_lines": corpus_stats.skipped_lines,
            "bad_records": corpus_stats.bad_records, "characters": corpus_stats.characters,
            **{key: totals[key] for key in ("documents", "sentences", "chunks", "instances", "tokens", "predictions")},
            # Predictions per real token ([CLS] and [SEP] included, as in the original's count).
            "masked_fraction": totals["predictions"] / totals["tokens"],
            "nsp_random_fraction": totals["random_next"] / totals["instances"],  # the share of label 1
            "elapsed_s": round(elapsed, 3), "instances_per_s": round(totals["instances"] / elapsed, 1),
            # Fragments are made to be packed: their padding after packing too.
            **packing.padding_stats(totals["lengths"], max_seq_length=options.max_seq_length,
                                    packed=options.instances == "fragments", seed=options.seed),
        },
    }


def _log_summary(stats, num_shards, output_dir, has_labels: bool) -> None:
    # MLM-only instances carry no next-sentence label, so there is no label share to report.
    labels = f", label 1 in {100 * stats['nsp_random_fraction']:.1f}%" if has_labels else ""
    logging.info("wrote %d instances from %d documents (%d sentences, %d non-UTF-8 lines and %d bad records skipped) "
                 "into %d shard(s) in %s: %.1f s, %.0f instances/s, masked %.2f%% of tokens%s, padding %.1f%%",
                 stats["instances"], stats["documents"], stats["sentences"], stats["skipped_lines"],
                 stats["bad_records"], num_shards, output_dir, stats["elapsed_s"], stats["instances_per_s"],
                 100 * stats["masked_fraction"], labels, 100 * stats["padding_fraction"])


# ---------------------------------------------------------------------------------------------------------------
# Command line: the original tool's flag names where it has them.


def define_flags() -> None:
    # Defined only when run as a program, so importing the library adds nothing to a driver's flags.
    from absl import flags  # pylint: disable=import-outside-toplevel
    defaults = DataOptions()
    flags.DEFINE_string("input_file", None, "Corpus: comma-separated file globs (local or gs://; text, JSON Lines, "
                        "Parquet, CSV/TSV), 'tfds:NAME[:SPLIT][:FIELD]', or 'demo'.")
    flags.DEFINE_string("output_dir", None, "Directory for the TFRecord shards, tokenizer/ and metadata.json.")
    flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt, SentencePiece .model, or a saved tokenizer dir.")
    flags.DEFINE_bool("do_lower_case", None, "Lower-case the text (default: True for vocab.txt, the saved "
                      "setting for a tokenizer directory, False for a .model).")
    flags.DEFINE_bool("do_whole_word_mask", defaults.whole_word_mask, "Mask all pieces of a word together.")
    flags.DEFINE_integer("random_seed", defaults.seed, "Random seed for data generation.")
    for name, define, about in (
            ("max_seq_length", flags.DEFINE_integer, "Maximum sequence length."),
            ("max_predictions_per_seq", flags.DEFINE_integer, "Maximum masked LM predictions per sequence."),
            ("dupe_factor", flags.DEFINE_integer, "Passes over the data, with different masks."),
            ("masked_lm_prob", flags.DEFINE_float, "Masked LM probability."),
            ("short_seq_prob", flags.DEFINE_float, "Probability of aiming at a shorter sequence."),
            ("sentence_order_prediction", flags.DEFINE_bool, "ALBERT's sentence-order labels (1 = swapped)."),
    ):
        define(name, getattr(defaults, name), about)
    flags.DEFINE_enum("masking", defaults.masking, list(MASKING_MODES),
                      "'static' writes masks; 'none' writes unmasked records for dynamic masking.")
    flags.DEFINE_enum("instances", defaults.instances, list(INSTANCE_KINDS),
                      "'pairs': BERT's sentence pairs with NSP labels; MLM-only, no labels: 'rows' (documents "
                      "joined by [SEP], cut into full rows) or 'fragments' (documents cut alone, to be packed).")
    flags.DEFINE_integer("num_shards", 1, "Output files; records are dealt round-robin.")
    flags.DEFINE_integer("num_workers", None, "Worker processes (default: all cores; 0 = in this process).")
    flags.DEFINE_integer("documents_per_chunk", 2000, "Documents processed together (the original algorithm's "
                         "unit: NSP random segments come from the same chunk). Changing it changes the output.")
    flags.DEFINE_enum("text_format", "auto", list(corpus.TEXT_FORMATS),
                      "'auto': by file name (.jsonl/.json/.ndjson, .parquet, .csv, .tsv, each but Parquet also .gz "
                      "or .zst; anything else 'lines'); 'lines': one sentence per line, blank line between "
                      "documents; 'paragraphs': prose files; or 'jsonl', 'parquet', 'csv', 'tsv' for every file.")
    flags.DEFINE_string("text_field", "text", "The field (JSON Lines) or column (Parquet, CSV/TSV) holding each "
                        "record's text.")
    flags.DEFINE_bool("skip_bad_records", False, "Skip and count records without text in text_field (missing, "
                      "not a string, not JSON) instead of stopping at the first.")
    flags.DEFINE_string("prefix", "train", "Shard file-name prefix.")
    flags.DEFINE_bool("overwrite", False, "Replace shards with the same prefix already in output_dir.")
    flags.DEFINE_bool("progress", True, "Show a progress bar (only on a terminal).")
    flags.mark_flags_as_required(["input_file", "output_dir", "vocab_file"])


def options_from_flags(values) -> DataOptions:
    """The DataOptions of define_flags' flags (this command's and the Beam pipeline's), validated; a bad value is a
    UsageError naming its flag."""
    from absl import app  # pylint: disable=import-outside-toplevel
    same_names = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "short_seq_prob", "dupe_factor",
                  "sentence_order_prediction", "masking", "instances")
    options = DataOptions(whole_word_mask=values.do_whole_word_mask, seed=values.random_seed,
                          **{name: values[name].value for name in same_names})
    try:
        return options.validate()
    except ValueError as error:
        raise app.UsageError(str(error)) from None


def _main(argv) -> None:
    from absl import app, flags  # pylint: disable=import-outside-toplevel
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = flags.FLAGS
    options = options_from_flags(values)
    create_pretraining_data(values.input_file, values.vocab_file, values.output_dir, options,
                            num_shards=values.num_shards, num_workers=values.num_workers,
                            documents_per_chunk=values.documents_per_chunk, text_format=values.text_format,
                            text_field=values.text_field, skip_bad_records=values.skip_bad_records,
                            prefix=values.prefix, progress=values.progress, overwrite=values.overwrite,
                            do_lower_case=values.do_lower_case)


if __name__ == "__main__":
    from absl import app as _app  # pylint: disable=import-outside-toplevel
    define_flags()
    _app.run(lambda argv: runtime.run_reporting_user_errors(_main, argv))
