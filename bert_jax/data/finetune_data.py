"""Fine-tuning data: examples from CSV/TSV/text files or prepared TFDS datasets, label ids, [CLS] a [SEP] b [SEP]
encoding, and the batch index streams the fine-tuning loops feed from (in memory: GLUE-sized data fits)."""

import csv
import dataclasses
import json
import os
import re
from typing import Iterator

from absl import logging
import numpy as np

from bert_jax import fileio
from bert_jax.data import tokenization

FORMATS = ("auto", "csv", "tsv", "tfds", "txt", "glue")  # glue: a GLUE task's own TSV (data.glue_task names it)
TFDS_PREFIX = "tfds:"

_VERSION = re.compile(r"\d+\.(?:\d+|\*)\.(?:\d+|\*)")
_COLON_OUTSIDE_BRACKETS = re.compile(r":(?![^\[]*\])")  # keeps a split slice such as train[:10%] whole


def split_names(text: str) -> list[str]:
    return [name.strip() for name in str(text).split(",") if name.strip()]


# ---------------------------------------------------------------------------------------------------------------
# Data: examples from CSV/TSV/text/TFDS, label ids, and [CLS] a [SEP] b [SEP] encoding.

@dataclasses.dataclass
class Examples:
    """Texts by column (one list per text column), raw labels (strings) or None, and where they came from."""
    texts: list[list[str]]
    labels: list[str] | None
    source: str
    class_names: list[str] | None = None  # the source's own class order (a TFDS ClassLabel), if it has one
    ids: list[str] | None = None  # a test split's index column, which the GLUE server's submission files key on


def _format(path: str, configured: str) -> str:
    if configured != "auto":
        return configured
    if path.startswith(TFDS_PREFIX):
        return "tfds"
    return {".tsv": "tsv", ".txt": "txt"}.get(os.path.splitext(path)[1].lower(), "csv")


def read_examples(path: str, data_config, with_labels: bool = True, field: str = "data.train_file") -> Examples:
    """The examples of one source; `field` names the config field that gave `path`, for error messages."""
    columns = split_names(data_config.text_columns)
    label_column = data_config.label_column if with_labels else None
    kind = _format(path, data_config.format)
    if kind == "glue":
        # Imported here: bert_jax.data.glue builds on this module's Examples.
        from bert_jax.data import glue  # pylint: disable=import-outside-toplevel
        examples = glue.read_file(path, data_config.glue_task)
    elif kind == "tfds":
        examples = _read_tfds(path, columns, label_column, data_config.tfds_data_dir)
    else:
        if not fileio.exists(path):
            raise FileNotFoundError(f"--config.{field}={path!r} does not exist")
        examples = _read_lines(path) if kind == "txt" else _read_table(path, kind, columns, label_column, field)
    if not examples.texts[0]:
        raise ValueError(f"--config.{field}={path!r} holds no examples")
    return examples


def _read_lines(path: str) -> Examples:
    with fileio.open_file(path) as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return Examples([[line.rstrip("\r") for line in lines]], None, path)


def _read_table(path: str, kind: str, columns: list[str], label_column: str | None, field: str) -> Examples:
    # TSV as in the original run_classifier.py: no quoting, so a stray quote in a sentence stays text.
    quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
    with fileio.open_file(path) as f:
        reader = csv.DictReader(f, delimiter="\t" if kind == "tsv" else ",", quoting=quoting)
        header = list(reader.fieldnames or [])
        wanted = [("data.text_columns", column) for column in columns]
        wanted += [("data.label_column", label_column)] if label_column else []
        for column_field, column in wanted:
            if column not in header:
                raise ValueError(f"{path} (--config.{field}) has no column {column!r} (--config.{column_field}); "
                                 f"its header row has {header}. Fix: set --config.{column_field} to one of them")
        texts, labels = [[] for _ in columns], [] if label_column else None
        for row in reader:
            values = [row[column] for _, column in wanted]
            if any(value is None for value in values):
                raise ValueError(f"{path}:{reader.line_num}: the row has fewer fields than the header {header}")
            for index in range(len(columns)):
                texts[index].append(values[index])
            if label_column:
                labels.append(values[-1].strip())
    return Examples(texts, labels, path)


def _parse_tfds(path: str) -> tuple[str, str]:
    """'tfds:NAME[:VERSION][:SPLIT]' -> (name, split); the split defaults to train."""
    parts = _COLON_OUTSIDE_BRACKETS.split(path[len(TFDS_PREFIX):] if path.startswith(TFDS_PREFIX) else path)
    name = parts.pop(0)
    if parts and _VERSION.fullmatch(parts[0]):
        name = f"{name}:{parts.pop(0)}"
    if not name or len(parts) > 1 or not all(parts):
        raise ValueError(f"{path!r} is not of the form 'tfds:NAME[:VERSION][:SPLIT]', e.g. 'tfds:glue/sst2:train'")
    return name, parts[0] if parts else "train"


def _read_tfds(path: str, columns: list[str], label_column: str | None, data_dir: str) -> Examples:
    name, split = _parse_tfds(path)
    try:
        import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError(f"{path!r} needs tensorflow-datasets and importlib_resources: pip install "
                          f"tensorflow-datasets importlib_resources ({error})") from error
    data_dir = data_dir or os.environ.get("TFDS_DATA_DIR") or None
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(f"{path!r}: TensorFlow Datasets has no dataset {name!r}; check the name against "
                         "tfds.list_builders() (configs go after a slash, e.g. 'glue/sst2')") from None
    features = builder.info.features
    needed = columns + ([label_column] if label_column else [])
    for column in needed:
        if column not in features:
            field = "data.label_column" if column == label_column else "data.text_columns"
            raise ValueError(f"{path!r}: dataset {name!r} has no feature {column!r} (--config.{field}); its "
                             f"features are {sorted(features)}")
    try:
        dataset = builder.as_dataset(split=split, shuffle_files=False,
                                     decoders=tfds.decode.PartialDecoding({column: True for column in needed}))
    except AssertionError:  # what TFDS raises for data that was never prepared
        raise FileNotFoundError(
            f"{path!r}: dataset {name!r} is not prepared in {builder.data_dir_root}, and it is never downloaded "
            f"from here. Prepare it on a machine with network access (`tfds build {name} --data_dir=DIR`), copy DIR "
            "over, and set --config.data.tfds_data_dir=DIR (or TFDS_DATA_DIR=DIR)") from None
    except (KeyError, ValueError) as error:
        raise ValueError(f"{path!r}: bad split {split!r} ({error}); dataset {name!r} has splits "
                         f"{sorted(builder.info.splits)}") from None
    class_names = None
    if label_column and isinstance(features[label_column], tfds.features.ClassLabel):
        class_names = list(features[label_column].names)
    texts, labels = [[] for _ in columns], [] if label_column else None
    for example in dataset.as_numpy_iterator():
        for index, column in enumerate(columns):
            value = example[column]
            texts[index].append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        if label_column:
            value = int(example[label_column]) if class_names else example[label_column]
            if class_names and value < 0:
                raise ValueError(f"{path!r}: an example has label {value}: split {split!r} is unlabelled (GLUE "
                                 "test splits are); use a labelled split such as validation")
            labels.append(class_names[value] if class_names else
                          value.decode("utf-8") if isinstance(value, bytes) else str(value))
    return Examples(texts, labels, path, class_names)


def label_names(examples: Examples, data_config) -> list[str]:
    """Class names in id order: data.label_names, else the source's ClassLabel, else the sorted training labels."""
    names = split_names(data_config.label_names) or examples.class_names
    if not names:
        found = set(examples.labels)
        numeric = all(re.fullmatch(r"-?\d+", label) for label in found)
        names = sorted(found, key=int) if numeric else sorted(found)
    present = set(examples.labels)
    if len(present) < 2:
        raise ValueError(f"{examples.source}: the label column --config.data.label_column={data_config.label_column!r}"
                         f" holds a single class {sorted(present)}; classification needs at least two. Fix: check "
                         "the column and the file")
    return names


def label_ids(examples: Examples, names: list[str]) -> np.ndarray:
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(examples.labels) - set(index))
    if unknown:
        raise ValueError(f"{examples.source}: labels {unknown[:5]} are not among the classes {names} (taken from "
                         "--config.data.label_names or the training data). Fix: list every class in "
                         "--config.data.label_names")
    return np.asarray([index[label] for label in examples.labels], np.int32)


def truncate_pair(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths after the original run_classifier.py truncation: drop from the end of the longer text (b on ties)."""
    while length_a + length_b > budget:
        if length_a > length_b:
            length_a -= 1
        else:
            length_b -= 1
    return length_a, length_b


def encode_examples(tokenizer: tokenization.Tokenizer, examples: Examples, max_seq_length: int) -> dict:
    """input_ids / input_mask / segment_ids [num_examples, max_seq_length]: [CLS] a [SEP] (b [SEP]), then padding."""
    pieces = [tokenizer.encode_batch(texts) for texts in examples.texts]
    pair = len(pieces) == 2
    count = len(pieces[0])
    input_ids = np.full((count, max_seq_length), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((count, max_seq_length), np.int32)
    segment_ids = np.zeros((count, max_seq_length), np.int32)
    truncated = 0
    for row in range(count):
        a, b = pieces[0][row], pieces[1][row] if pair else []
        length_a, length_b = truncate_pair(len(a), len(b), max_seq_length - (3 if pair else 2))
        truncated += (length_a, length_b) != (len(a), len(b))
        tokens = [tokenizer.cls_id, *a[:length_a], tokenizer.sep_id]
        segments = [0] * len(tokens)
        if pair:
            tokens += [*b[:length_b], tokenizer.sep_id]
            segments += [1] * (length_b + 1)
        input_ids[row, :len(tokens)] = tokens
        input_mask[row, :len(tokens)] = 1
        segment_ids[row, :len(tokens)] = segments
    if truncated:
        logging.info("%s: %d of %d examples truncated to data.max_seq_length=%d", examples.source, truncated, count,
                     max_seq_length)
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}


def train_batches(num_examples: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
    """Global batches of example indices: a new permutation each epoch, batches running across epoch ends."""
    epoch, pending = 0, np.zeros(0, np.int64)
    while True:
        while len(pending) < batch_size:
            pending = np.concatenate([pending, np.random.default_rng([seed, epoch]).permutation(num_examples)])
            epoch += 1
        yield pending[:batch_size]
        pending = pending[batch_size:]


class TrainBatches:
    """This process's rows of the training batches (train_batches' order), with a checkpointable position.

    Batch n depends on nothing but n, the seed and the examples, so the position alone (a JSON file per process,
    what bert_jax.checkpoint saves beside the state) restores the input exactly, for any number of processes.
    """

    def __init__(self, encoded: dict, labels: np.ndarray, batch_size: int, seed: int, rows: np.ndarray,
                 position: int = 0):
        self._encoded, self._labels, self._rows = encoded, labels, rows
        self._batch_size, self._seed = batch_size, seed
        self._permutations: dict[int, np.ndarray] = {}
        self.position = position  # number of batches handed out

    def indices(self, position: int) -> np.ndarray:
        """The example indices of global batch `position`."""
        count = len(self._labels)
        stream = position * self._batch_size + np.arange(self._batch_size)
        epochs = stream // count
        for epoch in set(epochs.tolist()) - set(self._permutations):
            self._permutations[epoch] = np.random.default_rng([self._seed, epoch]).permutation(count)
        # Only the epochs of this batch are kept: batches are read in order (a rewind just recomputes one).
        self._permutations = {epoch: self._permutations[epoch] for epoch in set(epochs.tolist())}
        return np.array([self._permutations[epoch][index] for epoch, index in zip(epochs, stream % count)], np.int64)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = local_batch(self._encoded, self._labels, self.indices(self.position), self._rows)
        self.position += 1
        return batch

    def save_state(self, path: str) -> None:
        fileio.write_json(path + ".json", {"position": self.position})

    def restore_state(self, path: str) -> None:
        with fileio.open_file(path + ".json") as file:
            self.position = int(json.load(file)["position"])


def ordered_batches(num_examples: int, batch_size: int) -> np.ndarray:
    """Every example once, in order, [num_batches, batch_size]; the last batch padded with -1."""
    indices = np.full(-(-num_examples // batch_size) * batch_size, -1, np.int64)
    indices[:num_examples] = np.arange(num_examples)
    return indices.reshape(-1, batch_size)


def local_batch(encoded: dict, labels: np.ndarray | None, indices: np.ndarray, rows: np.ndarray) -> dict:
    """This process's rows of one global batch; padding rows (index -1) copy example 0 and get weight 0."""
    local = indices[rows]
    take = np.maximum(local, 0)
    batch = {name: values[take] for name, values in encoded.items()}
    batch["weights"] = (local >= 0).astype(np.float32)
    if labels is not None:
        batch["label_ids"] = labels[take]
    return batch


#
