"""The GPU check: one command that measures bert_jax's training steps against HuggingFace transformers on one GPU.

    python -m bert_jax.benchmarks.gpu --out_dir=gpu_check

It needs jax with CUDA, flax, optax, orbax-checkpoint, absl-py, ml_collections, numpy, and for the comparison torch
and transformers: no TensorFlow, no tf.data, no datasets (batches are synthetic, made in numpy). In at most
--budget_s seconds (default 420) it measures, in bfloat16 (--dtype; float32 on a CPU):
- pretraining: for each of --shapes (BERT-base at seq 128, BERT-large at seq 512), the largest batch of
  --batch_sizes whose step fits the device's memory, and at that batch the step with each of --attention (cuDNN flash
  attention, XLA's dot_product_attention, the reference einsums): step time, sequences/s, tokens/s, MFU against the
  device's nominal bf16 peak and against a measured matmul ceiling, XLA's memory for the step. The fused kernels
  have no attention dropout, so their rows train with attention_dropout_rate 0; the reference rows keep BERT's 0.1;
- packing at --pack_shape: the same step on rows of whole instances (lengths uniform in [16, seq], so unpadded rows
  are about half padding, as the demo corpus's at 512) unpacked and packed up to --pack_instances per row: the
  instances and the real (non-padding) tokens each step trains per second;
- fine-tuning at --finetune_shape (BERT-base at seq 384): the sequence, tokens and qa tasks' train steps;
- transformers: BertForPreTraining (stock: MLM logits at every position; gathered: at the masked ones, as ours) and
  the fine-tuning models on the same device, same shapes and batches, bf16 autocast, dropout on, SDPA attention;
  the table's "x torch" is torch's step time over ours (above 1: ours is faster).
The JAX side and the torch side run in child processes one after the other: each gets the whole device memory (JAX's
allocator keeps what it took until its process ends), and a failure in one leaves the other's rows. Rows that do not
fit the budget are listed as skipped. It prints one table and writes gpu_check.json and gpu_check.md to --out_dir.
On a CPU the same command runs at small shapes (the tests do: tiny presets, no cuDNN).
"""

import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import presets
from bert_jax import runtime
from bert_jax.benchmarks import step as step_lib
from bert_jax.benchmarks import torch_reference

FLAGS = flags.FLAGS
COLUMNS = ("section", "model", "seq", "batch", "attention", "compile s", "step s", "seq/s", "real tok/s", "MFU peak",
           "MFU ceil", "XLA GiB", "torch s", "torch gath s", "torch GiB", "x torch", "note")
# Printed beside the result; from NVIDIA's published MLPerf Training BERT-large results on H100.
ANCHORS = ("anchor: NVIDIA MLPerf Training BERT-large (seq 512, packed) on H100: about 970 sequences/s per GPU",)
TASK_LABELS = {"sequence": 2, "tokens": 9, "qa": 2}  # classes of the synthetic fine-tuning batches (tokens: CoNLL's 9)
PACK_MIN_LENGTH = 16
TORCH_SECONDS, GRACE_SECONDS = 90, 45  # the torch side's share of --budget_s; the JAX side's last row's grace


def _define_flags():
    """Defined only when the program runs, so importing this module (the tests do) defines none."""
    flags.DEFINE_list("shapes", ["base:128", "large:512"], "Pretraining shapes, PRESET:SEQ_LENGTH.")
    flags.DEFINE_list("batch_sizes", ["256", "128", "64", "32"], "Candidate global batch sizes; the largest whose "
                      "step fits the device's memory is measured.")
    flags.DEFINE_list("attention", ["cudnn", "xla", "reference"], "model.attention values to measure at each shape.")
    flags.DEFINE_string("pack_shape", "large:512", "PRESET:SEQ_LENGTH of the packing comparison ('' to skip).")
    flags.DEFINE_integer("pack_instances", 8, "data.max_instances_per_row of the packed rows.")
    flags.DEFINE_string("finetune_shape", "base:384", "PRESET:SEQ_LENGTH of the fine-tuning steps ('' to skip).")
    flags.DEFINE_list("finetune_tasks", ["sequence", "tokens", "qa"], "Fine-tuning tasks to measure.")
    flags.DEFINE_integer("finetune_batch", 32, "Fine-tuning batch size.")
    flags.DEFINE_string("finetune_attention", "auto", "model.attention of the fine-tuning steps (auto: what a "
                        "fine-tuning run takes; with BERT's attention dropout that is the reference path).")
    flags.DEFINE_enum("dtype", "auto", ["auto", "bfloat16", "float32"], "Compute dtype of both sides (transformers: "
                      "autocast); parameters and optimizer state stay float32. auto: bfloat16 on an accelerator, "
                      "float32 on a CPU (where torch's bfloat16 autocast is slow).")
    step_lib.define_dropout_rng_flag("auto")
    flags.DEFINE_integer("steps", 10, "Timed steps per row; the median is reported.")
    flags.DEFINE_integer("warmup", 2, "Untimed steps after the first.")
    flags.DEFINE_integer("matmul_size", 0, "Square matmul (in --dtype) of the measured ceiling; 0: 8192 (CPU: "
                         "1024).")
    flags.DEFINE_float("memory_limit_gib", 0.0, "Memory a step may take; 0: the device allocator's limit.")
    flags.DEFINE_enum("torch", "auto", ["auto", "on", "off"], "The transformers side (auto: where torch and "
                      "transformers are installed).")
    flags.DEFINE_integer("budget_s", 420, "Seconds for the whole check; rows that would start later are skipped.")
    flags.DEFINE_string("out_dir", "gpu_check", "Where gpu_check.json and gpu_check.md are written.")
    flags.DEFINE_enum("side", "", ["", "jax", "torch"], "Internal: run one side on --spec and write --result.")
    flags.DEFINE_string("spec", "", "Internal: the side's JSON spec.")
    flags.DEFINE_string("result", "", "Internal: where the side writes its JSON.")


def parse_shape(text: str, flag: str) -> tuple[str, int]:
    """'base:128' -> ("base", 128); a ValueError naming the flag otherwise."""
    preset, _, seq = text.partition(":")
    if preset not in presets.MODEL_PRESETS or not seq.isdigit() or int(seq) < 8:
        raise ValueError(f"--{flag}={text!r}: expected PRESET:SEQ_LENGTH with PRESET one of "
                         f"{list(presets.MODEL_PRESETS)} and SEQ_LENGTH >= 8, e.g. base:128")
    return preset, int(seq)


# ---------------------------------------------------------------------------------------------------------------
# Synthetic batches, made alike in both sides' processes from the same seeds.

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
        count = min(step_lib.default_max_predictions(length), num_predictions)
        ids, positions = _instance(rng, int(length), count, vocab_size)
        batch["masked_lm_ids"][row, :count] = ids[positions]
        ids[positions] = step_lib.MASK_ID
        batch["input_ids"][row, :length] = ids
        batch["input_mask"][row, :length] = 1
        batch["segment_ids"][row, length // 2:length] = 1
        batch["masked_lm_positions"][row, :count] = positions
        batch["masked_lm_weights"][row, :count] = 1.0
    return batch


def packed_predictions(seq_length: int, max_instances: int) -> int:
    """MLM slots of a packed row: 15% of its tokens plus the rounding up of each instance's 15%, so a row's slots
    never run out before its tokens do."""
    return step_lib.default_max_predictions(seq_length) + (max_instances + 1) // 2


def packed_batch(lengths: np.ndarray, rows: int, seq_length: int, max_instances: int, vocab_size: int,
                 seed: int) -> tuple[dict[str, np.ndarray], int]:
    """`rows` rows packed first-fit with the instances of `lengths` in their order (each goes into the first row
    with room for its tokens, its predictions and one more instance; one that fits no row is left for a later batch,
    as the input pipeline's packer would), in bert_jax.data.packing's layout, with packed_predictions slots per row
    and the masking of `unpacked_batch`.

    Returns (batch, the number of instances it holds). The instances one batch takes favour the short ones, so the
    comparison counts instances as a steady stream would train them: real tokens over the mean length."""
    rng = np.random.default_rng(seed)
    num_predictions = packed_predictions(seq_length, max_instances)
    batch = {name: np.zeros((rows, seq_length), np.int32)
             for name in ("input_ids", "input_mask", "segment_ids", "position_ids", "instance_ids")}
    batch.update({name: np.zeros((rows, num_predictions), np.int32) for name in ("masked_lm_positions",
                                                                                  "masked_lm_ids")})
    batch["masked_lm_weights"] = np.zeros((rows, num_predictions), np.float32)
    batch.update({name: np.zeros((rows, max_instances), np.int32) for name in ("nsp_positions",
                                                                               "next_sentence_labels")})
    batch["nsp_weights"] = np.zeros((rows, max_instances), np.float32)
    slots, offsets, used = (np.zeros(rows, np.int64) for _ in range(3))
    placed = 0
    for length in (int(length) for length in lengths):
        count = step_lib.default_max_predictions(length)
        room = (slots < max_instances) & (offsets + length <= seq_length) & (used + count <= num_predictions)
        if not room.any():
            continue
        row = int(np.argmax(room))
        slot, offset, first = int(slots[row]), int(offsets[row]), int(used[row])
        ids, positions = _instance(rng, length, count, vocab_size)
        predictions = slice(first, first + count)
        batch["masked_lm_ids"][row, predictions] = ids[positions]
        ids[positions] = step_lib.MASK_ID
        tokens = slice(offset, offset + length)
        batch["input_ids"][row, tokens] = ids
        batch["input_mask"][row, tokens] = 1
        batch["segment_ids"][row, offset + length // 2:offset + length] = 1
        batch["position_ids"][row, tokens] = np.arange(length)
        batch["instance_ids"][row, tokens] = slot + 1
        batch["masked_lm_positions"][row, predictions] = positions + offset
        batch["masked_lm_weights"][row, predictions] = 1.0
        batch["nsp_positions"][row, slot] = offset
        batch["next_sentence_labels"][row, slot] = rng.integers(0, 2)
        batch["nsp_weights"][row, slot] = 1.0
        slots[row], offsets[row], used[row] = slot + 1, offset + length, first + count
        placed += 1
    return batch, placed


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


def pretraining_config(preset: str, seq_length: int, attention: str, dtype: str, predictions: int = 1,
                       batch_size: int = 1):
    """The config of a row: bert_jax.benchmarks.step's, for as many steps as the schedule needs never to matter."""
    return step_lib.preset_config(preset, seq_length, predictions, dtype, batch_size, 1000, attention)


def model_config(preset: str, seq_length: int, attention: str = "auto", dtype: str = "bfloat16"
                 ) -> model_lib.BertConfig:
    """The BertConfig of a row (see `pretraining_config`)."""
    return model_lib.BertConfig.from_config(pretraining_config(preset, seq_length, attention, dtype).model)


# ---------------------------------------------------------------------------------------------------------------
# The JAX side.

def _is_out_of_memory(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _short(error: Exception) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{type(error).__name__}: {first[:200]}"


def _attention_taken(requested: str, config: model_lib.BertConfig, batch_size: int, seq_length: int,
                     packed: bool) -> str:
    """What `requested` resolves to in a training step of these shapes (bert_jax.attention's own choice, which reads
    only shapes and dtypes: nothing is allocated)."""
    import jax  # pylint: disable=import-outside-toplevel
    from bert_jax import attention as attention_lib  # pylint: disable=import-outside-toplevel

    head_dim = config.hidden_size // config.num_heads
    query = jax.ShapeDtypeStruct((batch_size, seq_length, config.num_heads, head_dim), config.dtype)
    ids = jax.ShapeDtypeStruct((batch_size, seq_length), "int32")
    mask = attention_lib.SegmentMask(ids) if packed else ids
    return attention_lib.attention_implementation(requested, query, query, mask, True, config.attention_dropout_rate)


class _JaxSide:
    """Measures the rows of one spec in this process, appending each result (or why it has none) to `rows`."""

    def __init__(self, spec: dict, devices, deadline: float, matmul_size: int, on_row=None):
        """`spec`'s dtype resolved (not auto)."""
        self.spec, self.devices, self.deadline, self.matmul_size, self.on_row = (spec, devices, deadline, matmul_size,
                                                                                 on_row)
        self.device = devices[0]
        self.started = time.monotonic()
        self.ceilings = (0.0, 0.0)
        stats = self.device.memory_stats() or {}
        limit = spec["memory_limit_gib"] * 2**30 or stats.get("bytes_limit", 0)
        self.memory_limit = int(limit)
        self.rows: list[dict] = []
        self._measured = None  # (batch, argument bytes, total bytes) of the last step that did not fit

    def _learn_memory(self, batch_size: int, result: dict) -> None:
        """Keeps a step's memory that did not fit, for `_estimated_bytes` (the fixed part: its arguments)."""
        if result.get("xla_bytes") and result.get("argument_bytes") is not None:
            self._measured = (batch_size, result["argument_bytes"], result["xla_bytes"])

    def _estimated_bytes(self, batch_size: int) -> float:
        """The memory of the shape's step at `batch_size`, from the last one that did not fit: its arguments (the
        state, mostly) plus the rest in proportion to the batch; 0 with nothing measured."""
        if self._measured is None:
            return 0.0
        measured_batch, fixed, total = self._measured
        return fixed + (total - fixed) * batch_size / measured_batch

    def _out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def _timed_step(self, setup, step, batch: dict, extra_batches: dict | None = None) -> dict:
        """Compiles `step` (jitted over `setup`'s state) for `batch`, times it, and times `extra_batches` (same
        shapes) with the same executable."""
        import jax  # pylint: disable=import-outside-toplevel
        from bert_jax import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
        from bert_jax import train  # pylint: disable=import-outside-toplevel

        steps, warmup = self.spec["steps"], self.spec["warmup"]
        with jax.set_mesh(setup.mesh):
            state = setup.create_state(jax.random.key(0))
            device_batch = sharding_lib.make_global_batch(batch, setup.batch_sharding)
            rng = train.dropout_key(1, self.spec["dropout_rng"], self.device.platform)
            start = time.perf_counter()
            compiled = step.lower(state, device_batch, rng).compile()
            compile_s = time.perf_counter() - start
            memory = step_lib.xla_bytes(compiled)
            analysis = compiled.memory_analysis()  # XLA keeps it: asked again, not recomputed
            result = {"compile_s": compile_s, "xla_bytes": memory,
                      "argument_bytes": analysis.argument_size_in_bytes if analysis is not None else None}
            if self.memory_limit and memory > self.memory_limit:
                result["error"] = (f"does not fit: XLA needs {memory / 2**30:.3g} GiB, the device allows "
                                   f"{self.memory_limit / 2**30:.3g}")
                result["out_of_memory"] = True
                return result
            state, times, first, last = step_lib.time_steps(compiled, state, device_batch, rng, steps, warmup)
            result.update(step_times=times, step_s=float(np.median(times)), loss=first, last_loss=last)
            for name, extra in (extra_batches or {}).items():
                placed = sharding_lib.make_global_batch(extra, setup.batch_sharding)
                state, times, _, _ = step_lib.time_steps(compiled, state, placed, rng, steps, warmup)
                result[f"{name}_step_s"] = float(np.median(times))
            stats = self.device.memory_stats() or {}
            result["allocator_peak_bytes"] = stats.get("peak_bytes_in_use")
        del state, compiled
        gc.collect()
        return result

    def _pretraining_step(self, preset: str, seq_length: int, batch_size: int, attention: str, predictions: int,
                          batch: dict, extra_batches: dict | None = None) -> dict:
        """`_timed_step` of the pretraining step of a row."""
        from bert_jax import train  # pylint: disable=import-outside-toplevel

        config = pretraining_config(preset, seq_length, attention, self.spec["dtype"], predictions, batch_size)
        setup = train.pretraining_setup(config, self.devices)
        return self._timed_step(setup, setup.pretraining_step(), batch, extra_batches)

    def _row(self, section: str, preset: str, seq_length: int, batch_size: int, attention: str, **fields) -> dict:
        row = {"section": section, "preset": preset, "seq_length": seq_length, "batch_size": batch_size,
               "attention": attention, **fields}
        self.rows.append(row)
        # A line as each row ends, and the result so far on disk: a side stopped at its limit keeps its rows.
        figures = (f"compile {row['compile_s']:.1f} s, step {row['step_s']:.4f} s" if row.get("step_s") is not None
                   else row.get("skipped") or row.get("error") or "no result")
        print(f"[{time.monotonic() - self.started:.0f} s] {section} {preset} seq {seq_length} batch {batch_size} "
              f"{attention}{' packed' if fields.get('packed') else ''}: {figures}", flush=True)
        if self.on_row is not None:
            self.on_row(self)
        return row

    def pretraining(self, preset: str, seq_length: int, attentions, pack: dict | None = None,
                    fitted: int | None = None) -> int | None:
        """The rows of one shape, one per attention; returns the batch measured (None if none fitted).

        Without `fitted`, the first attention that runs picks the batch: the largest candidate whose step XLA says
        fits the memory limit and that runs (a candidate that XLA's estimate at a larger one says cannot fit is not
        compiled); the others are measured at that batch. With `pack`, the row that picks the batch also times the
        packing comparison's unpacked batch on the same executable and fills `pack` in."""
        predictions = step_lib.default_max_predictions(seq_length)
        candidates = sorted({int(size) for size in self.spec["batch_sizes"]}, reverse=True)
        candidates = [size for size in candidates if size % len(self.devices) == 0]
        if not fitted:
            self._measured = None  # another shape's memory says nothing of this one's
        for attention in attentions:
            config = model_config(preset, seq_length, attention, self.spec["dtype"])
            vocab = config.vocab_size
            if self._out_of_time():
                self._row("pretrain", preset, seq_length, fitted, attention, skipped="time budget (--budget_s)")
                continue
            larger, result, batch_size, batch = [], None, None, None
            for batch_size in [fitted] if fitted else candidates:
                if not fitted and self._estimated_bytes(batch_size) > self.memory_limit > 0:
                    estimate = self._estimated_bytes(batch_size) / 2**30
                    larger.append(f"{batch_size}: not compiled, estimated {estimate:.0f} GiB")
                    continue
                batch = step_lib.synthetic_batch(batch_size, seq_length, predictions, vocab)
                extra = {}
                if pack is not None and not fitted:
                    extra["unpacked"] = unpacked_batch(pack_instance_lengths(batch_size, seq_length, 0), seq_length,
                                                       predictions, vocab, 1)
                try:
                    result = self._pretraining_step(preset, seq_length, batch_size, attention, predictions, batch,
                                                    extra)
                except Exception as error:  # pylint: disable=broad-except  # a row's failure is its result
                    result = {"error": _short(error), "out_of_memory": _is_out_of_memory(error)}
                if result.get("out_of_memory") and not fitted:
                    larger.append(f"{batch_size}: {result['error']}")
                    self._learn_memory(batch_size, result)
                    continue
                break
            if result is None or (result.get("out_of_memory") and not fitted):
                self._row("pretrain", preset, seq_length, None, attention,
                          error="no batch of --batch_sizes fits: " + "; ".join(larger))
                continue
            flops = metrics_lib.model_flops_per_sequence(config, seq_length, predictions) * batch_size
            row = self._row("pretrain", preset, seq_length, batch_size, attention, **result, flops_per_step=flops,
                            taken=_attention_taken(attention, config, batch_size, seq_length, False),
                            real_tokens=int(batch["input_mask"].sum()), sequences=batch_size, larger_batches=larger)
            if "step_s" in row and not fitted:
                fitted = batch_size
                if pack is not None:
                    pack.update(batch_size=batch_size, unpacked_step_s=row["unpacked_step_s"], attention=attention,
                                unpacked_compile_s=row["compile_s"], unpacked_xla_bytes=row["xla_bytes"])
        return fitted

    def packing(self, preset: str, seq_length: int, pack: dict) -> None:
        """Unpacked (timed with the shape's first pretraining row) against packed rows of the same instances."""
        predictions = step_lib.default_max_predictions(seq_length)
        attention = pack.get("attention", self.spec["attention"][0])
        batch_size = pack.get("batch_size")
        if batch_size is None:
            self._row("pack", preset, seq_length, None, attention, error="no pretraining row of this shape ran")
            return
        lengths = pack_instance_lengths(batch_size * self.spec["pack_instances"], seq_length, 0)
        unpacked_lengths = lengths[:batch_size]
        config = model_config(preset, seq_length, attention, self.spec["dtype"])
        unpacked_flops = metrics_lib.model_flops_per_sequence(config, seq_length, predictions) * batch_size
        self._row("pack", preset, seq_length, batch_size, attention, packed=False, step_s=pack["unpacked_step_s"],
                  compile_s=pack["unpacked_compile_s"], xla_bytes=pack["unpacked_xla_bytes"],
                  flops_per_step=unpacked_flops,
                  sequences=batch_size, real_tokens=int(unpacked_lengths.sum()),
                  taken=_attention_taken(attention, config, batch_size, seq_length, False))
        if self._out_of_time():
            self._row("pack", preset, seq_length, batch_size, attention, packed=True,
                      skipped="time budget (--budget_s)")
            return
        instances = self.spec["pack_instances"]
        batch, placed = packed_batch(lengths, batch_size, seq_length, instances, config.vocab_size, 1)
        slots = packed_predictions(seq_length, instances)
        try:
            result = self._pretraining_step(preset, seq_length, batch_size, attention, slots, batch)
        except Exception as error:  # pylint: disable=broad-except
            result = {"error": _short(error)}
        flops = metrics_lib.model_flops_per_sequence(config, seq_length, slots) * batch_size
        # Instances as a steady stream trains them (packed_batch): the batch's real tokens over the mean length.
        self._row("pack", preset, seq_length, batch_size, attention, packed=True, **result, flops_per_step=flops,
                  sequences=float(batch["input_mask"].sum()) / float(lengths.mean()), instances_in_batch=placed,
                  real_tokens=int(batch["input_mask"].sum()),
                  taken=_attention_taken(attention, config, batch_size, seq_length, True))

    def finetuning(self, preset: str, seq_length: int) -> None:
        from bert_jax import finetune as finetune_lib  # pylint: disable=import-outside-toplevel
        from bert_jax import optim  # pylint: disable=import-outside-toplevel
        from bert_jax import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
        from bert_jax import tasks  # pylint: disable=import-outside-toplevel
        from bert_jax import train  # pylint: disable=import-outside-toplevel

        batch_size, attention = self.spec["finetune_batch"], self.spec["finetune_attention"]
        for task in self.spec["finetune_tasks"]:
            if self._out_of_time():
                self._row(task, preset, seq_length, batch_size, attention, skipped="time budget (--budget_s)")
                continue
            base = pretraining_config(preset, seq_length, attention, self.spec["dtype"])
            config = model_lib.BertConfig.from_config(base.model)
            try:
                model = tasks.head_model(task, config, TASK_LABELS[task])
                tx, schedule = optim.create_optimizer(base.optim, base.train.num_steps)
                mesh = sharding_lib.create_mesh(base.mesh, self.devices)
                rules = sharding_lib.logical_rules(base.mesh)
                setup = train.Setup.build(model, tx, schedule, mesh, rules, train.init_inputs(seq_length))
                batch = finetune_batch(task, batch_size, seq_length, config.vocab_size, 2)
                result = self._timed_step(setup, setup.jit_train_step(finetune_lib.make_train_step(
                    model, tx, schedule, rules)), batch)
                result["real_tokens"] = int(batch["input_mask"].sum())
            except Exception as error:  # pylint: disable=broad-except
                result = {"error": _short(error)}
            flops = metrics_lib.model_flops_per_sequence(config, seq_length, 0) * batch_size
            self._row(task, preset, seq_length, batch_size, attention, **result, flops_per_step=flops,
                      sequences=batch_size, taken=_attention_taken(attention, config, batch_size, seq_length, False))


def _row_order(spec: dict, row: dict) -> tuple:
    """The table's order: pretraining by shape then attention as the flags list them, packing, fine-tuning."""
    if row["section"] != "pretrain":
        return (1 if row["section"] == "pack" else 2, 0, 0)
    shapes = [tuple(shape) for shape in spec["shapes"]]
    shape = (row["preset"], row["seq_length"])
    attention = spec["attention"].index(row["attention"]) if row["attention"] in spec["attention"] else 0
    return (0, shapes.index(shape) if shape in shapes else len(shapes), attention)


def run_jax_side(spec: dict, deadline: float, write=None) -> dict:
    """Every JAX row of `spec`, the device and the matmul ceilings; stops starting rows after `deadline`.
    write(result), if given, gets the result so far after every row."""
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    devices = jax.devices()
    cpu = devices[0].platform == "cpu"
    if spec["dtype"] == "auto":
        spec = dict(spec, dtype="float32" if cpu else "bfloat16")
    matmul_size = spec["matmul_size"] or (1024 if cpu else 8192)
    side = _JaxSide(spec, devices, deadline, matmul_size,
                    on_row=(lambda side: write(_jax_result(side))) if write else None)
    before = step_lib.matmul_ceiling(matmul_size, jnp.dtype(spec["dtype"]))
    side.ceilings = (before, before)
    # Every shape's first attention (which picks the batch), packing and fine-tuning come before the other
    # attentions, so a budget that runs out costs the least telling rows.
    first, others = spec["attention"][:1], spec["attention"][1:]
    pack = {} if spec["pack_shape"] else None
    fitted = {}
    for preset, seq_length in spec["shapes"]:
        shape_pack = pack if spec["pack_shape"] == (preset, seq_length) else None
        fitted[preset, seq_length] = side.pretraining(preset, seq_length, first, shape_pack)
    if pack is not None:
        if "batch_size" not in pack and spec["pack_shape"] not in fitted:  # not among --shapes: measured here
            side.pretraining(*spec["pack_shape"], first, pack)
        side.packing(*spec["pack_shape"], pack)
    if spec["finetune_shape"]:
        side.finetuning(*spec["finetune_shape"])
    for (preset, seq_length), batch_size in fitted.items():
        if batch_size:
            side.pretraining(preset, seq_length, others, fitted=batch_size)
    side.ceilings = (before, step_lib.matmul_ceiling(matmul_size, jnp.dtype(spec["dtype"])))
    return _jax_result(side)


def _jax_result(side: _JaxSide) -> dict:
    import flax  # pylint: disable=import-outside-toplevel
    import jax  # pylint: disable=import-outside-toplevel

    before, after = side.ceilings
    return {"rows": sorted(side.rows, key=functools.partial(_row_order, side.spec)),
            "device_kind": side.device.device_kind, "platform": side.device.platform,
            "num_devices": len(side.devices), "jax_version": jax.__version__, "flax_version": flax.__version__,
            "dtype": side.spec["dtype"],
            "peak_flops_per_s": metrics_lib.peak_flops_per_device(side.device) * len(side.devices),
            # Fake CPU devices share the host's cores: its ceiling is not multiplied (as bert_jax.benchmarks.step).
            "ceiling_flops_per_s": max(before, after) * (1 if side.device.platform == "cpu" else len(side.devices)),
            "ceiling_before_flops_per_s": before,
            "ceiling_after_flops_per_s": after, "matmul_size": side.matmul_size,
            "memory_limit_bytes": side.memory_limit}


# ---------------------------------------------------------------------------------------------------------------
# The torch side.

def torch_jobs(jax_result: dict) -> list[dict]:
    """What transformers runs: one pretraining step per shape the JAX side measured (at its batch), the packing
    shape's unpacked batch, and each fine-tuning task."""
    jobs, seen = [], set()
    for row in jax_result["rows"]:
        if row.get("step_s") is None:
            continue
        key = (row["section"], row["preset"], row["seq_length"], row["batch_size"])
        if row["section"] == "pack" or key in seen:
            continue
        seen.add(key)
        jobs.append({"task": "pretraining" if row["section"] == "pretrain" else row["section"],
                     "preset": row["preset"], "seq_length": row["seq_length"], "batch_size": row["batch_size"]})
    return jobs


def _torch_threads() -> int:
    """torch's CPU threads: OpenMP's setting where one is made (OMP_NUM_THREADS), else every core this process may
    use, as XLA:CPU's pool."""
    setting = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(setting) if setting.isdigit() and int(setting) > 0 else step_lib.schedulable_cores()


def run_torch_side(jobs: list[dict], steps: int, warmup: int, deadline: float, platform: str, dtype: str,
                   write=None) -> dict:
    """transformers' step for each job on `platform`'s torch device; write(result), if given, gets the result so
    far after every job."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel

    def side_result():
        return {"jobs": results, "torch_version": torch.__version__,
                "transformers_version": transformers.__version__,
                "cuda": torch.version.cuda if device == "cuda" else None}

    device = torch_reference.torch_device(platform)
    results = []
    for job in jobs:
        result = dict(job)
        results.append(result)
        if time.monotonic() > deadline:
            result["skipped"] = "time budget (--budget_s)"
            continue
        config = model_config(job["preset"], job["seq_length"], dtype=dtype)
        try:
            if job["task"] == "pretraining":
                batch = step_lib.synthetic_batch(job["batch_size"], job["seq_length"],
                                                 step_lib.default_max_predictions(job["seq_length"]),
                                                 config.vocab_size)
                for gathered in (False, True):
                    measured = torch_reference.benchmark_step(config, batch, steps, warmup, _torch_threads(),
                                                              gathered, device=device)
                    result["gathered_step_s" if gathered else "step_s"] = measured["step_s"]
                    result["gathered_peak_bytes" if gathered else "peak_bytes"] = measured["peak_bytes"]
                    result.update(loss=measured["loss"], attention=measured["attention"], device=measured["device"])
            else:
                batch = finetune_batch(job["task"], job["batch_size"], job["seq_length"], config.vocab_size, 2)
                measured = torch_reference.benchmark_step(config, batch, steps, warmup, _torch_threads(), False,
                                                          device=device, task=job["task"],
                                                          num_labels=TASK_LABELS[job["task"]])
                result.update(step_s=measured["step_s"], peak_bytes=measured["peak_bytes"], loss=measured["loss"],
                              attention=measured["attention"], device=measured["device"])
        except Exception as error:  # pylint: disable=broad-except  # e.g. torch.cuda.OutOfMemoryError
            result["error"] = _short(error)
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        print(f"torch {job['task']} {job['preset']} seq {job['seq_length']} batch {job['batch_size']}: "
              + (f"step {result['step_s']:.4f} s" if "step_s" in result else result.get("error", "")), flush=True)
        if write is not None:
            write(side_result())
    return side_result()


# ---------------------------------------------------------------------------------------------------------------
# The table.

def _torch_for(row: dict, torch_result: dict | None) -> dict | None:
    if not torch_result:
        return None
    task = "pretraining" if row["section"] in ("pretrain", "pack") else row["section"]
    for job in torch_result["jobs"]:
        if (job["task"], job["preset"], job["seq_length"], job["batch_size"]) == (
                task, row["preset"], row["seq_length"], row["batch_size"]):
            return job
    return None


def table_rows(result: dict) -> list[tuple]:
    """The table: one tuple of COLUMNS' values (strings) per JAX row, with its transformers figures beside it.

    Packing rows compare with transformers' unpacked step (the only layout it has) over the instances trained."""
    jax_result, torch_result = result["jax"], result.get("torch")
    peak, ceiling = jax_result["peak_flops_per_s"], jax_result["ceiling_flops_per_s"]
    rows = []
    for row in jax_result["rows"]:
        attention = row["attention"] if row.get("taken", row["attention"]) == row["attention"] else (
            f"{row['attention']}>{row['taken']}")
        section = row["section"] + ({True: " on", False: " off"}.get(row.get("packed"), ""))
        head = (section, row["preset"], str(row["seq_length"]), str(row["batch_size"] or "-"), attention)
        if row.get("step_s") is None:
            note = row.get("skipped") or row.get("error") or "no result"
            rows.append(head + ("-",) * (len(COLUMNS) - len(head) - 1) + (note,))
            continue
        step_s = row["step_s"]
        flops_per_s = row["flops_per_step"] / step_s
        torch_job = _torch_for(row, torch_result)
        torch_s = torch_job.get("step_s") if torch_job else None
        # Per instance trained: a packed step trains more instances than transformers' unpacked one of equal rows.
        ratio = (torch_s / row["batch_size"]) / (step_s / row["sequences"]) if torch_s else None
        notes = []
        if row.get("larger_batches"):
            notes.append("larger: " + "; ".join(row["larger_batches"]))
        if torch_job and torch_job.get("error"):
            notes.append("torch: " + torch_job["error"])
        elif torch_job and torch_job.get("skipped"):
            notes.append("torch skipped: " + torch_job["skipped"])
        gathered = torch_job.get("gathered_step_s") if torch_job else None
        torch_peak = torch_job.get("peak_bytes") if torch_job else None
        rows.append(head + (
            f"{row['compile_s']:.1f}", f"{step_s:.4f}", f"{row['sequences'] / step_s:.1f}",
            f"{row['real_tokens'] / step_s:.0f}", f"{flops_per_s / peak:.1%}" if peak else "n/a",
            f"{flops_per_s / ceiling:.1%}", f"{row['xla_bytes'] / 2**30:.2f}",
            f"{torch_s:.4f}" if torch_s else "-", f"{gathered:.4f}" if gathered else "-",
            f"{torch_peak / 2**30:.2f}" if torch_peak else "-", f"{ratio:.2f}" if ratio else "-",
            "; ".join(notes)))
    return rows


def header_lines(result: dict) -> list[str]:
    jax_result, torch_result = result["jax"], result.get("torch")
    peak = jax_result["peak_flops_per_s"]
    lines = [f"device: {jax_result['num_devices']} x {jax_result['device_kind']} ({jax_result['platform']}); "
             f"jax {jax_result['jax_version']}, flax {jax_result['flax_version']}; dropout RNG "
             f"{runtime.dropout_rng_name(result['spec'].get('dropout_rng', 'auto'), jax_result['platform'])}"
             + (f"; torch {torch_result['torch_version']} (CUDA {torch_result['cuda']}), transformers "
                f"{torch_result['transformers_version']}" if torch_result else "; transformers not run"),
             f"nominal bf16 peak: {peak / 1e12:.0f} TFLOP/s" if peak else "nominal bf16 peak: unknown for this device",
             f"measured {jax_result['dtype']} matmul ceiling ({jax_result['matmul_size']}^3): "
             f"{jax_result['ceiling_flops_per_s'] / 1e12:.4g} TFLOP/s (the higher of before the steps, "
             f"{jax_result['ceiling_before_flops_per_s'] / 1e12:.4g}, and after them, "
             f"{jax_result['ceiling_after_flops_per_s'] / 1e12:.4g})",
             f"{jax_result['dtype']} compute, float32 parameters and optimizer; model FLOPs as bert_jax.metrics counts "
             "them; seq/s "
             "counts instances (several per packed row); x torch = transformers' time per instance / ours; "
             "cudnn and xla rows: attention dropout 0 (the fused kernels have none), reference and transformers: 0.1; "
             "A>B: attention A requested, B ran",
             *ANCHORS]
    if result.get("jax_error"):
        lines.append(f"JAX side failed: {result['jax_error']}")
    if result.get("torch_error"):
        lines.append(f"torch side failed: {result['torch_error']}")
    return lines


def format_table(rows: list[tuple]) -> list[str]:
    widths = [max(len(column), *(len(row[index]) for row in rows)) if rows else len(column)
              for index, column in enumerate(COLUMNS)]
    widths[-1] = 0  # the note runs on

    def line(values):
        return " ".join(f"{value:<{width}}" if index in (0, 1, 4, len(COLUMNS) - 1) else f"{value:>{width}}"
                        for index, (value, width) in enumerate(zip(values, widths))).rstrip()
    return [line(COLUMNS), *(line(row) for row in rows)]


def markdown(result: dict, rows: list[tuple]) -> str:
    escape = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = [f"- {escape(line)}" for line in header_lines(result)]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(escape(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# The program.

def _spec_from_flags() -> dict:
    try:
        shapes = [parse_shape(text, "shapes") for text in FLAGS.shapes]
        pack_shape = parse_shape(FLAGS.pack_shape, "pack_shape") if FLAGS.pack_shape else None
        finetune_shape = parse_shape(FLAGS.finetune_shape, "finetune_shape") if FLAGS.finetune_shape else None
        batch_sizes = [int(size) for size in FLAGS.batch_sizes]
    except ValueError as error:
        raise app.UsageError(str(error) if "--" in str(error) else f"--batch_sizes={FLAGS.batch_sizes}: "
                             "expected positive integers") from error
    unknown = sorted(set(FLAGS.finetune_tasks) - set(TASK_LABELS))
    if unknown:
        raise app.UsageError(f"--finetune_tasks: unknown {unknown}; choose from {list(TASK_LABELS)}")
    from bert_jax import attention as attention_lib  # pylint: disable=import-outside-toplevel
    for name in [*FLAGS.attention, FLAGS.finetune_attention]:
        if name not in attention_lib.ATTENTION_IMPLEMENTATIONS:
            raise app.UsageError(f"--attention / --finetune_attention: unknown {name!r}; choose from "
                                 f"{list(attention_lib.ATTENTION_IMPLEMENTATIONS)}")
    return {"shapes": shapes, "batch_sizes": batch_sizes, "attention": list(FLAGS.attention),
            "pack_shape": pack_shape, "pack_instances": FLAGS.pack_instances, "finetune_shape": finetune_shape,
            "finetune_tasks": list(FLAGS.finetune_tasks), "finetune_batch": FLAGS.finetune_batch,
            "finetune_attention": FLAGS.finetune_attention, "steps": FLAGS.steps, "warmup": FLAGS.warmup,
            "dropout_rng": FLAGS.dropout_rng,
            "matmul_size": FLAGS.matmul_size, "memory_limit_gib": FLAGS.memory_limit_gib, "dtype": FLAGS.dtype}


def _side(side: str, spec: dict, budget_s: float, grace_s: float, workdir: str) -> tuple[dict | None, str]:
    """Runs one side in a child process; (its JSON result or None, the error that stopped it or '')."""
    spec_path, result_path = os.path.join(workdir, f"{side}_spec.json"), os.path.join(workdir, f"{side}.json")
    with open(spec_path, "w", encoding="utf-8") as file:
        json.dump(spec, file)
    command = [sys.executable, "-m", "bert_jax.benchmarks.gpu", f"--side={side}", f"--spec={spec_path}",
               f"--result={result_path}", f"--budget_s={int(budget_s)}"]
    # JAX's GPU allocator takes 75% of the memory by default; the side has the device to itself.
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", **os.environ}
    error = ""
    # A row that runs on past the budget (a long compile, a wedged device) must not hold the table: the side stops
    # starting rows at budget_s - grace_s and is stopped at budget_s, keeping the rows it wrote.
    try:
        process = subprocess.run(command, timeout=budget_s + grace_s, check=False, env=env)
        if process.returncode:
            error = f"exit status {process.returncode} (its output is above)"
    except subprocess.TimeoutExpired:
        error = f"stopped at its limit of {int(budget_s + grace_s)} s; the rows it finished are kept"
    if os.path.exists(result_path):
        with open(result_path, encoding="utf-8") as file:
            return json.load(file), error
    return None, error or "it wrote no result"


def planned_rows(spec: dict) -> list[tuple]:
    """(section, preset, seq_length, attention, packed) of every row `spec` asks for."""
    keys = [("pretrain", preset, seq_length, attention, None) for preset, seq_length in spec["shapes"]
            for attention in spec["attention"]]
    if spec["pack_shape"]:
        keys += [("pack", *spec["pack_shape"], spec["attention"][0], packed) for packed in (False, True)]
    if spec["finetune_shape"]:
        keys += [(task, *spec["finetune_shape"], spec["finetune_attention"], None) for task in spec["finetune_tasks"]]
    return keys


def with_unreached_rows(spec: dict, rows: list[dict], why: str) -> list[dict]:
    """`rows` plus a row saying `why` for each planned one the JAX side never wrote (it was stopped mid-row, or
    died), in the table's order."""
    present = {(row["section"], row["preset"], row["seq_length"], row["attention"], row.get("packed"))
               for row in rows}
    missing = [{"section": section, "preset": preset, "seq_length": seq_length, "batch_size": None,
                "attention": attention, **({} if packed is None else {"packed": packed}), "skipped": why}
               for section, preset, seq_length, attention, packed in planned_rows(spec)
               if (section, preset, seq_length, attention, packed) not in present]
    return sorted(rows + missing, key=functools.partial(_row_order, spec))


def run(spec: dict, out_dir: str, budget_s: float, torch_side: str = "auto", print_fn=print) -> dict:
    """Both sides in turn, then the table: printed, and written to out_dir/gpu_check.{json,md}. Returns the result."""
    start = time.monotonic()
    with_torch = torch_side == "on" or (torch_side == "auto" and not torch_reference.unavailable_reason())
    if torch_side == "on" and torch_reference.unavailable_reason():
        raise app.UsageError(f"--torch=on: {torch_reference.unavailable_reason()}")
    # The torch side needs no compiles: a fixed share of the budget; the JAX side stops starting rows a grace before
    # its share ends, time for the row in flight (a large step's compile) to finish.
    torch_s = min(TORCH_SECONDS, budget_s / 4) if with_torch else 0.0
    grace_s = min(GRACE_SECONDS, budget_s / 4)
    result: dict = {"spec": spec}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as workdir:
        jax_result, error = _side("jax", spec, budget_s - torch_s - grace_s, grace_s, workdir)
        result["jax"], result["jax_error"] = jax_result, error
        if jax_result is None:
            raise RuntimeError(f"the JAX side produced no result: {error}")
        jax_result["rows"] = with_unreached_rows(spec, jax_result["rows"], f"not reached: the JAX side {error}"
                                                 if error else "not reached")
        if with_torch:
            left = budget_s - (time.monotonic() - start)
            torch_spec = {"jobs": torch_jobs(jax_result), "steps": spec["steps"], "warmup": spec["warmup"],
                          "platform": jax_result["platform"], "dtype": jax_result["dtype"]}
            result["torch"], result["torch_error"] = _side("torch", torch_spec, max(left, 30) * 0.8,
                                                           max(left, 30) * 0.2, workdir)
    result["seconds"] = time.monotonic() - start
    rows = table_rows(result)
    result["table"] = [dict(zip(COLUMNS, row)) for row in rows]
    lines = header_lines(result) + format_table(rows) + [f"the check took {result['seconds']:.0f} s"]
    for line in lines:
        print_fn(line)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_check.json"), "w", encoding="utf-8") as file:
        json.dump(result, file, indent=1, default=str)
    with open(os.path.join(out_dir, "gpu_check.md"), "w", encoding="utf-8") as file:
        file.write(markdown(result, rows) + f"\nThe check took {result['seconds']:.0f} s.\n")
    return result


def _write_json(path: str, value) -> None:
    """Written whole or not at all (a side can be stopped while it writes)."""
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        json.dump(value, file, default=str)
    os.replace(path + ".tmp", path)


def main(argv):
    del argv
    if FLAGS.side:
        deadline = time.monotonic() + FLAGS.budget_s
        with open(FLAGS.spec, encoding="utf-8") as file:
            spec = json.load(file)
        if FLAGS.side == "jax":
            runtime.set_up_jax()
            spec["shapes"] = [tuple(shape) for shape in spec["shapes"]]
            for name in ("pack_shape", "finetune_shape"):
                spec[name] = tuple(spec[name]) if spec[name] else None
            side_result = run_jax_side(spec, deadline, write=functools.partial(_write_json, FLAGS.result))
        else:
            side_result = run_torch_side(spec["jobs"], spec["steps"], spec["warmup"], deadline, spec["platform"],
                                         spec["dtype"], write=functools.partial(_write_json, FLAGS.result))
        _write_json(FLAGS.result, side_result)
        return
    spec = _spec_from_flags()
    try:
        run(spec, FLAGS.out_dir, FLAGS.budget_s, FLAGS.torch, print_fn=lambda line: print(line, flush=True))
    except RuntimeError as error:
        print(f"gpu check failed: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
