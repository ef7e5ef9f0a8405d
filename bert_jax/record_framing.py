"""TFRecord framing: each record as its length, a masked CRC-32C of the length, the bytes, a masked CRC-32C of them.

Both the pretraining shards (bert_jax.data.tfrecord) and TensorBoard's event files (bert_jax.metrics) are framed
so; the framing lives here, outside data/, so that metrics can write and trim event files without depending on the
data stages. Local files are framed by hand (TensorFlow takes seconds to import and is absent from many GPU
images); other filesystems (gs://, ...) go through tf.io.TFRecordWriter.
"""

import os
import struct
from typing import Iterator

import google_crc32c

from bert_jax import fileio


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_HEADER = struct.Struct("<QI")  # the record's length, the masked CRC of the length
_CRC = struct.Struct("<I")
_FRAMING_BYTES = 16  # the header's 12 and the data's CRC


class FramingError(ValueError):
    """The first record of a file that is cut short or fails a CRC: it starts at byte `offset` of the file's `size`.

    Everything before `offset` is whole; nothing from `offset` on can be trusted, since a record's length is what
    finds the next one.
    """

    def __init__(self, path: str, offset: int, size: int, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.offset, self.size, self.problem = path, offset, size, problem


def _cut_short(path: str, offset: int, size: int, needed: int | None) -> FramingError:
    if needed is None:
        return FramingError(path, offset, size, f"cut short: the file ends at byte {size}, inside the 12-byte "
                            f"header of the record at byte {offset}")
    return FramingError(path, offset, size, f"cut short: the record at byte {offset} runs to byte "
                        f"{offset + needed}, but the file ends at byte {size} ({offset + needed - size} bytes "
                        "missing)")


def _length_crc_mismatch(path: str, offset: int, size: int) -> FramingError:
    return FramingError(path, offset, size, f"length CRC mismatch: the length of the record at byte {offset} "
                        "fails its CRC (a corrupted byte, or not a TFRecord file)")


def _file_size(file) -> int:
    file.seek(0, os.SEEK_END)  # local files and tf.io.gfile.GFile alike
    return file.tell()


def walk_records(path: str, *, start: int = 0, chunk_size: int = 1 << 22) -> Iterator[tuple[int, bytes]]:
    """(offset, data) of every record of `path` from byte `start` (a record's offset) on, read in chunks (never the
    whole file at once), both CRCs checked; raises FramingError at the first record cut short or failing a CRC."""
    with fileio.open_file(path, "rb") as file:
        if start:
            file.seek(start)
        buffer, position = b"", 0  # from here on `start` is the file offset of buffer[0]
        unpack_header, unpack_crc, crc = _HEADER.unpack_from, _CRC.unpack_from, _masked_crc  # a few % per record
        while True:
            if len(buffer) - position < 12:
                more = file.read(chunk_size)
                buffer, start, position = buffer[position:] + more, start + position, 0
                if not buffer:
                    return
                if len(buffer) < 12:
                    raise _cut_short(path, start, start + len(buffer), None)
            length, length_crc = unpack_header(buffer, position)
            if length_crc != crc(buffer[position:position + 8]):
                raise _length_crc_mismatch(path, start + position, _file_size(file))
            end = position + length + _FRAMING_BYTES
            if end > len(buffer):
                more = file.read(max(chunk_size, end - len(buffer)))
                buffer, start, end, position = buffer[position:] + more, start + position, end - position, 0
                if end > len(buffer):
                    raise _cut_short(path, start, start + len(buffer), length + _FRAMING_BYTES)
            data = buffer[position + 12:end - 4]
            if unpack_crc(buffer, end - 4)[0] != crc(data):
                raise FramingError(path, start + position, _file_size(file),
                                   f"data CRC mismatch: the data of the record at byte {start + position} fails its "
                                   "CRC (a corrupted byte)")
            yield start + position, data
            position = end


def record_offsets(path: str) -> Iterator[int]:
    """The offset of every record of the local file `path`, from the headers alone: each length and its CRC is read
    and the data skipped, so that a file cut short or with a corrupted length is found without reading its data.
    Raises FramingError at the first such record; a flipped byte in the data passes (walk_records finds it)."""
    size = os.path.getsize(path)
    offset = 0
    with open(path, "rb", buffering=1 << 20) as file:  # the skips stay inside the buffer: no system call each
        read, seek, unpack, crc = file.read, file.seek, _HEADER.unpack, _masked_crc
        while offset < size:
            header = read(12)
            if len(header) < 12:
                raise _cut_short(path, offset, size, None)
            length, length_crc = unpack(header)
            if length_crc != crc(header[:8]):
                raise _length_crc_mismatch(path, offset, size)
            if offset + length + _FRAMING_BYTES > size:
                raise _cut_short(path, offset, size, length + _FRAMING_BYTES)
            yield offset
            offset += length + _FRAMING_BYTES
            seek(offset)


def read_framed_records(path: str) -> tuple[list[bytes], bool]:
    """Every whole record of the TFRecord file `path` as framed on disk (what frame_record returns), and whether the
    file ends in a record cut short or failing its CRCs (that record and anything after it are left out)."""
    records = []
    try:
        for _, data in walk_records(path):
            records.append(frame_record(data))  # the bytes on disk: their CRCs were just checked
    except FramingError:
        return records, True
    return records, False


def frame_record(data: bytes) -> bytes:
    """One record in the TFRecord file format: length, masked CRC-32C of the length, data, masked CRC-32C of it."""
    length = struct.pack("<Q", len(data))
    return b"".join((length, struct.pack("<I", _masked_crc(length)), data, struct.pack("<I", _masked_crc(data))))


class TFRecordWriter:
    """Writes TFRecord files: by hand on local disk, through tf.io.TFRecordWriter elsewhere (gs://, ...)."""

    def __init__(self, path: str):
        if fileio.is_remote(path):
            import tensorflow as tf  # pylint: disable=import-outside-toplevel
            self._writer = tf.io.TFRecordWriter(path)
            self.write = self._writer.write
        else:
            self._writer = open(path, "wb")  # pylint: disable=consider-using-with
            self.write = lambda record: self._writer.write(frame_record(record))
        self.flush = self._writer.flush

    def close(self) -> None:
        self._writer.close()
