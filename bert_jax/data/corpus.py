"""Corpus sources for pretraining-data creation: documents as lists of sentence strings, streamed in a fixed order.

`iter_documents(source)` reads one of:
  * comma-separated file globs, local or gs:// (`.gz`, `.zst` decompressed on the fly), each file's layout by its
    name (text_format="auto"; bert_jax.data.corpus_formats) or text_format. "lines" (the original layout): every
    stripped line is a sentence, a blank line ends a document, and as in the original reader a file that does not
    end with a blank line carries its last document into the next. "paragraphs": each file is a document of prose,
    blank lines separate paragraphs, whose lines are joined and cut into sentences by `split_sentences`. JSON Lines,
    Parquet, CSV/TSV: a document per record, each line of its `text_field` a paragraph cut by `split_sentences`.
  * "tfds:NAME[:SPLIT][:FIELD]", e.g. "tfds:wiki40b/en:train:text": one document per example of an already
    prepared TensorFlow Datasets dataset (never downloaded from here).
  * "demo": an English corpus built offline from CPython's own help topics and standard-library docstrings.

One document is held at a time, so memory is bounded by the largest document (for "paragraphs", the largest file).
Documents without sentences are dropped; otherwise the order is the source's own, the same on every run.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import subprocess
import sys
from typing import Iterable, Iterator

from bert_jax import fileio
from bert_jax.data import corpus_formats
from bert_jax.data import demo_corpus

_log = logging.getLogger(__name__)

TEXT_FORMATS = ("auto", "lines", "paragraphs", "jsonl", "parquet", "csv", "tsv")
DEMO_SOURCE = "demo"
TFDS_PREFIX = "tfds:"
_READ_CHUNK_BYTES = 1 << 20


@dataclasses.dataclass
class CorpusStats:
    """Counts filled in while iterating, for the caller's summary."""

    files: int = 0
    documents: int = 0
    sentences: int = 0
    skipped_lines: int = 0  # lines that are not valid UTF-8
    characters: int = 0  # characters of the yielded sentences (paragraphs, with split=False)
    bad_records: int = 0  # records without usable text, skipped (skip_bad_records)


class EmptyCorpusError(ValueError):
    """A source that holds no document at all."""


class Paragraphs(list):
    """A document of paragraphs not yet cut into sentences (iter_documents(split=False)): `sentences_of` cuts them
    where the document is used. Cutting is most of the cost of reading records, so pretraining-data creation does
    it in its worker processes, not in the one process that reads the corpus."""

    __slots__ = ()


def sentences_of(document: list[str]) -> list[str]:
    """A document's sentences: the document itself, or a Paragraphs' paragraphs cut by `split_sentences`."""
    if isinstance(document, Paragraphs):
        from bert_jax.data import sentences  # pylint: disable=import-outside-toplevel  (once, not per paragraph)
        return [sentence for paragraph in document for sentence in sentences.split_sentences(paragraph)]
    return document


def iter_documents(source: str, *, text_format: str = "auto", text_field: str = "text",
                   skip_bad_records: bool = False, split: bool = True,
                   stats: CorpusStats | None = None) -> Iterator[list[str]]:
    """Yields the documents of `source` (see the module docstring), each a non-empty list of sentence strings.

    With split=False, documents of prose (paragraphs, records, TFDS examples) come as `Paragraphs` instead, for the
    caller to cut with `sentences_of`, and `stats.sentences` counts their paragraphs.

    text_format, text_field and skip_bad_records apply to files only (corpus_formats says what a bad record is).
    Problems with the source itself (no such file, a dataset that is not prepared, a bad text_format) are raised
    here, before the first document; a source that turns out to hold no document at all raises EmptyCorpusError (a
    ValueError) once it has been read to the end. `stats` is updated as documents go out.
    """
    if text_format not in TEXT_FORMATS:
        raise ValueError(f"corpus text_format={text_format!r} is not one of {TEXT_FORMATS}")
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"corpus text_field={text_field!r}: name the field (column) that holds the text")
    stats = stats if stats is not None else CorpusStats()
    if source == DEMO_SOURCE:
        documents = _documents_from_lines(demo_corpus_text().split("\n"))
    elif source.startswith(TFDS_PREFIX):
        documents = _iter_tfds_documents(source, stats)
    else:
        documents = _iter_file_documents(resolve_files(source), text_format, text_field, skip_bad_records, stats)
    if split:
        documents = map(sentences_of, documents)
    return _counted(documents, source, stats)


def _counted(documents: Iterable[list[str]], source: str, stats: CorpusStats) -> Iterator[list[str]]:
    yielded = 0
    for document in documents:
        if not document:
            continue
        yielded += 1
        stats.documents += 1
        stats.sentences += len(document)
        stats.characters += sum(len(sentence) for sentence in document)
        yield document
    if not yielded:
        raise EmptyCorpusError(f"corpus source {source!r} holds no documents: it has no non-blank line of text "
                         f"({stats.skipped_lines} lines were not valid UTF-8, {stats.bad_records} bad records were "
                               "skipped). Point it at a non-empty corpus.")


# ---------------------------------------------------------------------------------------------------------------
# Files


def resolve_files(source: str) -> list[str]:
    """Comma-separated globs -> file paths: patterns in the given order, each one's matches sorted, duplicates
    dropped (the first occurrence keeps its place)."""
    patterns = [pattern.strip() for pattern in source.split(",") if pattern.strip()]
    if not patterns:
        raise ValueError(f"corpus source {source!r} names no file: give file paths or globs, 'tfds:NAME' or 'demo'")
    files, seen = [], set()
    for pattern in patterns:
        if any(char in pattern for char in "*?["):
            matches = fileio.glob(pattern)
            if not matches:
                raise FileNotFoundError(f"corpus file pattern {pattern!r} matches no file")
        else:
            if not fileio.exists(pattern):
                raise FileNotFoundError(f"corpus file {pattern!r} does not exist")
            if fileio.isdir(pattern):
                raise IsADirectoryError(f"corpus file {pattern!r} is a directory: name its files, e.g. "
                                        f"{os.path.join(pattern, '*.txt')!r}")
            matches = [pattern]
        for path in matches:
            if path not in seen:
                seen.add(path)
                files.append(path)
    return files


def _iter_file_documents(files: list[str], text_format: str, text_field: str, skip_bad_records: bool,
                         stats: CorpusStats) -> Iterator[list[str]]:
    # Consecutive "lines" files are one stream of lines, as in the original reader; any other file stands alone.
    layouts = [(path, corpus_formats.file_format(path, text_format)) for path in files]
    for layout, group in itertools.groupby(layouts, key=lambda item: item[1]):
        paths = [path for path, _ in group]
        if layout == "lines":
            yield from _documents_from_lines(
                line for path in paths for line in _iter_decoded_lines(path, stats, text_format))
        elif layout == "paragraphs":
            yield from _iter_paragraph_documents(paths, stats)
        else:
            for path in paths:
                for text in corpus_formats.iter_record_texts(path, layout, field=text_field,
                                                             skip_bad_records=skip_bad_records, stats=stats):
                    yield _record_document(text)


def _record_document(text: str) -> Paragraphs:
    # Each line is a paragraph, as in TFDS texts: records keep paragraphs (or pre-split sentences) on their own lines.
    return _paragraphs(text.split("\n"))


def _paragraphs(texts: Iterable[str]) -> Paragraphs:
    return Paragraphs(text for text in texts if text.strip())  # a blank one holds no sentence


def iter_byte_lines(stream, head: bytes = b"") -> Iterator[bytes]:
    """The lines of a binary stream, without their b"\\n"; `head`: bytes already read from its start."""
    # Splitting big chunks ourselves is several times faster than GFile.readline, and splits on b"\n" only, as the
    # original reader did (str.splitlines would also split on \r, \x0c, \x1c, \u2028 and friends).
    pending = b""
    chunk = head or stream.read(_READ_CHUNK_BYTES)
    while chunk:
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        yield from lines
        chunk = stream.read(_READ_CHUNK_BYTES)
    if pending:
        yield pending


def _iter_decoded_lines(path: str, stats: CorpusStats, text_format: str = "lines") -> Iterator[str]:
    stats.files += 1
    with corpus_formats.open_decompressed(path) as stream:
        head = stream.read(max(_READ_CHUNK_BYTES, corpus_formats.SNIFF_BYTES))
        corpus_formats.check_text_head(path, head[:corpus_formats.SNIFF_BYTES], text_format)
        warned = False
        for line_number, line in enumerate(iter_byte_lines(stream, head), start=1):
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as error:
                stats.skipped_lines += 1
                if not warned:
                    warned = True
                    _log.warning("%s:%d: line is not valid UTF-8 (%s); skipping it (further bad lines in this "
                                 "file are skipped silently and counted in skipped_lines)", path, line_number,
                                 error.reason)


def _documents_from_lines(lines: Iterable[str]) -> Iterator[list[str]]:
    """The original create_pretraining_data.py loop: stripped lines are sentences, an empty one ends a document."""
    document = []
    for line in lines:
        line = line.strip()
        if line:
            document.append(line)
        elif document:
            yield document
            document = []
    if document:
        yield document


def _iter_paragraph_documents(files: list[str], stats: CorpusStats) -> Iterator[list[str]]:
    for path in files:
        # The original loop's blank-line-separated groups of lines are exactly this layout's paragraphs.
        paragraphs = _documents_from_lines(_iter_decoded_lines(path, stats, "paragraphs"))
        yield _paragraphs(" ".join(lines) for lines in paragraphs)


# ---------------------------------------------------------------------------------------------------------------
# Sentence splitting


def split_sentences(paragraph: str) -> list[str]:
    """The sentences of a paragraph of a user corpus, by sentencex (bert_jax.data.sentences, docs/data.md)."""
    from bert_jax.data import sentences  # pylint: disable=import-outside-toplevel
    return sentences.split_sentences(paragraph)


# ---------------------------------------------------------------------------------------------------------------
# TensorFlow Datasets

_VERSION = re.compile(r"\d+\.(?:\d+|\*)\.(?:\d+|\*)")
_COLON_OUTSIDE_BRACKETS = re.compile(r":(?![^\[]*\])")  # keeps a split slice such as train[:10%] whole


def _parse_tfds_source(source: str) -> tuple[str, str, str]:
    """'tfds:NAME[:VERSION][:SPLIT][:FIELD]' -> (name, split, field)."""
    parts = _COLON_OUTSIDE_BRACKETS.split(source[len(TFDS_PREFIX):])
    name = parts.pop(0)
    if parts and _VERSION.fullmatch(parts[0]):
        name = f"{name}:{parts.pop(0)}"
    if not name or len(parts) > 2 or not all(parts):
        raise ValueError(f"corpus source {source!r} is not of the form 'tfds:NAME[:SPLIT][:FIELD]', e.g. "
                         "'tfds:wiki40b/en:train:text'")
    split = parts[0] if parts else "train"
    field = parts[1] if len(parts) > 1 else "text"
    return name, split, field


def _iter_tfds_documents(source: str, stats: CorpusStats) -> Iterator[list[str]]:
    name, split, field = _parse_tfds_source(source)
    try:
        import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError(f"corpus source {source!r} needs tensorflow-datasets and importlib_resources (which it "
                          f"imports without declaring it): pip install tensorflow-datasets importlib_resources "
                          f"({error})") from error

    data_dir = os.environ.get("TFDS_DATA_DIR") or None
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(f"corpus source {source!r}: TensorFlow Datasets has no dataset {name!r}; check the name "
                         "against tfds.list_builders() (configs go after a slash, e.g. 'wiki40b/en')") from None
    text_fields = sorted(key for key, feature in builder.info.features.items()
                         if isinstance(feature, tfds.features.Text))
    if field not in text_fields:
        raise ValueError(f"corpus source {source!r}: dataset {name!r} has no text field {field!r}; its text fields "
                         f"are {text_fields}. Name one as 'tfds:{name}:{split}:FIELD'.")
    try:
        dataset = builder.as_dataset(split=split, shuffle_files=False,
                                     decoders=tfds.decode.PartialDecoding({field: True}))
    except AssertionError:  # what TFDS raises for data that was never prepared
        raise FileNotFoundError(
            f"corpus source {source!r}: dataset {name!r} is not prepared in {builder.data_dir_root}, and it is "
            f"never downloaded from here. Prepare it first on a machine with network access (`tfds build {name} "
            f"--data_dir=DIR`, then copy DIR over), and set TFDS_DATA_DIR=DIR.") from None
    except (KeyError, ValueError) as error:
        raise ValueError(f"corpus source {source!r}: bad split {split!r} ({error}); dataset {name!r} has splits "
                         f"{sorted(builder.info.splits)}") from None
    return (_tfds_document(example[field], stats) for example in dataset.as_numpy_iterator())


def _tfds_document(text: bytes, stats: CorpusStats) -> Paragraphs:
    lines = []
    for line in text.split(b"\n"):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            stats.skipped_lines += 1
    paragraphs = _wiki40b_paragraphs(lines) if any(line.strip() in _WIKI40B_MARKERS for line in lines) else lines
    return _paragraphs(paragraphs)


_WIKI40B_MARKERS = frozenset(("_START_ARTICLE_", "_START_SECTION_", "_START_PARAGRAPH_"))


def _wiki40b_paragraphs(lines: list[str]) -> list[str]:
    # Wiki-40B puts each title, section heading and paragraph on the line after its marker. Only the paragraph text
    # is kept, as BERT's own Wikipedia extraction dropped headings; _NEWLINE_ separates paragraphs within one.
    paragraphs, previous = [], ""
    for line in lines:
        stripped = line.strip()
        if previous == "_START_PARAGRAPH_" and stripped not in _WIKI40B_MARKERS:
            paragraphs.extend(stripped.split("_NEWLINE_"))
        previous = stripped
    return paragraphs


# ---------------------------------------------------------------------------------------------------------------
# The offline demo corpus (built by bert_jax.data.demo_corpus, in an interpreter of its own)


def demo_corpus_text() -> str:
    """The demo corpus in the original layout: one sentence per line, a blank line after each document.

    Its documents are the prose of each pydoc help topic (pydoc_data.topics), then for each module of DEMO_MODULES
    its docstring with those of its functions and briefly documented classes, followed by one document per class
    documented at more length. Code, doctests, tables and headings are left out. The text depends only on the Python
    version (about 1.25 MB, 718 documents and 14.8k sentences on CPython 3.11) and is built in about half a second.
    """
    # Imported packages rewrite standard-library docstrings (typing_extensions swaps typing's helpers, Keras edits
    # Mapping.get.__doc__), so the corpus is read in a fresh interpreter that imports the standard library only.
    script = "import runpy, sys; sys.stdout.buffer.write(runpy.run_path(sys.argv[1])['_demo_text_here']().encode())"
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script, os.path.abspath(demo_corpus.__file__)],
                            capture_output=True, check=False)
    if result.returncode:
        raise RuntimeError(f"building the demo corpus in a fresh {sys.executable} failed:\n"
                           f"{result.stderr.decode(errors='replace')[-2000:]}")
    return result.stdout.decode("utf-8")


def write_demo_corpus(path: str) -> CorpusStats:
    """Writes the demo corpus to `path` (local or gs://) in the original layout and returns its counts."""
    text = demo_corpus_text()
    stats = CorpusStats(files=1)
    for _ in _counted(_documents_from_lines(text.split("\n")), DEMO_SOURCE, stats):
        pass
    with fileio.open_file(path, "wb") as writer:
        writer.write(text.encode("utf-8"))
    return stats
