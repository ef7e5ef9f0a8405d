"""The GPU check's torch side (bert_jax.benchmarks.gpu): transformers' steps on the shapes and batches the JAX side
measured, on the JAX side's platform (bert_jax.benchmarks.torch_reference), in a process of its own.
"""

import os
import time

from bert_jax.benchmarks import batches
from bert_jax.benchmarks import gpu_jax  # each row's model config, as the JAX side measured it
from bert_jax.benchmarks import step as step_lib
from bert_jax.benchmarks import torch_reference


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
        config = gpu_jax.model_config(job["preset"], job["seq_length"], dtype=dtype)
        try:
            if job["task"] == "pretraining":
                batch = batches.synthetic_batch(job["batch_size"], job["seq_length"],
                                                batches.default_max_predictions(job["seq_length"]), config.vocab_size)
                for gathered in (False, True):
                    measured = torch_reference.benchmark_step(config, batch, steps, warmup, _torch_threads(),
                                                              gathered, device=device)
                    result["gathered_step_s" if gathered else "step_s"] = measured["step_s"]
                    result["gathered_peak_bytes" if gathered else "peak_bytes"] = measured["peak_bytes"]
                    result.update(loss=measured["loss"], attention=measured["attention"], device=measured["device"])
            else:
                batch = batches.finetune_batch(job["task"], job["batch_size"], job["seq_length"], config.vocab_size, 2)
                measured = torch_reference.benchmark_step(config, batch, steps, warmup, _torch_threads(), False,
                                                          device=device, task=job["task"],
                                                          num_labels=batches.TASK_LABELS[job["task"]])
                result.update(step_s=measured["step_s"], peak_bytes=measured["peak_bytes"], loss=measured["loss"],
                              attention=measured["attention"], device=measured["device"])
        except Exception as error:  # pylint: disable=broad-except  # e.g. torch.cuda.OutOfMemoryError
            result["error"] = gpu_jax.short_error(error)
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        print(f"torch {job['task']} {job['preset']} seq {job['seq_length']} batch {job['batch_size']}: "
              + (f"step {result['step_s']:.4f} s" if "step_s" in result else result.get("error", "")), flush=True)
        if write is not None:
            write(side_result())
    return side_result()
