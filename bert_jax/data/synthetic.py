"""Synthetic pretraining data: endless random batches shaped like the TFRecord ones (bert_jax.data.input_pipeline),
for smoke runs, benchmarks and tests. numpy only: a run on synthetic data never imports TensorFlow (seconds of start-up,
and absent from many GPU images)."""

import json

import numpy as np

from bert_jax import fileio
from bert_jax.data.tokenization import CLS_ID, MASK_ID, PAD_ID, SEP_ID


def synthetic_batch(rng: np.random.Generator, *, batch_size: int, max_seq_length: int,
                    max_predictions_per_seq: int, vocab_size: int) -> dict[str, np.ndarray]:
    """One random batch shaped like the TFRecord ones, drawn from `rng`.

    It follows the rules real BERT data obeys (trailing padding, two segments, distinct masked positions inside
    the real tokens), so a model or loss bug shows up here as it would on real data.
    """
    use_specials = vocab_size > MASK_ID
    # Ordinary tokens avoid [PAD] always, and the special ids too when the vocab is big enough to hold them.
    first_token = MASK_ID + 1 if vocab_size > MASK_ID + 1 else 1
    positions_in_row = np.arange(max_seq_length)[None, :]
    prediction_slots = np.arange(max_predictions_per_seq)[None, :]
    rows = np.arange(batch_size)[:, None]

    lengths = rng.integers(max(4, max_seq_length // 2), max_seq_length + 1, size=batch_size)
    # Last token of segment A: segment A and B are both non-empty.
    split = rng.integers(2, lengths - 1)
    real = positions_in_row < lengths[:, None]
    is_split = positions_in_row == split[:, None]
    is_last = positions_in_row == (lengths - 1)[:, None]

    # Zipf-distributed tokens, like words in text: a model can learn their frequencies, so the loss of a
    # smoke run falls, while every id of the vocab still occurs.
    zipf = rng.zipf(1.5, size=(batch_size, max_seq_length)) - 1
    input_ids = first_token + zipf % (vocab_size - first_token)
    maskable = real & (positions_in_row > 0)
    if use_specials:
        input_ids[:, 0] = CLS_ID
        input_ids[is_split | is_last] = SEP_ID
        maskable &= ~(is_split | is_last)
    input_ids = np.where(real, input_ids, PAD_ID)
    segment_ids = (real & (positions_in_row > split[:, None])).astype(np.int32)

    # About 15% of the tokens are predicted, as in BERT, but never more than the slots or the candidates.
    num_predictions = np.minimum.reduce([
        np.full(batch_size, max_predictions_per_seq),
        np.maximum(1, np.round(0.15 * lengths).astype(np.int64)),
        maskable.sum(axis=1),
    ])
    # Sorting random keys picks distinct candidates; non-candidates get keys past every candidate's.
    keys = np.where(maskable, rng.random((batch_size, max_seq_length)), 2.0)
    chosen = np.argsort(keys, axis=1)[:, :max_predictions_per_seq]
    is_prediction = prediction_slots < num_predictions[:, None]
    # Ascending positions with the padding slots last, the order create_pretraining_data.py writes.
    masked_lm_positions = np.sort(np.where(is_prediction, chosen, max_seq_length), axis=1)
    masked_lm_positions = np.where(is_prediction, masked_lm_positions, 0)
    masked_lm_ids = np.where(is_prediction, input_ids[rows, masked_lm_positions], 0)

    if use_specials:
        replacement = np.full((batch_size, max_predictions_per_seq), MASK_ID)
    else:
        replacement = rng.integers(first_token, vocab_size, size=(batch_size, max_predictions_per_seq))
    row_index = np.broadcast_to(rows, is_prediction.shape)
    input_ids[row_index[is_prediction], masked_lm_positions[is_prediction]] = replacement[is_prediction]

    return {
        "input_ids": input_ids.astype(np.int32),
        "input_mask": real.astype(np.int32),
        "segment_ids": segment_ids,
        "masked_lm_positions": masked_lm_positions.astype(np.int32),
        "masked_lm_ids": masked_lm_ids.astype(np.int32),
        "masked_lm_weights": is_prediction.astype(np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=batch_size).astype(np.int32),
    }


class SyntheticBatches:
    """Endless synthetic batches with a checkpointable position, for smoke runs, benchmarks and tests.

    Batch number n is this process's rows of one global batch drawn from `default_rng((seed, n))`, so resuming at
    batch n needs nothing but n, and the global batch is the same for any number of processes. `rows` (default:
    the process's contiguous block) are the global rows this process feeds, as sharding.process_rows gives them:
    then every row also lands on the same device as in a one-process run, and so gets the same dropout mask.
    """

    def __init__(self, *, batch_size: int, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int,
                 seed: int, process_index: int = 0, process_count: int = 1, rows=None):
        if max_seq_length < 4:
            raise ValueError(f"synthetic data needs max_seq_length >= 4, got {max_seq_length}")
        if not 1 <= max_predictions_per_seq <= max_seq_length:
            raise ValueError(f"synthetic data needs 1 <= max_predictions_per_seq <= max_seq_length, "
                             f"got {max_predictions_per_seq} and {max_seq_length}")
        if vocab_size < 2:
            raise ValueError(f"synthetic data needs vocab_size >= 2, got {vocab_size}")
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} is outside [0, process_count={process_count})")
        self._shape = dict(batch_size=batch_size * process_count, max_seq_length=max_seq_length,
                           max_predictions_per_seq=max_predictions_per_seq, vocab_size=vocab_size)
        self._rows = slice(process_index * batch_size, (process_index + 1) * batch_size) if rows is None else rows
        if rows is not None and len(rows) != batch_size:
            raise ValueError(f"rows holds {len(rows)} row indices for a per-process batch of {batch_size}")
        self._seed = seed
        self.position = 0  # number of batches handed out

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = synthetic_batch(np.random.default_rng((self._seed, self.position)), **self._shape)
        self.position += 1
        return {name: value[self._rows] for name, value in batch.items()}

    def save_state(self, path: str) -> None:
        write_position(path, self.position)

    def restore_state(self, path: str) -> None:
        self.position = read_position(path)


def write_position(path: str, position: int) -> None:
    """An iterator's batch count beside its checkpoint `path` (local or remote)."""
    with fileio.open_file(path + ".json", "w") as file:
        file.write(json.dumps({"position": position}))


def read_position(path: str) -> int:
    with fileio.open_file(path + ".json") as file:
        return int(json.load(file)["position"])


def synthetic_batches(*, batch_size: int, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int,
                      seed: int, process_index: int = 0, process_count: int = 1, rows=None) -> SyntheticBatches:
    """Endless random batches shaped like the TFRecord ones (see SyntheticBatches)."""
    return SyntheticBatches(batch_size=batch_size, max_seq_length=max_seq_length,
                            max_predictions_per_seq=max_predictions_per_seq, vocab_size=vocab_size, seed=seed,
                            process_index=process_index, process_count=process_count, rows=rows)


def make_iterator(data_config, *, split: str, batch_size: int, vocab_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1, whole_word_continuation=None, tokenizer_vocab_size: int | None = None,
                  process_rows=None) -> SyntheticBatches:
    """sources.make_iterator for data.source='synthetic', with input_pipeline.make_iterator's arguments: endless for
    both splits. The tokenizer's arguments are ignored: synthetic ids are drawn below `vocab_size`."""
    del whole_word_continuation, tokenizer_vocab_size
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    # A different seed keeps evaluation batches distinct from training ones.
    return synthetic_batches(batch_size=batch_size, max_seq_length=data_config.max_seq_length,
                             max_predictions_per_seq=data_config.max_predictions_per_seq, vocab_size=vocab_size,
                             seed=seed if split == "train" else seed + 1, process_index=process_index,
                             process_count=process_count, rows=process_rows)
