"""Corpus files as they are distributed: which layout a file is in, decompression, and record-per-document files.

Layouts (bert_jax.data.corpus turns each record's text into one document):
  * "jsonl": JSON Lines (`.jsonl`, `.json`, `.ndjson`), one JSON object per line, the text in one string field.
  * "parquet": Parquet (`.parquet`), the text in one string column; streamed in batches of each row group.
  * "csv" / "tsv": a header row, then one record per row, the text in the column the header names.
  * "lines" / "paragraphs": the original plain-text layouts, read by bert_jax.data.corpus itself.
Line-based files may be compressed, named `.gz` (gzip) or `.zst` (Zstandard). With text_format="auto" the name
picks the layout and anything else is "lines", but a file whose first bytes say it is something else (Parquet, a
compressed stream under a plain name, binary data, JSON objects) is refused with the fix, never read as text lines.

A record without the field, with a field that is not a string (null counts as missing), a line that is not a JSON
object, or a file without the column is a bad record. By default the first one stops the run with one message naming
the file, the line (or row group and row) and the field. With skip_bad_records they are skipped, counted in
CorpusStats.bad_records, and each file with any gets one warning: how many, and where the first was. The stopping
message cannot say how many follow in the same file without reading all of it, so it names the first only (for a
Parquet file without the column, and for null values its statistics record, it gives the count as well).

pyarrow and zstandard are imported only when a file needs them.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import logging
import os
import re
from typing import Iterator

_log = logging.getLogger(__name__)

RECORD_FORMATS = ("jsonl", "parquet", "csv", "tsv")
_COMPRESSED = {".gz": "gzip", ".zst": "zstd"}
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".csv": "csv",
               ".tsv": "tsv"}
# (magic, what the file is, the fix; {name} is the file's name): checked on the first bytes of every line-based file.
_MAGIC = ((rb"PAR1", "a Parquet file", "name it *.parquet, or pass the format ({flags}=parquet)"),
          (rb"\x1f\x8b", "gzip-compressed", "rename it {name}.gz (e.g. corpus.jsonl.gz for JSON Lines)"),
          (rb"\x28\xb5\x2f\xfd", "Zstandard-compressed", "rename it {name}.zst (e.g. corpus.jsonl.zst)"),
          (rb"BZh[1-9]1AY&", "bzip2-compressed, which is not read here", "recompress it as .gz or .zst"),
          (rb"\xfd7zXZ\x00", "xz-compressed, which is not read here", "recompress it as .gz or .zst"),
          (rb"PK\x03\x04", "a zip archive, which is not read here", "extract its files and name those"))
SNIFF_BYTES = 1 << 16  # what a plain-text file is judged by (decompressed)
_FORMAT_FLAGS = "--text_format / --config.data.corpus_format"
_SKIP_FIX = ("Fix the data, name the field that holds the text (--text_field / --config.data.corpus_field), or "
             "skip and count such records (--skip_bad_records / --config.data.skip_bad_records=True)")
_PARQUET_BATCH_ROWS = 1024  # rows decoded at a time: memory stays flat however large a row group is


class BadRecordError(ValueError):
    """A record without usable text, met while skip_bad_records is off."""


class UnknownFileFormatError(ValueError):
    """A file whose bytes are not the layout it is to be read as."""


def _split_compression(path: str) -> tuple[str, str | None]:
    stem, extension = os.path.splitext(path)
    compression = _COMPRESSED.get(extension.lower())
    return (stem, compression) if compression else (path, None)


def file_format(path: str, text_format: str) -> str:
    """The layout `path` is read in: `text_format` itself, or for "auto" the one its name gives ("lines" if none)."""
    if text_format != "auto":
        return text_format
    stem, _ = _split_compression(path)
    return _EXTENSIONS.get(os.path.splitext(stem)[1].lower(), "lines")


@contextlib.contextmanager
def open_decompressed(path: str):
    """`path` (local or gs://) as a binary stream, decompressed on the fly when it is named .gz or .zst.

    A compressed or Parquet file under another name is refused: its bytes would be read as text.
    """
    _, compression = _split_compression(path)
    with _open_binary(path) as raw:
        head = raw.read(8)
        raw.seek(0)
        if compression is None:
            for magic, what, fix in _MAGIC:
                if re.match(magic, head):
                    fix = fix.format(name=os.path.basename(path), flags=_FORMAT_FLAGS)
                    raise UnknownFileFormatError(f"corpus file {path!r} is {what}, not text: {fix}")
            yield raw
        elif compression == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                yield stream
        else:
            zstandard = _import("zstandard", "zstandard", path)
            # Long-window frames (zstd --long=31) need the larger limit; several frames read as one stream.
            decompressor = zstandard.ZstdDecompressor(max_window_size=1 << 31)
            with decompressor.stream_reader(raw, read_across_frames=True, closefd=False) as stream:
                yield stream


@contextlib.contextmanager
def _open_binary(path: str):
    from bert_jax import fileio  # pylint: disable=import-outside-toplevel
    with fileio.open_file(path, "rb") as file:
        # Remote files (gs:// and every scheme TensorFlow reads) as a regular file object: text wrappers and pyarrow
        # read them so.
        yield _SeekableReader(file) if fileio.is_remote(path) else file


def check_text_head(path: str, head: bytes, text_format: str) -> None:
    """Refuses a file to be read as plain text ("lines"/"paragraphs") whose first (decompressed) bytes say it is not.

    `text_format` is what was asked for: only "auto" also refuses JSON objects (an explicit "lines" reads them).
    """
    if head.startswith(b"PAR1"):
        raise UnknownFileFormatError(f"corpus file {path!r} holds a Parquet file, not text: store it as *.parquet")
    # A stray NUL turns up in crawled text; binary data and UTF-16 text are full of them.
    nuls = head.count(b"\x00")
    if nuls > len(head) // 100:
        raise UnknownFileFormatError(
            f"corpus file {path!r}: {nuls} of its first {len(head)} bytes are NUL bytes: it is "
            "binary (or UTF-16) data, not UTF-8 text. Convert it to UTF-8 text, JSON Lines or Parquet")
    if text_format == "auto":
        first_line = next((line.strip() for line in head.split(b"\n") if line.strip()), b"")
        cut_off = b"\n" not in head.lstrip()
        if first_line.startswith(b"{") and (_is_json_object(first_line) or (cut_off and first_line[1:2] == b'"')):
            raise UnknownFileFormatError(
                f"corpus file {path!r} looks like JSON Lines (its first line is a JSON object) but its name does not "
                f"say so, and it would be read as plain text lines. Fix: rename it *.jsonl (or *.jsonl.gz), or pass "
                f"the format ({_FORMAT_FLAGS}=jsonl; =lines if these really are text lines)")


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False


def _import(module: str, package: str, path: str):
    try:
        return __import__(module)
    except ImportError as error:
        raise ImportError(f"reading corpus file {path!r} needs the {package} package: pip install {package} "
                          f"({error})") from error


# ---------------------------------------------------------------------------------------------------------------
# Records


class _BadRecords:
    """Stops at a file's first bad record, or (skip_bad_records) counts them and warns once when the file is done."""

    def __init__(self, path: str, skip: bool, stats):
        self.path, self.skip, self.stats = path, skip, stats
        self.count, self.first = 0, None

    def __call__(self, where: str, problem: str, *, count: int = 1, stopping_note: str = "") -> None:
        if not self.skip:
            raise BadRecordError(f"corpus file {self.path!r}, {where}: {problem}; the first bad record in this "
                                 f"file{stopping_note}. {_SKIP_FIX}")
        self.count += count
        self.stats.bad_records += count
        if self.first is None:
            self.first = f"{where}: {problem}"

    def report(self) -> None:
        if self.count:
            _log.warning("corpus file %s: skipped %d bad record(s) (skip_bad_records); the first at %s", self.path,
                         self.count, self.first)


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean"}


def _describe(value) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def iter_record_texts(path: str, layout: str, *, field: str, skip_bad_records: bool, stats) -> Iterator[str]:
    """The text of each record of one file in `layout` (one of RECORD_FORMATS), in file order."""
    stats.files += 1
    bad = _BadRecords(path, skip_bad_records, stats)
    reader = {"jsonl": _jsonl_texts, "parquet": _parquet_texts, "csv": _csv_texts, "tsv": _csv_texts}[layout]
    yield from reader(path, field, bad, layout)
    bad.report()


def _jsonl_texts(path: str, field: str, bad: _BadRecords, _layout: str) -> Iterator[str]:
    from bert_jax.data import corpus  # pylint: disable=import-outside-toplevel
    with open_decompressed(path) as stream:
        for line_number, line in enumerate(corpus.iter_byte_lines(stream), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:  # not JSON, or not UTF-8
                hint = (" (a file holding one JSON array is not JSON Lines: write one object per line)"
                        if line_number == 1 and line.lstrip().startswith(b"[") else "")
                bad(f"line {line_number}", f"not a JSON line ({error}){hint}")
                continue
            if not isinstance(record, dict):
                bad(f"line {line_number}", f"the line holds {_describe(record)}, not an object with a {field!r} field")
                continue
            text = record.get(field)
            if isinstance(text, str):
                yield text
            elif text is None:
                fields = ", ".join(repr(name) for name in list(record)[:10])
                bad(f"line {line_number}", f"field {field!r} is {'null' if field in record else 'missing'} "
                    f"(the record's fields: {fields or 'none'})")
            else:
                bad(f"line {line_number}", f"field {field!r} is {_describe(text)}, not a string")


def _csv_texts(path: str, field: str, bad: _BadRecords, layout: str) -> Iterator[str]:
    # The module-wide limit (128 KiB a field by default) would reject long documents. Raised, never lowered again:
    # readers in other threads (Beam's) may be reading long fields at the time.
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    with open_decompressed(path) as stream:
        # utf-8-sig: spreadsheet exports start with a byte-order mark, which would rename the first column.
        text_stream = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
        reader = csv.reader(text_stream, delimiter="\t" if layout == "tsv" else ",")
        try:
            header = next(reader, None)
            if header is None:
                return  # an empty file: no records, none of them bad
            if field not in header:
                rows = sum(1 for row in reader if row)
                columns = ", ".join(repr(name) for name in header[:20])
                bad("line 1 (the header)", f"no column {field!r} (its columns: {columns or 'none'}), so all "
                    f"{rows} rows are bad records", count=rows)
                return
            column = header.index(field)
            for row in reader:
                if not row:
                    continue  # a blank line
                if column < len(row):
                    yield row[column]
                else:
                    bad(f"line {reader.line_num}", f"the row has {len(row)} fields, none in column {field!r}")
        except (csv.Error, UnicodeDecodeError) as error:
            # Past here the file's rows cannot be told apart again, so even a skipping run stops.
            raise BadRecordError(f"corpus file {path!r}, line {reader.line_num + 1}: not readable as {layout} "
                                 f"({error}). Fix the file (UTF-8, one header row), or pass its format "
                                 f"({_FORMAT_FLAGS})") from None


def _parquet_texts(path: str, field: str, bad: _BadRecords, _layout: str) -> Iterator[str]:
    from bert_jax import fileio  # pylint: disable=import-outside-toplevel
    pyarrow = _import("pyarrow", "pyarrow", path)
    import pyarrow.parquet as parquet  # pylint: disable=import-outside-toplevel
    with contextlib.ExitStack() as stack:
        # A local path lets pyarrow read with its own (memory-mapped) files; remote ones are seeked in through fileio.
        source = stack.enter_context(_open_binary(path)) if fileio.is_remote(path) else path
        try:
            parquet_file = stack.enter_context(parquet.ParquetFile(source))
        except pyarrow.ArrowInvalid as error:
            raise UnknownFileFormatError(f"corpus file {path!r} is not a Parquet file ({error}): name it by its "
                                         f"format, or pass the format ({_FORMAT_FLAGS})") from None
        schema = parquet_file.schema_arrow
        rows = parquet_file.metadata.num_rows
        if field not in schema.names:
            columns = ", ".join(repr(name) for name in schema.names[:20])
            bad("its schema", f"no column {field!r} (its columns: {columns}), so all {rows} rows are bad records",
                count=rows)
            return
        column_type = schema.field(field).type
        if not _is_string_type(pyarrow, column_type):
            bad("its schema", f"column {field!r} holds {column_type}, not strings, so all {rows} rows are bad "
                "records", count=rows)
            return
        null_note = _parquet_null_note(parquet_file, schema.get_field_index(field), field)
        for group in range(parquet_file.num_row_groups):
            row = 0
            for batch in parquet_file.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group],
                                                   columns=[field], use_threads=False):
                for text in batch.column(0).to_pylist():
                    if text is None:
                        bad(f"row group {group}, row {row}", f"column {field!r} is null", stopping_note=null_note)
                    else:
                        yield text
                    row += 1


class _SeekableReader(io.RawIOBase):
    """A tf.io.gfile.GFile as a regular binary file object (GFile lacks `closed` and `readable`, and its seek returns
    nothing)."""

    def __init__(self, file):
        super().__init__()
        self._file = file

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._file.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._file.seek(offset, whence)
        return self._file.tell()

    def tell(self) -> int:
        return self._file.tell()


def _is_string_type(pyarrow, column_type) -> bool:
    if pyarrow.types.is_dictionary(column_type):
        column_type = column_type.value_type
    return (pyarrow.types.is_string(column_type) or pyarrow.types.is_large_string(column_type)
            or pyarrow.types.is_string_view(column_type))


def _parquet_null_note(parquet_file, column_index: int, field: str) -> str:
    """', which holds N null ...' from the row groups' statistics, when every row group has them; else ''."""
    metadata, nulls = parquet_file.metadata, 0
    try:
        for group in range(metadata.num_row_groups):
            statistics = metadata.row_group(group).column(column_index).statistics
            if statistics is None or not statistics.has_null_count:
                return ""
            nulls += statistics.null_count
    except (IndexError, ValueError):  # a nested schema's leaf columns do not line up with its fields
        return ""
    return f", which holds {nulls} null {field!r} values in all (from its statistics)"
