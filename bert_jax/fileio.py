"""Files on local disk or behind a URL scheme (gs://, s3://, ...): plain Python locally, tf.io.gfile otherwise.

TensorFlow takes seconds and hundreds of MB to import; making pretraining data from local text into local shards
should not pay that in the process that feeds the workers.
"""

import glob as glob_lib
import json
import os
import posixpath


def is_remote(path: str) -> bool:
    return "://" in path


def join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if is_remote(directory) else os.path.join(directory, name)


def _gfile():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.io.gfile


def glob(pattern: str) -> list[str]:
    """Sorted matches of `pattern` (an empty list when nothing matches)."""
    if not is_remote(pattern):
        return sorted(glob_lib.glob(pattern))
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    try:
        return sorted(tf.io.gfile.glob(pattern))
    except tf.errors.NotFoundError:
        return []


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def makedirs(path: str) -> None:
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def rename(source: str, target: str) -> None:
    """Moves `source` to `target`, replacing it (atomically on local disk)."""
    if is_remote(source):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def remove(path: str) -> None:
    if is_remote(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def open_file(path: str, mode: str = "r"):
    """A file object for `path`; text modes use UTF-8."""
    if is_remote(path):
        return _gfile().GFile(path, mode)
    return open(path, mode, encoding=None if "b" in mode else "utf-8")  # pylint: disable=consider-using-with


def write_json(path: str, value) -> None:
    """`value` as indented JSON (a trailing newline), for the small metadata and prediction files."""
    with open_file(path, "w") as file:
        file.write(json.dumps(value, indent=2) + "\n")
