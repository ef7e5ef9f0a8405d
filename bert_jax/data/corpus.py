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
import importlib
import inspect
import itertools
import logging
import os
import re
import subprocess
import sys
import warnings
from typing import Iterable, Iterator

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
        return [sentence for paragraph in document for sentence in split_sentences(paragraph)]
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
    # Imported here: this file also runs without site-packages, to build the demo corpus.
    from bert_jax import fileio  # pylint: disable=import-outside-toplevel
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
    from bert_jax.data import corpus_formats  # pylint: disable=import-outside-toplevel
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
    from bert_jax.data import corpus_formats  # pylint: disable=import-outside-toplevel
    stats.files += 1
    with corpus_formats.open_decompressed(path) as stream:
        head = stream.read(max(_READ_CHUNK_BYTES, corpus_formats.SNIFF_BYTES))
        corpus_formats.check_text_head(path, head, text_format)
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


# Words that end with a period without ending the sentence. Compared in lower case, without the final period.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al fig figs eq eqs vol vols approx ca resp dept inc ltd "
    "corp jan feb mar apr jun jul aug sep sept oct nov dec".split())
_CLOSERS = "\"')]}\u201d\u2019"
_OPENERS = "\"'([{\u201c\u2018"
# A run of terminators, optional closing quotes or brackets, then whitespace: a candidate sentence end.
_CANDIDATE_END = re.compile(rf"[.!?]+[{re.escape(_CLOSERS)}]*\s+")
_MULTI_INITIALS = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # U.S, e.g, p.m: the token before the final period


def split_sentences_by_rules(paragraph: str) -> list[str]:
    """Splits prose into sentences with a small rule set; whitespace runs become single spaces.

    The demo corpus is built with these rules, as it is built without third-party packages (and its figures are
    pinned); user corpora go through `split_sentences`, more accurate and faster (docs/data.md, Sentence splitting).

    A sentence ends after '.', '!' or '?' (possibly repeated, possibly followed by closing quotes or brackets) when
    whitespace and then an upper-case letter, a digit or an opening quote follow. A period does not end a sentence
    after a common abbreviation ("e.g.", "i.e.", "Mr.", "Dr.", "etc.", ...), a single capital initial ("J. Smith")
    or dotted initials ("U.S.", "p.m."); decimals ("3.14") never split because no whitespace follows the period.

    Limits: English rules only; a sentence that really does end with an abbreviation or an initial is joined to the
    next one; a sentence starting with a lower-case letter is joined to the previous one; scripts without spaces
    between sentences (Chinese, Japanese) are not split.
    """
    text = " ".join(paragraph.split())
    sentences, start = [], 0
    for match in _CANDIDATE_END.finditer(text):
        following = text[match.end()]  # the whitespace was collapsed and stripped, so a character follows
        if not (following.isupper() or following.isdigit() or following in _OPENERS):
            continue
        if text[match.start()] == "." and _is_abbreviation(text, match.start()):
            continue
        sentences.append(text[start:match.end()].strip())
        start = match.end()
    if start < len(text):
        sentences.append(text[start:].strip())
    return [sentence for sentence in sentences if sentence]


def _is_abbreviation(text: str, period: int) -> bool:
    word = text[text.rfind(" ", 0, period) + 1:period].lstrip(_OPENERS)
    single_initial = len(word) == 1 and word.isupper()
    return word.lower() in _ABBREVIATIONS or single_initial or bool(_MULTI_INITIALS.fullmatch(word))


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
# The offline demo corpus

# Standard-library modules whose docstrings join the demo corpus: importable everywhere CPython runs, quick to
# import, without side effects and not deprecated. Changing this list changes the corpus, so keep it sorted.
_DEMO_MODULES = tuple("""
    _collections_abc _pydecimal _pyio _threading_local abc argparse array ast asyncio.base_events asyncio.events
    asyncio.locks asyncio.protocols asyncio.queues asyncio.runners asyncio.selector_events asyncio.streams
    asyncio.tasks asyncio.transports base64 bdb binascii bisect builtins bz2 calendar cmath cmd code codecs codeop
    collections collections.abc colorsys compileall concurrent.futures concurrent.futures._base configparser
    contextlib contextvars copy copyreg csv dataclasses datetime dbm dbm.dumb difflib dis doctest email
    email._header_value_parser email._parseaddr email._policybase email.base64mime email.charset email.encoders
    email.errors email.feedparser email.generator email.header email.headerregistry email.iterators email.message
    email.parser email.policy email.quoprimime email.utils enum filecmp fileinput fnmatch fractions ftplib
    functools gc genericpath getopt getpass gettext glob graphlib gzip hashlib heapq hmac html html.parser http
    http.client http.cookiejar http.cookies http.server imaplib importlib importlib.abc importlib.metadata
    importlib.resources importlib.resources.abc importlib.util inspect io ipaddress itertools json json.decoder
    json.encoder keyword linecache locale logging logging.config logging.handlers lzma mailbox marshal math
    mimetypes modulefinder multiprocessing.connection multiprocessing.context multiprocessing.managers
    multiprocessing.pool multiprocessing.reduction multiprocessing.shared_memory netrc numbers opcode operator
    optparse os pathlib pdb pickle pickletools pkgutil platform plistlib poplib posixpath pprint profile pstats
    py_compile pyclbr pydoc queue quopri random re reprlib rlcompleter runpy sched secrets select selectors shelve
    shlex shutil signal smtplib socket socketserver ssl stat statistics string stringprep struct subprocess symtable
    sys sysconfig tabnanny tarfile tempfile textwrap threading time timeit token tokenize trace traceback
    tracemalloc types typing unicodedata unittest unittest.case unittest.loader unittest.mock unittest.result
    unittest.util urllib.error urllib.parse urllib.request urllib.response urllib.robotparser uuid warnings wave
    weakref wsgiref.handlers wsgiref.headers wsgiref.simple_server wsgiref.util wsgiref.validate xml.dom.expatbuilder
    xml.dom.minidom xml.dom.pulldom xml.etree.ElementTree xml.sax xml.sax._exceptions xml.sax.handler
    xml.sax.saxutils xml.sax.xmlreader xmlrpc.client xmlrpc.server zipapp zipfile zipimport zlib zoneinfo
    """.split())
_MIN_DOCUMENT_SENTENCES = 4  # a class documented more briefly joins its module's document
_PROSE_END = re.compile(rf"[.!?:][{re.escape(_CLOSERS)}]*$")
_LIST_MARKER = re.compile(r"^(?:[-*+\u2022]|\(?\d+[.)]|\(?[a-z][.)])\s+")
_LETTER = re.compile(r"[^\W\d_]")
_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")


def demo_corpus_text() -> str:
    """The demo corpus in the original layout: one sentence per line, a blank line after each document.

    Its documents are the prose of each pydoc help topic (pydoc_data.topics), then for each module of _DEMO_MODULES
    its docstring with those of its functions and briefly documented classes, followed by one document per class
    documented at more length. Code, doctests, tables and headings are left out. The text depends only on the Python
    version (about 1.25 MB, 718 documents and 14.8k sentences on CPython 3.11) and is built in about half a second.
    """
    # Imported packages rewrite standard-library docstrings (typing_extensions swaps typing's helpers, Keras edits
    # Mapping.get.__doc__), so the corpus is read in a fresh interpreter that imports the standard library only.
    script = "import runpy, sys; sys.stdout.buffer.write(runpy.run_path(sys.argv[1])['_demo_text_here']().encode())"
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script, os.path.abspath(__file__)],
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
    from bert_jax import fileio  # pylint: disable=import-outside-toplevel
    with fileio.open_file(path, "wb") as writer:
        writer.write(text.encode("utf-8"))
    return stats


def _demo_text_here() -> str:
    return "".join("\n".join(document) + "\n\n" for document in _iter_demo_documents_here() if document)


def _iter_demo_documents_here() -> Iterator[list[str]]:
    from pydoc_data.topics import topics  # pylint: disable=import-outside-toplevel

    for key in sorted(topics):
        yield _prose_sentences(topics[key])
    # The same docstring can hang off several names (aliases, re-exports); it is used once, where first met.
    seen_docstrings: set[str] = set()
    for module_name in _DEMO_MODULES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # a trimmed-down Python build; the corpus is then smaller, but still fixed
                continue
            yield from _module_documents(module, seen_docstrings)


def _module_documents(module, seen_docstrings: set[str]) -> Iterator[list[str]]:
    def sentences_of(obj) -> list[str]:
        doc = getattr(obj, "__doc__", None)
        if not isinstance(doc, str) or doc in seen_docstrings:
            return []
        seen_docstrings.add(doc)
        return _prose_sentences(inspect.cleandoc(doc))

    # C accelerators define what their module re-exports: heapq's functions say they live in '_heapq'.
    owners = {module.__name__, "_" + module.__name__.rpartition(".")[2]}
    module_document = sentences_of(module)
    class_documents = []
    for member in _documented_members(module, owners):
        if inspect.isclass(member):
            document = sentences_of(member)
            for method in _documented_members(member, None):
                document.extend(sentences_of(method))
            if len(document) >= _MIN_DOCUMENT_SENTENCES:
                class_documents.append(document)
            else:
                module_document.extend(document)
        else:
            module_document.extend(sentences_of(member))
    yield module_document
    yield from class_documents


def _documented_members(namespace, owners: set[str] | None) -> list[object]:
    """Classes and routines defined in `namespace` (in a module named in `owners`, when given), sorted by name.

    Private helpers and dunder methods count too: their docstrings are prose like any other (boilerplate ones are
    used once, like every repeated docstring), and the public ones alone give little more than half the text.
    """
    members = []
    for name, member in sorted(vars(namespace).items()):
        if name in ("__doc__", "__builtins__"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if not (inspect.isclass(member) or inspect.isroutine(member) or isinstance(member, property)):
            continue
        if owners is not None and getattr(member, "__module__", None) not in owners:
            continue
        members.append(member)
    return members


def _prose_sentences(text: str) -> list[str]:
    """The sentences of a help text's prose paragraphs; headings, code, grammar rules and tables are left out."""
    sentences = []
    for paragraph in _prose_paragraphs(text):
        sentences.extend(sentence for sentence in split_sentences_by_rules(paragraph) if _looks_like_prose(sentence))
    return sentences


def _prose_paragraphs(text: str) -> Iterator[str]:
    for block in _BLANK_LINES.split(text):
        lines, kept = [line for line in block.splitlines() if line.strip()], []
        for line in lines:
            # A doctest runs to the end of its block; lines indented deeper than the paragraph start are code.
            if line.strip().startswith((">>>", "...")) or _indent(line) >= _indent(lines[0]) + 4:
                break
            kept.append(line.strip())
        paragraph = _LIST_MARKER.sub("", " ".join(kept))
        # Headings, code and tables do not end like a sentence; grammar productions contain '::='.
        if paragraph and _PROSE_END.search(paragraph) and "::=" not in paragraph:
            yield paragraph


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _looks_like_prose(sentence: str) -> bool:
    visible = sentence.replace(" ", "")
    letters = len(_LETTER.findall(visible))
    return sentence.count(" ") >= 2 and letters >= 0.75 * len(visible) and sentence[0].isupper()
