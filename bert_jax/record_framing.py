"""TFRecord framing: each record as its length, a masked CRC-32C of the length, the bytes, a masked CRC-32C of them.

Both the pretraining shards (bert_jax.data.tfrecord) and TensorBoard's event files (bert_jax.metrics) are framed
so; the framing lives here, outside data/, so that metrics can write and trim event files without depending on the
data stages. Local files are framed by hand (TensorFlow takes seconds to import and is absent from many GPU
images); other filesystems (gs://, ...) go through tf.io.TFRecordWriter.
"""

import struct

import google_crc32c

from bert_jax import fileio


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_framed_records(path: str) -> tuple[list[bytes], bool]:
    """Every whole record of the TFRecord file `path` as framed on disk (what frame_record returns), and whether the
    file ends in a record cut short or failing its CRCs (that record and anything after it are left out)."""
    with fileio.open_file(path, "rb") as file:
        data = file.read()
    records, offset = [], 0
    while offset < len(data):
        length = struct.unpack("<Q", data[offset:offset + 8])[0] if offset + 12 <= len(data) else None
        end = offset + 12 + length + 4 if length is not None else len(data) + 1
        if (end > len(data)
                or struct.unpack("<I", data[offset + 8:offset + 12])[0] != _masked_crc(data[offset:offset + 8])
                or struct.unpack("<I", data[end - 4:end])[0] != _masked_crc(data[offset + 12:end - 4])):
            return records, True
        records.append(data[offset:end])
        offset = end
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
