"""Benchmark of pretraining-data creation: this project's tool against the original google-research/bert one, and
creation from each corpus format.

    python -m bert_jax.benchmarks.data [--original_dir=/path/to/google-research-bert-checkout]
    python -m bert_jax.benchmarks.data --mode=formats [--format_mb=50 --large_gb=1]

Builds a ~1.1 MB corpus in the original layout from the offline demo corpus, runs ours (all cores, static masking,
seq 128, 20 predictions, dupe_factor 5, the uncased BERT vocab) and, with --original_dir, the original
create_pretraining_data.py with the same flags; then ours again on a ~10x larger corpus (the demo documents
repeated in shuffled orders) to show that peak memory does not grow with the corpus. Every run is a subprocess:
wall time includes interpreter and library start-up, and peak memory is the largest sum of resident set sizes of
the process and all its children, sampled every 50 ms.

--mode=formats writes the same documents (the demo corpus's, repeated in shuffled orders) as original-layout text,
JSON Lines (plain, .gz, .zst), Parquet and a CSV column, `--format_mb` of JSON Lines each, and makes unmasked
instances (dupe_factor 1) from each; then from `--large_gb` of JSON Lines and of original-layout text holding the same
documents, to show peak memory flat in the corpus size. Tokens/s per core counts the instances' tokens ([CLS] and
[SEP] included) over the wall time and the cores.
"""

import csv
import functools
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import psutil

from bert_jax import record_framing
from bert_jax.data import corpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
DEFAULT_VOCAB = os.path.join(ROOT, "tests", "fixtures", "google_bert", "vocab_uncased.txt")
# The flags both tools get: the original's README example, with dupe_factor 5.
COMMON_FLAGS = ["--do_lower_case=True", "--max_seq_length=128", "--max_predictions_per_seq=20",
                "--masked_lm_prob=0.15", "--random_seed=12345", "--dupe_factor=5"]

FLAGS = flags.FLAGS
FORMATS = ("txt", "jsonl", "jsonl.gz", "jsonl.zst", "parquet", "csv")


def define_flags() -> None:
    # Defined only when run as a program: importing the corpus writers (tests do) adds no flags.
    flags.DEFINE_string("original_dir", None, "Directory holding the original bert/ package "
                        "(create_pretraining_data.py and tokenization.py); runs it for comparison when set.")
    flags.DEFINE_string("vocab_file", DEFAULT_VOCAB, "WordPiece vocab.txt for both tools.")
    flags.DEFINE_string("work_dir", None, "Where corpora and outputs go (default: a temporary directory, removed).")
    flags.DEFINE_float("corpus_mb", 1.1, "Size of the small corpus in MB (cut at a document boundary).")
    flags.DEFINE_integer("scale", 10, "The large corpus is this many shuffled copies of the demo documents' prefix.")
    flags.DEFINE_integer("num_workers", None, "Worker processes for ours (default: all cores).")
    flags.DEFINE_integer("documents_per_chunk", 100, "Ours: documents per chunk. Small enough that the small corpus "
                         "makes several chunks, so that every core has work.")
    flags.DEFINE_bool("original_on_large", False, "Also run the original on the large corpus (slow, memory-hungry).")
    flags.DEFINE_enum("mode", "original", ["original", "formats"], "'original': ours against the original tool; "
                      "'formats': creation from each corpus format.")
    flags.DEFINE_float("format_mb", 50, "--mode=formats: MB of JSON Lines per format (the same documents in each).")
    flags.DEFINE_float("large_gb", 1.0, "--mode=formats: GB of JSON Lines (and the same text in the original layout) "
                       "for the memory-in-corpus-size rows; 0 skips them.")


def _documents(text: str) -> list[str]:
    return [document for document in text.split("\n\n") if document.strip()]


def build_corpora(work_dir: str, corpus_mb: float, scale: int) -> tuple[str, str]:
    """The small corpus (a prefix of the demo documents) and the large one (`scale` shuffled copies of it)."""
    documents = _documents(corpus.demo_corpus_text())
    limit = int(corpus_mb * 1e6)
    small, size = [], 0
    for document in documents:
        if size >= limit:
            break
        small.append(document)
        size += len(document.encode("utf-8")) + 2
    small_path = os.path.join(work_dir, "corpus_small.txt")
    with open(small_path, "w", encoding="utf-8") as stream:
        stream.write("".join(document + "\n\n" for document in small))
    large_path = os.path.join(work_dir, "corpus_large.txt")
    with open(large_path, "w", encoding="utf-8") as stream:
        for copy in range(scale):
            shuffled = list(small)
            random.Random(copy).shuffle(shuffled)
            stream.write("".join(document + "\n\n" for document in shuffled))
    return small_path, large_path


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.Error:  # exited between listing and reading
            pass
    return total


def measure(command: list[str], cwd: str, env: dict) -> tuple[float, int]:
    """Runs `command`; returns (wall seconds, peak resident bytes of its process tree). Raises on failure."""
    # stderr goes to a file: a pipe nobody reads would fill up with the original's logging and stall it.
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        process = psutil.Process(child.pid)
        peak = 0
        while child.poll() is None:
            try:
                peak = max(peak, _tree_rss(process))
            except psutil.Error:
                pass
            time.sleep(0.05)
        wall = time.perf_counter() - started
        if child.returncode:
            log.seek(0)
            raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}):\n"
                               f"{log.read().decode(errors='replace')[-3000:]}")
    return wall, peak


def count_records(path: str) -> int:
    """Records in a TFRecord file, from its framing alone (no TensorFlow import in the benchmark process)."""
    return sum(1 for _ in record_framing.record_offsets(path))


def run_ours(corpus_path: str, output_dir: str, vocab_file: str, num_workers: int | None,
             documents_per_chunk: int, extra_flags: tuple[str, ...] = ()) -> dict:
    command = [sys.executable, "-m", "bert_jax.data.create", f"--input_file={corpus_path}",
               f"--output_dir={output_dir}", f"--vocab_file={vocab_file}", *COMMON_FLAGS,
               f"--documents_per_chunk={documents_per_chunk}", "--noprogress", "--overwrite", *extra_flags]
    if num_workers is not None:
        command.append(f"--num_workers={num_workers}")
    wall, peak = measure(command, ROOT, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    with open(os.path.join(output_dir, "metadata.json"), encoding="utf-8") as stream:
        stats = json.load(stream)["stats"]
    return {"wall_s": wall, "peak_rss": peak, "instances": stats["instances"], "documents": stats["documents"],
            "tokens": stats["tokens"]}


def run_original(original_dir: str, corpus_path: str, output_file: str, vocab_file: str) -> dict:
    command = [sys.executable, "-m", "bert.create_pretraining_data", f"--input_file={corpus_path}",
               f"--output_file={output_file}", f"--vocab_file={vocab_file}", *COMMON_FLAGS]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(original_dir), TF_CPP_MIN_LOG_LEVEL="2")
    wall, peak = measure(command, os.path.abspath(original_dir), env)
    return {"wall_s": wall, "peak_rss": peak, "instances": count_records(output_file)}


@functools.lru_cache(maxsize=1)
def _demo_documents() -> list[list[str]]:
    return [document.split("\n") for document in _documents(corpus.demo_corpus_text())]


def _shuffled_documents(size_bytes: int):
    """The demo corpus's documents (lists of sentences), repeated in shuffled orders until their text (sentences
    and newlines) reaches `size_bytes`."""
    documents = _demo_documents()
    written, copy = 0, 0
    while written < size_bytes:
        shuffled = list(documents)
        random.Random(copy).shuffle(shuffled)
        for sentences in shuffled:
            if written >= size_bytes:
                return
            written += sum(len(sentence.encode("utf-8")) + 1 for sentence in sentences)
            yield sentences
        copy += 1


def write_corpus(path: str, fmt: str, size_bytes: int) -> None:
    """The documents of _shuffled_documents(size_bytes) in `fmt`: one record per document whose "text" holds its
    sentences a line each (the original layout: a sentence per line, a blank line after each document)."""
    if fmt == "txt":
        with open(path, "w", encoding="utf-8") as stream:
            for sentences in _shuffled_documents(size_bytes):
                stream.write("\n".join(sentences) + "\n\n")
        return
    if fmt == "parquet":
        import pyarrow  # pylint: disable=import-outside-toplevel
        import pyarrow.parquet  # pylint: disable=import-outside-toplevel
        schema = pyarrow.schema([("id", pyarrow.int64()), ("text", pyarrow.string())])
        with pyarrow.parquet.ParquetWriter(path, schema) as writer:
            batch = []
            for index, sentences in enumerate(_shuffled_documents(size_bytes)):
                batch.append((index, "\n".join(sentences)))
                if len(batch) == 5000:  # row groups of 5,000 documents, as a streaming writer leaves them
                    writer.write_table(pyarrow.table(list(zip(*batch)), schema=schema))
                    batch = []
            if batch:
                writer.write_table(pyarrow.table(list(zip(*batch)), schema=schema))
        return
    if fmt.endswith(".zst"):
        import zstandard  # pylint: disable=import-outside-toplevel
        stream = zstandard.ZstdCompressor().stream_writer(open(path, "wb"))  # pylint: disable=consider-using-with
    elif fmt.endswith(".gz"):
        stream = gzip.open(path, "wb")
    else:
        stream = open(path, "wb")  # pylint: disable=consider-using-with
    with stream:
        if fmt == "csv":
            import io  # pylint: disable=import-outside-toplevel
            text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
            writer = csv.writer(text)
            writer.writerow(["id", "text"])
            for index, sentences in enumerate(_shuffled_documents(size_bytes)):
                writer.writerow([index, "\n".join(sentences)])
            text.flush()
            text.detach()
            return
        for index, sentences in enumerate(_shuffled_documents(size_bytes)):
            stream.write((json.dumps({"id": index, "text": "\n".join(sentences)}) + "\n").encode("utf-8"))


def main_formats(work_dir: str) -> None:
    rows = []
    cores = os.cpu_count() or 1
    workers = FLAGS.num_workers if FLAGS.num_workers is not None else cores
    # The tool's own default unless the flag is given: its 100 is there to split the 1 MB corpus over the cores.
    per_chunk = FLAGS.documents_per_chunk if FLAGS["documents_per_chunk"].present else 2000

    def run(fmt: str, size_bytes: int, tag: str) -> None:
        path = os.path.join(work_dir, f"{tag}.{fmt}")
        started = time.perf_counter()
        write_corpus(path, fmt, size_bytes)
        print(f"  wrote {path}: {os.path.getsize(path) / 1e6:.1f} MB in {time.perf_counter() - started:.1f} s",
              flush=True)
        result = run_ours(path, os.path.join(work_dir, f"out_{tag}_{fmt}"), FLAGS.vocab_file, FLAGS.num_workers,
                          per_chunk, ("--masking=none", "--dupe_factor=1"))
        result.update(format=fmt, file_mb=os.path.getsize(path) / 1e6, text_mb=size_bytes / 1e6)
        rows.append(result)
        print(f"  done: {fmt} ({result['file_mb']:.1f} MB) in {result['wall_s']:.1f} s", flush=True)
        os.remove(path)
        shutil.rmtree(os.path.join(work_dir, f"out_{tag}_{fmt}"), ignore_errors=True)

    for fmt in FORMATS:
        run(fmt, int(FLAGS.format_mb * 1e6), "small")
    if FLAGS.large_gb > 0:
        for fmt in ("jsonl", "txt"):
            run(fmt, int(FLAGS.large_gb * 1e9), "large")
    print(f"\n{cores} cores, {workers} workers, documents_per_chunk={per_chunk}; unmasked "
          f"instances, dupe_factor 1, seq 128; sizes are the documents' text (sentences and newlines)")
    print(f"{'format':<10} {'text MB':>8} {'file MB':>8} {'documents':>10} {'tokens':>12} {'wall s':>8} "
          f"{'tokens/s/core':>14} {'peak RSS MB':>12}")
    for row in rows:
        print(f"{row['format']:<10} {row['text_mb']:>8.0f} {row['file_mb']:>8.1f} {row['documents']:>10} "
              f"{row['tokens']:>12} {row['wall_s']:>8.1f} {row['tokens'] / row['wall_s'] / cores:>14.0f} "
              f"{row['peak_rss'] / 2**20:>12.0f}")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.mode == "formats":
        work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="benchmark_formats_")
        os.makedirs(work_dir, exist_ok=True)
        try:
            main_formats(work_dir)
        finally:
            if not FLAGS.work_dir:
                shutil.rmtree(work_dir, ignore_errors=True)
        return
    if FLAGS.original_dir and not os.path.isfile(os.path.join(FLAGS.original_dir, "bert",
                                                              "create_pretraining_data.py")):
        raise app.UsageError(f"--original_dir={FLAGS.original_dir}: no bert/create_pretraining_data.py in it")
    work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="benchmark_data_")
    os.makedirs(work_dir, exist_ok=True)
    try:
        small, large = build_corpora(work_dir, FLAGS.corpus_mb, FLAGS.scale)
        rows = []

        def add(name, corpus_path, result):
            result.update(name=name, corpus_mb=os.path.getsize(corpus_path) / 1e6)
            rows.append(result)
            print(f"  done: {name} on {result['corpus_mb']:.1f} MB in {result['wall_s']:.1f} s", flush=True)

        ours = lambda path, tag: run_ours(path, os.path.join(work_dir, tag), FLAGS.vocab_file, FLAGS.num_workers,
                                          FLAGS.documents_per_chunk)
        if FLAGS.original_dir:
            add("original", small, run_original(FLAGS.original_dir, small, os.path.join(work_dir, "original.tfrecord"),
                                                FLAGS.vocab_file))
        add("ours", small, ours(small, "ours_small"))
        if FLAGS.original_dir and FLAGS.original_on_large:
            add("original", large, run_original(FLAGS.original_dir, large,
                                                os.path.join(work_dir, "original_large.tfrecord"), FLAGS.vocab_file))
        add("ours", large, ours(large, "ours_large"))
    finally:
        if not FLAGS.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)

    workers = FLAGS.num_workers if FLAGS.num_workers is not None else os.cpu_count()
    print(f"\n{os.cpu_count()} cores; ours: {workers} workers, documents_per_chunk={FLAGS.documents_per_chunk}; "
          f"both: {' '.join(COMMON_FLAGS)}")
    originals = {row["corpus_mb"]: row["instances"] / row["wall_s"] for row in rows if row["name"] == "original"}
    print(f"{'tool':<9} {'corpus MB':>9} {'wall s':>8} {'instances':>10} {'inst/s':>9} {'peak RSS MB':>12} "
          f"{'speed-up':>9}")
    for row in rows:
        rate = row["instances"] / row["wall_s"]
        # Against the original on the same corpus; '*' marks a comparison with its rate on the small corpus.
        if row["corpus_mb"] in originals:
            speedup = f"{rate / originals[row['corpus_mb']]:.1f}x"
        elif originals:
            speedup = f"{rate / next(iter(originals.values())):.1f}x*"
        else:
            speedup = "-"
        print(f"{row['name']:<9} {row['corpus_mb']:>9.2f} {row['wall_s']:>8.2f} {row['instances']:>10} "
              f"{rate:>9.0f} {row['peak_rss'] / 2**20:>12.0f} {speedup:>9}")
    if originals and any(row["corpus_mb"] not in originals for row in rows):
        print("* against the original's rate on the small corpus (--original_on_large runs it on the large one)")


if __name__ == "__main__":
    define_flags()
    app.run(main)
