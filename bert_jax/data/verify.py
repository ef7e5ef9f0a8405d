"""Damaged TFRecord shards: found before a run starts on them, and named (with the byte and the fix) when met.

`python -m bert_jax.data.verify DIR_OR_GLOB[,...] [--max_seq_length=N --max_predictions_per_seq=M]` reads every
record of every shard: its framing (cut short, the length's and the data's CRCs) and its feature layout (the
features of the first record, and of metadata.json beside the shards when there is one). It prints a line per
damaged shard and a summary, and exits 1 if any shard is damaged.

A run checks less, to start quickly: `check_framing` walks the record headers of its local shards (a shard cut
short, as an interrupted copy leaves it, or a corrupted length), and `locate_damage` turns TensorFlow's DataLossError,
which names no file, into the shard and byte that caused it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from typing import Sequence

from absl import logging

from bert_jax import fileio
from bert_jax import record_framing
from bert_jax.data import tfrecord

# The start-up walk reads headers at about 0.6 M records/s here (530 MB/s of 128-token records; docs/data.md): this
# many bytes per process cost a few seconds; past them the rest is left to the verify command, with a log line.
STARTUP_CHECK_BYTES = 2 << 30
_PARSE_BATCH = 2048  # records parsed together for the layout check: one TensorFlow call each
_TF_OFFSET = re.compile(r"(truncated|corrupted) record at (\d+)")


class DamagedShardError(ValueError):
    """A shard that is cut short, fails a CRC, or holds records of another layout: one message naming the shard, the
    byte of the first bad record, what is wrong and the fix."""

    def __init__(self, path: str, offset: int, problem: str, flag: str = "--config.data.input_files",
                 suggest_verify: bool = True):
        verify_all = (f"; `python -m bert_jax.data.verify {os.path.dirname(path) or '.'}` checks every shard"
                      if suggest_verify else "")
        super().__init__(
            f"damaged shard {path}: {problem}{f'; the records before byte {offset} are whole' if offset else ''}. "
            "Fix: remake it "
            "(python -m bert_jax.data.create ...) or recopy it from where it was made, or leave it out of "
            f"{flag} knowingly{verify_all}")
        self.path, self.offset, self.problem = path, offset, problem


def _damaged(error: record_framing.FramingError, flag: str, suggest_verify: bool = True) -> DamagedShardError:
    return DamagedShardError(error.path, error.offset, error.problem, flag, suggest_verify)


# ---------------------------------------------------------------------------------------------------------------
# What a run checks: at start-up, and when TensorFlow meets a bad record.


# Shards whose framing was walked whole in this process, by (path, size, modification time): the held-out files are
# checked when the config is validated and again by every evaluation's iterator, the training files at every
# restart of the input; a shard that has not changed is not walked again.
_WALKED: set[tuple[str, int, int]] = set()


def check_framing(files: Sequence[str], *, flag: str, budget_bytes: int = STARTUP_CHECK_BYTES) -> None:
    """Walks the record headers of the local `files` (no data read); raises DamagedShardError for the first shard
    cut short or with a corrupted length. Smallest first, since a shard cut short is smaller than its siblings; past
    `budget_bytes` the rest are left out, and gs:// files always (a walk there is a read per record), with a log
    line each. A flipped byte in the data is the verify command's to find, or `locate_damage`'s when a run meets it."""
    local = sorted((path for path in files if not fileio.is_remote(path)), key=os.path.getsize)
    remote = len(files) - len(local)
    started, walked, walked_bytes, records = time.perf_counter(), 0, 0, 0
    for path in local:
        stat = os.stat(path)
        if walked and walked_bytes + stat.st_size > budget_bytes:
            break
        key = (path, stat.st_size, stat.st_mtime_ns)
        if key not in _WALKED:
            try:
                records += sum(1 for _ in record_framing.record_offsets(path))
            except record_framing.FramingError as error:
                raise _damaged(error, flag) from None
            _WALKED.add(key)
        walked, walked_bytes = walked + 1, walked_bytes + stat.st_size
    if walked:
        logging.info("input %s: the record framing of %d local shard(s) is whole (%d records, %.1f MB, walked in "
                     "%.2f s)", flag, walked, records, walked_bytes / 1e6, time.perf_counter() - started)
    if len(local) > walked:
        logging.info("input %s: %d larger local shard(s) not walked at start-up (past %.1f GB); `python -m "
                     "bert_jax.data.verify` checks them", flag, len(local) - walked, budget_bytes / 1e9)
    if remote:
        logging.info("input %s: %d remote shard(s) not walked at start-up; `python -m bert_jax.data.verify` checks "
                     "them", flag, remote)


def locate_damage(files: Sequence[str], reason: str, *, flag: str) -> DamagedShardError | None:
    """The shard among `files` that TensorFlow's DataLossError `reason` ("truncated record at N", "corrupted record
    at N", naming no file) came from, as a DamagedShardError; None if none is found damaged up to that byte.

    Only the records up to byte N are read, headers first (cheap: they find a cut or a bad length), then the one
    record at N of each file that has one there (TF's N is its start, or its data's 12 bytes later)."""
    match = _TF_OFFSET.search(reason)
    offset = int(match.group(2)) if match else None
    to_read = [(path, 0) for path in files if fileio.is_remote(path)]  # no cheap header walk there: read from 0
    for path in (path for path in files if not fileio.is_remote(path)):
        if offset is not None and os.path.getsize(path) <= offset:
            continue
        try:
            for start in record_framing.record_offsets(path):
                if offset is not None and start in (offset - 12, offset):
                    to_read.append((path, start))
                if offset is not None and start >= offset:
                    break
        except record_framing.FramingError as error:
            return _damaged(error, flag)
        if offset is None:
            to_read.append((path, 0))
    for path, start in to_read:
        try:
            for record_start, _ in record_framing.walk_records(path, start=start):
                if offset is not None and record_start >= offset - 12:
                    break
        except record_framing.FramingError as error:
            return _damaged(error, flag)
    return None


def damaged_shard_error(files: Sequence[str], reason: str, *, source: str, flag: str) -> ValueError:
    """The error for TensorFlow's DataLossError `reason`, met reading `files` (from `source`, the globs of `flag`):
    the damaged shard's, or, where none is found, one that says how to find it."""
    damaged = locate_damage(files, reason, flag=flag)
    if damaged is not None:
        return damaged
    reason = reason.split("}}")[-1].split(" [Op:")[0].strip()  # TF wraps it in graph-function and op names
    return ValueError(f"reading {source}: {reason}, in a shard not found again; find it with `python -m "
                      f"bert_jax.data.verify {source}`, then remake or recopy it, or leave it out of {flag} knowingly")


def unparsable_record_error(files: Sequence[str], reason: str, *, source: str, flag: str) -> ValueError:
    """The error for TensorFlow's InvalidArgumentError `reason`, met parsing `files` (a record of another layout
    than the first record's, which the start-up check read): the first shard holding one, found by the verify
    command's own checks, or, where none is found, one that says how to find it."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (only once a run has failed to parse)
    layout = _Layout(tf, {})
    for path in files:
        report = verify_shard(path, layout, None, flag=flag)
        if report.problem:
            return ValueError(report.problem)
    reason = reason.split("}}")[-1].split(" [Op:")[0].strip()
    return ValueError(f"reading {source}: a record does not parse ({reason}); find it with `python -m "
                      f"bert_jax.data.verify {source}`, then remake or recopy its shard, or leave it out of {flag} "
                      "knowingly")


# ---------------------------------------------------------------------------------------------------------------
# The verify command: every record of every shard.


@dataclasses.dataclass
class ShardReport:
    path: str
    records: int = 0
    bytes: int = 0
    problem: str | None = None  # the damaged shard's message; None when whole


class _Layout:
    """The features every record must have: those of the first record read, held to metadata.json and the lengths
    given on the command line."""

    def __init__(self, tf, lengths: dict[str, int]):
        self._tf, self._lengths = tf, lengths  # {config field: length}, e.g. {"max_seq_length": 128}
        self.reference: dict[str, tuple[str, int]] | None = None
        self._spec = None

    def features(self, data: bytes) -> dict[str, tuple[str, int]]:
        example = self._tf.train.Example.FromString(data)
        found = {}
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            found[name] = (kind, len(getattr(feature, kind).value) if kind else 0)
        return found

    def difference(self, data: bytes, metadata: dict | None) -> str | None:
        """What is wrong with the features of `data` (a shard's first record), or None."""
        try:
            found = self.features(data)
        except Exception as error:  # pylint: disable=broad-except  (protobuf's DecodeError depends on its backend)
            return f"not a tf.train.Example ({error})"
        if metadata is not None and set(metadata.get("features", found)) != set(found):
            return f"its features {sorted(found)} are not metadata.json's {sorted(metadata['features'])}"
        lengths = dict(self._lengths)
        for field in ("max_seq_length", "max_predictions_per_seq"):
            if metadata is not None and field in metadata:
                lengths.setdefault(field, metadata[field])
        for name, field in tfrecord.LENGTH_FIELDS.items():
            if name in found and field in lengths and found[name][1] != lengths[field]:
                source = f"metadata.json says {field}=" if field not in self._lengths else f"--{field}="
                return f"feature {name!r} has length {found[name][1]}, but {source}{lengths[field]}"
        if self.reference is None:
            self.reference = found
        elif found != self.reference:
            return f"its features {_describe(found)} differ from the first shard's {_describe(self.reference)}"
        return None

    def bad_record(self, batch: list[bytes]) -> tuple[int, str] | None:
        """(index in `batch`, TF's reason) of the first record that does not parse with the reference's features."""
        tf = self._tf
        if self._spec is None:
            types = {"float_list": tf.float32, "int64_list": tf.int64, "bytes_list": tf.string}
            self._spec = {name: tf.io.FixedLenFeature([length], types.get(kind, tf.int64))
                          for name, (kind, length) in self.reference.items()}
        try:
            tf.io.parse_example(batch, self._spec)
            return None
        except tf.errors.InvalidArgumentError:
            pass
        for index, data in enumerate(batch):  # only for a batch that failed: which record
            try:
                tf.io.parse_single_example(data, self._spec)
            except tf.errors.InvalidArgumentError as error:
                return index, error.message.split(" [Op:")[0].strip()
        return None


def _describe(features: dict[str, tuple[str, int]]) -> str:
    return "{" + ", ".join(f"{name}: {length}" for name, (_, length) in sorted(features.items())) + "}"


def verify_shard(path: str, layout: _Layout | None, metadata: dict | None, *,
                 flag: str = "--config.data.input_files") -> ShardReport:
    """Every record of `path`: framing, CRCs and (unless `layout` is None) features."""
    report, batch, batch_offsets = ShardReport(path), [], []

    def check_batch():
        bad = layout.bad_record(batch) if batch and layout is not None else None
        if bad is not None:
            index, reason = bad
            raise DamagedShardError(path, batch_offsets[index], f"feature layout differs: the record at byte "
                                    f"{batch_offsets[index]} does not parse as the first shard's ({reason})",
                                    flag, suggest_verify=False)
        batch.clear()
        batch_offsets.clear()

    try:
        for offset, data in record_framing.walk_records(path):
            if report.records == 0 and layout is not None:
                problem = layout.difference(data, metadata)
                if problem is not None:
                    raise DamagedShardError(path, offset, f"feature layout differs: {problem}", flag,
                                            suggest_verify=False)
            report.records += 1
            report.bytes = offset + len(data) + 16
            if layout is not None:
                batch.append(data)
                batch_offsets.append(offset)
                if len(batch) == _PARSE_BATCH:
                    check_batch()
        check_batch()
        if report.records == 0:
            report.problem = str(DamagedShardError(path, 0, "it holds no records", flag, suggest_verify=False))
    except record_framing.FramingError as error:
        report.problem = str(_damaged(error, flag, suggest_verify=False))
    except DamagedShardError as error:
        report.problem = str(error)
    return report


def shard_files(patterns: str) -> tuple[list[str], list[str]]:
    """(the shards that `patterns` name, the problems of missing ones): a directory's shards are its *.tfrecord*
    files and those its metadata files list (each listed one that is missing is a problem); globs, comma-separated."""
    files, missing = set(), []
    for pattern in (piece.strip() for piece in patterns.split(",") if piece.strip()):
        if fileio.isdir(pattern):
            files.update(fileio.glob(fileio.join(pattern, "*.tfrecord*")))
            for name, metadata in _metadata_files(pattern).items():
                for shard in metadata.get("files", []):
                    path = fileio.join(pattern, shard)
                    if fileio.exists(path):
                        files.add(path)
                    else:
                        missing.append(f"missing shard {path}: {name} lists it. Fix: remake the data "
                                       "(python -m bert_jax.data.create ...) or recopy the shard")
        else:
            matches = fileio.glob(pattern)
            if not matches:
                missing.append(f"no files match {pattern!r}")
            files.update(matches)
    return sorted(files), missing


def _metadata_files(directory: str) -> dict[str, dict]:
    found = {}
    for path in fileio.glob(fileio.join(directory, "*metadata.json")):
        try:
            with fileio.open_file(path) as file:
                found[path] = json.load(file)
        except (OSError, ValueError):
            continue  # not ours: the shards are checked without it
    return found


def _metadata_by_shard(files: list[str]) -> dict[str, dict]:
    by_shard = {}
    for directory in sorted({os.path.dirname(path) for path in files}):
        for metadata in _metadata_files(directory or ".").values():
            for shard in metadata.get("files", []):
                by_shard[fileio.join(directory, shard) if directory else shard] = metadata
    return by_shard


def verify(patterns: str, *, max_seq_length: int | None = None, max_predictions_per_seq: int | None = None,
           framing_only: bool = False, out=None) -> bool:
    """Verifies the shards `patterns` names (directories or globs, comma-separated), printing a line per damaged
    shard and a summary to `out`; True if every shard is whole. `framing_only` skips the feature layout (and
    TensorFlow): about three times faster."""
    out = out or sys.stdout
    files, problems = shard_files(patterns)
    for problem in problems:
        print(problem, file=out)
    if not files:
        print(f"no shards in {patterns}: a directory's are its *.tfrecord* files and those its metadata.json lists; "
              "name others with a glob", file=out)
        return False
    layout = None
    if not framing_only:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel  (the layout check parses the records)
        lengths = {field: value for field, value in (("max_seq_length", max_seq_length),
                                                     ("max_predictions_per_seq", max_predictions_per_seq)) if value}
        layout = _Layout(tf, lengths)
    started = time.perf_counter()  # after TensorFlow's import (seconds), to give the reading's own rate
    by_shard = _metadata_by_shard(files)
    records = size = 0
    for path in files:
        report = verify_shard(path, layout, by_shard.get(path))
        records, size = records + report.records, size + report.bytes
        if report.problem:
            problems.append(report.problem)
            print(report.problem, file=out, flush=True)
    seconds = time.perf_counter() - started
    print(f"verified {len(files)} shard(s): {records} records, {size / 1e6:.1f} MB in {seconds:.2f} s "
          f"({size / 1e6 / max(seconds, 1e-9):.0f} MB/s); "
          + (f"{len(problems)} problem(s)" if problems else "all whole"), file=out)
    return not problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_jax.data.verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", help="a directory of shards, or globs (local or gs://), comma-separated")
    parser.add_argument("--max_seq_length", type=int, help="the length the run will read (default: the data's)")
    parser.add_argument("--max_predictions_per_seq", type=int, help="likewise, for the masked positions")
    parser.add_argument("--framing_only", action="store_true",
                        help="check the framing and CRCs only, not the features (faster, without TensorFlow)")
    args = parser.parse_args(argv)
    return 0 if verify(args.patterns, max_seq_length=args.max_seq_length,
                       max_predictions_per_seq=args.max_predictions_per_seq, framing_only=args.framing_only) else 1


if __name__ == "__main__":
    sys.exit(main())
