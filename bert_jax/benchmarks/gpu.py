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
  are about half padding, as the demo corpus's at 512) unpacked and packed up to --pack_instances per row by the
  input pipeline's packer (bert_jax.data.packing, in numpy): the instances and the real (non-padding) tokens each
  step trains per second;
- fine-tuning at --finetune_shape (BERT-base at seq 384): the sequence, tokens and qa tasks' train steps;
- transformers: BertForPreTraining (stock: MLM logits at every position; gathered: at the masked ones, as ours) and
  the fine-tuning models on the same device, same shapes and batches, bf16 autocast, dropout on, SDPA attention;
  the table's "x torch" is torch's step time over ours (above 1: ours is faster).
The JAX side and the torch side run in child processes one after the other: each gets the whole device memory (JAX's
allocator keeps what it took until its process ends), and a failure in one leaves the other's rows. Rows that do not
fit the budget are listed as skipped. It prints one table and writes gpu_check.json and gpu_check.md to --out_dir.
On a CPU the same command runs at small shapes (the tests do: tiny presets, no cuDNN).

This module is the program (flags, the two sides' processes, the budget); the sides are gpu_jax and gpu_torch, the
table gpu_table, and the batches bert_jax.benchmarks.batches, which the step benchmark shares.
"""

import functools
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from bert_jax import presets
from bert_jax import runtime
from bert_jax.benchmarks import batches
from bert_jax.benchmarks import gpu_jax
from bert_jax.benchmarks import gpu_table
from bert_jax.benchmarks import gpu_torch
from bert_jax.benchmarks import step as step_lib
from bert_jax.benchmarks import torch_reference

FLAGS = flags.FLAGS
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


def _spec_from_flags() -> dict:
    try:
        shapes = [parse_shape(text, "shapes") for text in FLAGS.shapes]
        pack_shape = parse_shape(FLAGS.pack_shape, "pack_shape") if FLAGS.pack_shape else None
        finetune_shape = parse_shape(FLAGS.finetune_shape, "finetune_shape") if FLAGS.finetune_shape else None
        batch_sizes = [int(size) for size in FLAGS.batch_sizes]
    except ValueError as error:
        raise app.UsageError(str(error) if "--" in str(error) else f"--batch_sizes={FLAGS.batch_sizes}: "
                             "expected positive integers") from error
    unknown = sorted(set(FLAGS.finetune_tasks) - set(batches.TASK_LABELS))
    if unknown:
        raise app.UsageError(f"--finetune_tasks: unknown {unknown}; choose from {list(batches.TASK_LABELS)}")
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
    return sorted(rows + missing, key=functools.partial(gpu_jax.row_order, spec))


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
            torch_spec = {"jobs": gpu_torch.torch_jobs(jax_result), "steps": spec["steps"], "warmup": spec["warmup"],
                          "platform": jax_result["platform"], "dtype": jax_result["dtype"]}
            result["torch"], result["torch_error"] = _side("torch", torch_spec, max(left, 30) * 0.8,
                                                           max(left, 30) * 0.2, workdir)
    result["seconds"] = time.monotonic() - start
    rows = gpu_table.table_rows(result)
    result["table"] = [dict(zip(gpu_table.COLUMNS, row)) for row in rows]
    lines = (gpu_table.header_lines(result) + gpu_table.format_table(rows)
             + [f"the check took {result['seconds']:.0f} s"])
    for line in lines:
        print_fn(line)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_check.json"), "w", encoding="utf-8") as file:
        json.dump(result, file, indent=1, default=str)
    with open(os.path.join(out_dir, "gpu_check.md"), "w", encoding="utf-8") as file:
        file.write(gpu_table.markdown(result, rows) + f"\nThe check took {result['seconds']:.0f} s.\n")
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
            side_result = gpu_jax.run_jax_side(spec, deadline, write=functools.partial(_write_json, FLAGS.result))
        else:
            side_result = gpu_torch.run_torch_side(spec["jobs"], spec["steps"], spec["warmup"], deadline,
                                                   spec["platform"], spec["dtype"],
                                                   write=functools.partial(_write_json, FLAGS.result))
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
