"""Dynamic masking for BERT pretraining, in vectorised TensorFlow ops over whole batches.

The rule is the original create_pretraining_data.py's (15% of the tokens, 80% [MASK] / 10% random / 10% kept,
never [CLS], [SEP] or padding, optionally whole words), applied in tf.data with stateless randomness so that every
read of a record gets fresh masks and a run is reproducible from its seed.
"""

import numpy as np
import tensorflow as tf

from bert_jax.data.tokenization import CLS_ID, MASK_ID, PAD_ID, SEP_ID  # noqa: F401  (re-exported)


def restore_original_tokens(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """A statically masked batch with masked_lm_ids written back at masked_lm_positions, and its masked_lm_* fields
    dropped: the unmasked sequences, ready to be masked afresh."""
    batch = dict(batch)
    positions = batch.pop("masked_lm_positions")
    labels = batch.pop("masked_lm_ids")
    real = batch.pop("masked_lm_weights") > 0
    input_ids = batch["input_ids"]
    # Adding differences rather than writing values: padding slots all point at position 0, and a zero added
    # there any number of times leaves [CLS] as it is.
    delta = tf.where(real, labels - tf.gather(input_ids, positions, batch_dims=1), 0)
    rows = tf.broadcast_to(tf.range(tf.shape(positions)[0])[:, None], tf.shape(positions))
    batch["input_ids"] = tf.tensor_scatter_nd_add(input_ids, tf.stack([rows, positions], axis=-1), delta)
    return batch


def dynamic_mask(batch: dict[str, tf.Tensor], *, max_predictions_per_seq: int, masked_lm_prob: float = 0.15,
                 vocab_size: int, special_ids=(PAD_ID, CLS_ID, SEP_ID, MASK_ID), seed,
                 whole_word_continuation: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
    """Masks a batch of unmasked sequences [B, S] the way create_pretraining_data.py does, in vectorised TF ops.

    Per sequence: num_to_predict = min(max_predictions_per_seq, max(1, round(num_real_tokens * masked_lm_prob)))
    with round-half-to-even (Python 3's round) and [CLS]/[SEP] counted as real tokens, as the original counts
    len(tokens); num_to_predict distinct tokens, uniformly at random among the real ones other than [CLS], [SEP]
    and [PAD]; each chosen token becomes [MASK] with probability 0.8, else stays itself with probability 0.5, else
    becomes an id drawn uniformly from [0, vocab_size).

    `seed` is a stateless seed (shape [2] integers): the same seed gives the same masks, so the caller derives one
    per batch. `special_ids` is (pad, cls, sep, mask). With `whole_word_continuation` (bool [vocab_size], True for
    "##" pieces) whole words are masked: see `_choose_whole_words`.

    Returns the batch layout of the static records: input_ids (masked), input_mask, segment_ids int32 [B, S];
    masked_lm_positions (ascending, padded with 0), masked_lm_ids int32 [B, P]; masked_lm_weights float32 [B, P];
    next_sentence_labels int32 [B].
    """
    pad_id, cls_id, sep_id, mask_id = special_ids
    input_ids = tf.cast(batch["input_ids"], tf.int32)
    input_mask = tf.cast(batch["input_mask"], tf.int32)
    shape = tf.shape(input_ids)
    seq_length = shape[1]

    candidate = (input_mask > 0) & (input_ids != cls_id) & (input_ids != sep_id) & (input_ids != pad_id)
    num_real = tf.reduce_sum(input_mask, axis=1)
    # float64, so that x.5 cases round exactly as Python does with the same product.
    wanted = tf.cast(tf.round(tf.cast(num_real, tf.float64) * masked_lm_prob), tf.int32)
    num_to_predict = tf.minimum(max_predictions_per_seq, tf.maximum(1, wanted))

    key_seed, decision_seed, replacement_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    # Sort keys for a random order; two of 128 tokens tie with probability ~4e-6, which only nudges the order.
    keys = tf.random.stateless_uniform(shape, key_seed, minval=0, maxval=tf.int32.max, dtype=tf.int32)
    # Slots beyond the row length can only ever be padding.
    width = min(max_predictions_per_seq, input_ids.shape[1]) if input_ids.shape[1] else max_predictions_per_seq
    if whole_word_continuation is None:
        positions = _choose_tokens(candidate, keys, num_to_predict, width)
    else:
        positions = _choose_whole_words(candidate, input_ids, keys, num_to_predict, width,
                                        tf.convert_to_tensor(whole_word_continuation, tf.bool))
    # Ascending, padding (seq_length) last; a sort of [B, P], not of [B, S].
    positions = tf.sort(positions, axis=1)
    if width < max_predictions_per_seq:
        positions = tf.pad(positions, [[0, 0], [0, max_predictions_per_seq - width]], constant_values=seq_length)
    is_prediction = positions < seq_length
    masked_lm_positions = tf.where(is_prediction, positions, 0)
    masked_lm_ids = tf.where(is_prediction, tf.gather(input_ids, masked_lm_positions, batch_dims=1), 0)

    input_ids = _replace_predictions(input_ids, masked_lm_positions, masked_lm_ids, is_prediction, decision_seed,
                                     replacement_seed, vocab_size=vocab_size, mask_id=mask_id)

    next_sentence_labels = tf.cast(batch["next_sentence_labels"], tf.int32)
    if next_sentence_labels.shape.rank == 2:  # straight from the [1]-long record feature
        next_sentence_labels = tf.squeeze(next_sentence_labels, axis=-1)
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": tf.cast(batch["segment_ids"], tf.int32),
        "masked_lm_positions": masked_lm_positions,
        "masked_lm_ids": masked_lm_ids,
        "masked_lm_weights": tf.cast(is_prediction, tf.float32),
        "next_sentence_labels": next_sentence_labels,
    }


def _replace_predictions(input_ids, masked_lm_positions, masked_lm_ids, is_prediction, decision_seed,
                         replacement_seed, *, vocab_size, mask_id):
    """input_ids [B, S] with each prediction replaced: by [MASK] (80%), itself (10%) or a random id (10%)."""
    # Decided per prediction slot, not per token: P random draws per row instead of S.
    slots = tf.shape(masked_lm_positions)
    decisions = tf.random.stateless_uniform(tf.concat([[2], slots], axis=0), decision_seed)
    random_ids = tf.random.stateless_uniform(slots, replacement_seed, minval=0, maxval=vocab_size, dtype=tf.int32)
    replacement = tf.where(decisions[0] < 0.8, mask_id, tf.where(decisions[1] < 0.5, masked_lm_ids, random_ids))
    # Added as differences, so that padding slots (position 0, difference 0) leave [CLS] alone.
    rows = tf.broadcast_to(tf.range(tf.shape(input_ids)[0])[:, None], slots)
    return tf.tensor_scatter_nd_add(input_ids, tf.stack([rows, masked_lm_positions], axis=-1),
                                    tf.where(is_prediction, replacement - masked_lm_ids, 0))


def _choose_tokens(candidate, keys, num_to_predict, width):
    """Positions [B, width] of the num_to_predict candidates with the largest random keys, seq_length in the
    unused slots: a uniform random subset, from a top-k of width rather than a sort of the whole row."""
    top_keys, top_positions = tf.math.top_k(tf.where(candidate, keys, -1), k=width)
    chosen = (tf.range(width)[None, :] < num_to_predict[:, None]) & (top_keys >= 0)
    return tf.where(chosen, top_positions, tf.shape(keys)[1])


def _choose_whole_words(candidate, input_ids, keys, num_to_predict, width, continuation_table):
    """Positions [B, width] of whole words chosen by the original's greedy rule, seq_length in the unused slots.

    A word is a candidate token that is not a continuation ("##") piece, with the continuation pieces right after
    it. Unlike the original, a "##" piece right after [CLS] or [SEP] starts a word of its own instead of joining
    the word before the separator. Words are visited in random order and a word is taken when it fits in what is
    left of num_to_predict, else skipped (the original's `continue`), so the result is exactly the original's for
    the same visiting order.
    """
    batch_size, seq_length = tf.shape(candidate)[0], tf.shape(candidate)[1]
    vocab_size = tf.shape(continuation_table)[0]
    # Out-of-vocabulary ids are check_batch's to report; clipping only keeps the lookup from failing first.
    is_continuation = tf.gather(continuation_table, tf.clip_by_value(input_ids, 0, vocab_size - 1))
    follows_candidate = tf.pad(candidate[:, :-1], [[0, 0], [1, 0]])
    is_start = candidate & ~(is_continuation & follows_candidate)
    word_index = tf.cumsum(tf.cast(is_start, tf.int32), axis=1) - 1  # of every candidate token's word
    flat_word = tf.where(candidate, tf.range(batch_size)[:, None] * seq_length + word_index, batch_size * seq_length)
    flat_word = tf.reshape(flat_word, [-1])
    word_length = tf.math.unsorted_segment_sum(tf.ones_like(flat_word), flat_word, batch_size * seq_length + 1)
    word_length = tf.reshape(word_length[:-1], [batch_size, seq_length])
    length_at_start = tf.where(is_start, tf.gather(word_length, tf.maximum(word_index, 0), batch_dims=1), 0)
    start_keys = tf.where(is_start, keys, -1)

    def visit(num_visited):
        """Scans the first num_visited words of the visiting order; returns positions and the budget left."""
        visited_keys, starts = tf.math.top_k(start_keys, k=num_visited)
        lengths = tf.where(visited_keys >= 0, tf.gather(length_at_start, starts, batch_dims=1), 0)
        taken, budget_left = _greedy_scan(lengths, num_to_predict)
        # Slot j of the output holds token j of the taken words, laid end to end in visiting order.
        taken_lengths = tf.where(taken, lengths, 0)
        ends = tf.cumsum(taken_lengths, axis=1)
        slot = tf.broadcast_to(tf.range(width)[None, :], [batch_size, width])
        word = tf.minimum(tf.searchsorted(ends, slot, side="right"), num_visited - 1)
        offset = slot - tf.gather(ends - taken_lengths, word, batch_dims=1)
        positions = tf.where(slot < ends[:, -1:], tf.gather(starts, word, batch_dims=1) + offset, seq_length)
        return positions, budget_left

    # A row takes at most `width` tokens, nearly always from the first few dozen words it visits: scan those,
    # and the whole row (a full sort of it) only in the rare batch where a row still has room and unseen words.
    static_length = candidate.shape[1]
    if static_length is None or static_length <= 2 * width:
        return visit(seq_length)[0]
    positions, budget_left = visit(2 * width)
    unseen_words = tf.reduce_sum(tf.cast(is_start, tf.int32), axis=1) > 2 * width
    return tf.cond(tf.reduce_any(unseen_words & (budget_left > 0)), lambda: visit(static_length)[0],
                   lambda: positions)


def _greedy_scan(lengths, budget):
    """Which words, in visiting order ([B, W] lengths, 0 for none), the original takes from `budget` tokens.

    The original's loop takes a word if it fits in what is left, else skips it and goes on. Vectorised, that runs
    in passes: a pass takes the run of fitting words up to the first that does not fit (a cumulative sum of
    lengths), which is what the loop does up to there; the next pass goes on after that word with the words that
    still fit. The word that stops a pass is longer than any the next pass considers, so there are at most
    (longest word + 1) passes, usually two or three.
    """
    num_words = tf.shape(lengths)[1]
    rank = tf.range(num_words)[None, :]

    def one_pass(taken, budget, start):
        considered = (rank >= start[:, None]) & (lengths > 0) & (lengths <= budget[:, None])
        total = tf.cumsum(tf.where(considered, lengths, 0), axis=1)
        take = considered & (total <= budget[:, None])
        stop = tf.reduce_min(tf.where(considered & (total > budget[:, None]), rank, num_words), axis=1)
        budget -= tf.reduce_sum(tf.where(take, lengths, 0), axis=1)
        return taken | take, budget, stop + 1

    taken, budget, _ = tf.while_loop(lambda taken, budget, start: tf.reduce_any(start <= num_words), one_pass,
                                     (tf.zeros_like(lengths, tf.bool), budget, tf.zeros_like(budget)),
                                     maximum_iterations=num_words + 1)
    return taken, budget
def check_masking_args(masked_lm_prob, vocab_size, special_ids, whole_word_continuation) -> None:
    if not 0 < masked_lm_prob <= 1:
        raise ValueError(f"--config.data.masked_lm_prob={masked_lm_prob} must lie in (0, 1]; BERT uses 0.15")
    if len(special_ids) != 4:
        raise ValueError(f"--config.data.special_ids={tuple(special_ids)} must be the four ids (pad, cls, sep, mask), "
                         "e.g. (0, 101, 102, 103) for the original BERT WordPiece vocabularies")
    if vocab_size is None:
        raise ValueError("dynamic masking draws random replacement tokens from [0, vocab_size): pass vocab_size")
    if not all(0 <= token < vocab_size for token in special_ids):
        raise ValueError(f"--config.data.special_ids={tuple(special_ids)} must lie in [0, vocab_size={vocab_size}); "
                         "set them to the [PAD], [CLS], [SEP] and [MASK] ids of the vocabulary the data was made with")
    if whole_word_continuation is not None and np.shape(whole_word_continuation) != (vocab_size,):
        raise ValueError(f"whole_word_continuation has shape {np.shape(whole_word_continuation)}, expected "
                         f"({vocab_size},): one bool per vocabulary id, True for '##' continuation pieces")
