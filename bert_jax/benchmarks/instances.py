"""Padding of pretraining instances: NSP sentence pairs against MLM-only rows and fragments.

    python -m bert_jax.benchmarks.instances [--seq_lengths=128,512] [--vocab_file=...]

Makes the instances of each kind with bert_jax.data.create (dupe_factor 1, no masks, one process) from two corpora:
the offline demo corpus, and a corpus of long documents (the demo documents joined in corpus order until each holds
at least --long_tokens tokens). Prints the share of padding tokens in the written records and, for fragments (made
to be packed when read), after packing them as the input pipeline does (windows of data.pack_window records,
first-fit decreasing, at most 4 or 8 per row), as create's metadata.json records them. Also the real tokens per
row, which is what a training step gets out of a row.
"""

import os
import tempfile

from absl import app
from absl import flags

from bert_jax.data import corpus
from bert_jax.data import create
from bert_jax.data import tokenization

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_VOCAB = os.path.join(ROOT, "tests", "fixtures", "google_bert", "vocab_uncased.txt")

FLAGS = flags.FLAGS
flags.DEFINE_string("vocab_file", DEFAULT_VOCAB, "WordPiece vocab.txt (or any tokenizer load_tokenizer takes).")
flags.DEFINE_list("seq_lengths", ["128", "512"], "max_seq_length values to measure.")
flags.DEFINE_integer("long_tokens", 2000, "Each document of the long corpus holds at least this many tokens.")
flags.DEFINE_string("work_dir", None, "Where corpora and outputs go (default: a temporary directory, removed).")


def long_document_corpus(path: str, tokenizer, min_tokens: int) -> int:
    """Writes the demo documents joined in corpus order into documents of >= `min_tokens` tokens (the last
    group may be shorter) in the original layout; returns the number of documents."""
    groups, group, tokens = [], [], 0
    for document in corpus.iter_documents(corpus.DEMO_SOURCE):
        group.extend(document)
        tokens += sum(len(ids) for ids in tokenizer.encode_batch(document))
        if tokens >= min_tokens:
            groups.append(group)
            group, tokens = [], 0
    if group:
        groups.append(group)
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n\n".join("\n".join(group) for group in groups) + "\n")
    return len(groups)


def measure(source: str, vocab_file: str, work_dir: str, seq_length: int) -> dict:
    """{kind: metadata stats} of each kind of instances of `source` at `seq_length`."""
    results = {}
    for kind in create.INSTANCE_KINDS:
        options = create.DataOptions(max_seq_length=seq_length, dupe_factor=1, masking="none", instances=kind)
        metadata = create.create_pretraining_data(source, vocab_file, os.path.join(work_dir, f"{kind}_{seq_length}"),
                                                  options, num_workers=0, progress=False, overwrite=True)
        results[kind] = metadata["stats"]
    return results


def format_table(name: str, seq_length: int, results: dict) -> list[str]:
    lines = []
    for kind, stats in results.items():
        packed = stats.get("packed_padding_fraction", {})
        packed_text = "  ".join(f"{100 * packed[key]:5.1f}%" for key in sorted(packed) if key != "pack_window")
        lines.append(f"{name:<14} {seq_length:>4} {kind:<10} {stats['instances']:>8} "
                     f"{stats['tokens'] / stats['instances']:>9.1f} {100 * stats['padding_fraction']:>8.1f}%   "
                     f"{packed_text or '-'}")
    return lines


def main(argv):
    del argv
    tokenizer = tokenization.load_tokenizer(FLAGS.vocab_file)
    with tempfile.TemporaryDirectory() as temporary:
        work_dir = FLAGS.work_dir or temporary
        os.makedirs(work_dir, exist_ok=True)
        long_path = os.path.join(work_dir, "long_documents.txt")
        count = long_document_corpus(long_path, tokenizer, FLAGS.long_tokens)
        print(f"long documents: {count} documents of >= {FLAGS.long_tokens} tokens from the demo corpus")
        lines = [f"{'corpus':<14} {'seq':>4} {'instances':<10} {'records':>8} {'tokens/row':>9} {'padding':>9}   "
                 "packed (4 | 8 per row, window 256)"]
        for name, source in (("demo", corpus.DEMO_SOURCE), ("long documents", long_path)):
            for seq_length in map(int, FLAGS.seq_lengths):
                lines += format_table(name, seq_length, measure(source, FLAGS.vocab_file,
                                                                os.path.join(work_dir, name.split()[0]), seq_length))
    print("\n".join(lines))


if __name__ == "__main__":
    app.run(main)
