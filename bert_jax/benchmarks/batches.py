"""The benchmarks' synthetic batches, in numpy: the step benchmark's and the GPU check's, made alike from the same
seeds in every process that needs them (the GPU check's JAX side and its torch side are two).

No JAX and no TensorFlow here: a GPU image may lack TensorFlow, and the torch side has no use for JAX. Packed rows
come from the input pipeline's packer (bert_jax.data.packing, in its numpy form), so the packing the GPU check
measures is the packing a run trains on.
"""

import numpy as np

from bert_jax.data import packing

MASK_ID = 103  # [MASK] in the BERT uncased vocabulary
TASK_LABELS = {"sequence": 2, "tokens": 9, "qa": 2}  # classes of the synthetic fine-tuning batches (tokens: CoNLL's 9)
PACK_MIN_LENGTH = 16
PACK_WINDOW = 256  # bert_jax.presets' data.pack_window: instances the input pipeline packs together


def default_max_predictions(seq_length: int) -> int:
    """Masked positions per sequence when none are given: 15% of seq_length, at least 1."""
    return max(1, round(0.15 * seq_length))


def synthetic_batch(batch_size: int, seq_length: int, max_predictions: int, vocab_size: int,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """A pretraining batch in the TFRecord layout: padded pairs, distinct masked positions inside each sequence.

    Both frameworks are fed exactly these arrays. Positions are distinct so that HuggingFace's per-token labels
    (-100 elsewhere) describe the same targets as our gathered (positions, ids, weights) triple.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(seq_length // 2, seq_length + 1, size=batch_size)
    # Ordinary word pieces: above the special tokens ([PAD], [UNK], [CLS], [SEP], [MASK] sit below 1000 in BERT).
    input_ids = rng.integers(min(1000, vocab_size // 2), vocab_size, size=(batch_size, seq_length)).astype(np.int32)
    input_mask = (np.arange(seq_length)[None] < lengths[:, None]).astype(np.int32)
    segment_ids = ((np.arange(seq_length)[None] >= lengths[:, None] // 2) * input_mask).astype(np.int32)
    positions = np.zeros((batch_size, max_predictions), np.int32)
    for row, length in enumerate(lengths):
        # Inside the real tokens, skipping [CLS] and the final [SEP]; wider only if there are too few of them.
        candidates = np.arange(1, max(int(length) - 1, 2))
        if len(candidates) < max_predictions:
            candidates = np.arange(1 if seq_length > max_predictions else 0, seq_length)
        replace = len(candidates) < max_predictions
        positions[row] = np.sort(rng.choice(candidates, max_predictions, replace=replace))
    masked_lm_ids = np.take_along_axis(input_ids, positions, axis=1)
    np.put_along_axis(input_ids, positions, MASK_ID, axis=1)
    return {
        "input_ids": input_ids * input_mask,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": masked_lm_ids.astype(np.int32),
        "masked_lm_weights": np.ones((batch_size, max_predictions), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=batch_size).astype(np.int32),
    }


def pack_instance_lengths(count: int, seq_length: int, seed: int) -> np.ndarray:
    """Instance lengths of the packing comparison: uniform in [16, seq_length] (mean about half the row)."""
    return np.random.default_rng(seed).integers(min(PACK_MIN_LENGTH, seq_length), seq_length + 1, size=count)


def _instance(rng, length: int, predictions: int, vocab_size: int):
    ids = rng.integers(min(1000, vocab_size // 2), vocab_size, size=length).astype(np.int32)
    positions = np.sort(rng.choice(np.arange(1, max(length - 1, 2)), predictions, replace=length - 2 < predictions))
    return ids, positions


def unpacked_batch(lengths: np.ndarray, seq_length: int, num_predictions: int, vocab_size: int,
                   seed: int) -> dict[str, np.ndarray]:
    """One instance per row, padded: the original layout, with each instance's 15% of masked positions."""
    rng = np.random.default_rng(seed)
    rows = len(lengths)
    batch = {name: np.zeros((rows, seq_length), np.int32) for name in ("input_ids", "input_mask", "segment_ids")}
    batch.update(masked_lm_positions=np.zeros((rows, num_predictions), np.int32),
                 masked_lm_ids=np.zeros((rows, num_predictions), np.int32),
                 masked_lm_weights=np.zeros((rows, num_predictions), np.float32),
                 next_sentence_labels=rng.integers(0, 2, size=rows).astype(np.int32))
    for row, length in enumerate(lengths):
        count = min(default_max_predictions(length), num_predictions)
        ids, positions = _instance(rng, int(length), count, vocab_size)
        batch["masked_lm_ids"][row, :count] = ids[positions]
        ids[positions] = MASK_ID
        batch["input_ids"][row, :length] = ids
        batch["input_mask"][row, :length] = 1
        batch["segment_ids"][row, length // 2:length] = 1
        batch["masked_lm_positions"][row, :count] = positions
        batch["masked_lm_weights"][row, :count] = 1.0
    return batch


def packed_predictions(seq_length: int, max_instances: int) -> int:
    """MLM slots of a packed row: 15% of its tokens plus the rounding up of each instance's 15%, so a row's slots
    never run out before its tokens do."""
    return default_max_predictions(seq_length) + (max_instances + 1) // 2


def packed_batch(lengths: np.ndarray, rows: int, seq_length: int, max_instances: int, vocab_size: int,
                 seed: int, window: int = PACK_WINDOW) -> tuple[dict[str, np.ndarray], int]:
    """`rows` rows of the instances of `lengths` packed as the input pipeline packs them: in windows of `window`
    instances, each packed by bert_jax.data.packing's packer (first-fit decreasing, at most `max_instances`
    instances and packed_predictions slots per row). The instances are `unpacked_batch`'s, masked alike.

    A window's first rows hold its longest instances, tightly, and its last the leftovers: the rows are taken evenly
    over all the windows' rows, so the batch is as full as the pipeline's batches are over a run, not its fullest.
    Returns (batch, the number of instances it holds); the comparison counts instances as a steady stream would
    train them: real tokens over the mean length."""
    instances = unpacked_batch(lengths, seq_length, default_max_predictions(seq_length), vocab_size, seed)
    windows = [packing.pack_batch_numpy({name: value[start:start + window] for name, value in instances.items()},
                                        max_instances_per_row=max_instances,
                                        max_predictions_per_row=packed_predictions(seq_length, max_instances))
               for start in range(0, len(lengths), window)]
    packed = {name: np.concatenate([rows_of_window[name] for rows_of_window in windows])
              for name in packing.PACKED_FEATURES}
    available = len(packed["input_ids"])
    if available < rows:
        raise ValueError(f"{len(lengths)} instances pack into {available} rows, fewer than the {rows} asked for")
    taken = np.arange(rows) * available // rows
    batch = {name: value[taken] for name, value in packed.items()}
    return batch, int(batch["nsp_weights"].sum())


def finetune_batch(task: str, batch_size: int, seq_length: int, vocab_size: int, seed: int) -> dict[str, np.ndarray]:
    """A fine-tuning batch in bert_jax.finetune's layout (input_ids, input_mask, segment_ids, label_ids, weights):
    padded rows of 3/4 to all of seq_length tokens; labels of `task`'s kind (tokens: -100 on [CLS], the last piece
    and padding, as conll.IGNORE; qa: an answer's first and last piece inside the row)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3 * seq_length // 4, seq_length + 1, size=batch_size)
    positions = np.arange(seq_length)[None]
    input_mask = (positions < lengths[:, None]).astype(np.int32)
    batch = {"input_ids": rng.integers(1000, vocab_size, size=(batch_size, seq_length)).astype(np.int32) * input_mask,
             "input_mask": input_mask,
             "segment_ids": ((positions >= seq_length // 4) * input_mask).astype(np.int32),
             "weights": np.ones(batch_size, np.float32)}
    if task == "sequence":
        batch["label_ids"] = rng.integers(0, TASK_LABELS[task], size=batch_size).astype(np.int32)
    elif task == "tokens":
        labels = rng.integers(0, TASK_LABELS[task], size=(batch_size, seq_length)).astype(np.int32)
        labels[(positions == 0) | (positions >= lengths[:, None] - 1)] = -100
        batch["label_ids"] = labels
    else:
        start = rng.integers(seq_length // 4, lengths - 8)
        batch["label_ids"] = np.stack([start, start + rng.integers(0, 8, size=batch_size)], 1).astype(np.int32)
    return batch
