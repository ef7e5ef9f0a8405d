"""What a run reports: the log line, TensorBoard scalars and metrics.jsonl, evaluation summaries, MFU peaks."""

import json
import math

import jax

from bert_jax import fileio

# Dense bf16 peak FLOP/s per chip, for the MFU estimate; matched against jax.Device.device_kind.
PEAK_FLOPS_BY_DEVICE_KIND = (
    ("TPU v6", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
    ("TPU v4", 275e12), ("TPU v3", 123e12), ("H200", 989e12), ("H100", 989e12), ("A100", 312e12),
)


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
    mlm_loss = sums["mlm_loss_sum"] / max(sums["mlm_weight"], 1e-5)
    return {"eval_mlm_loss": mlm_loss, "eval_mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_weight"], 1e-5),
            "eval_mlm_perplexity": math.exp(min(mlm_loss, 80.0)),
            "eval_nsp_loss": sums["nsp_loss_sum"] / sums["nsp_count"],
            "eval_nsp_accuracy": sums["nsp_correct"] / sums["nsp_count"]}


def peak_flops_per_device(device: jax.Device, override: float = 0.0) -> float:
    """Peak FLOP/s of one device for the MFU estimate; 0 when unknown (CPUs, unlisted accelerators)."""
    if override > 0:
        return override
    for kind, flops in PEAK_FLOPS_BY_DEVICE_KIND:
        if kind.lower() in device.device_kind.lower():
            return flops
    return 0.0


def log_line(step: int, num_steps: int, scalars: dict[str, float], steps_per_second: float) -> str:
    line = (f"step {step}/{num_steps} | loss {scalars['loss']:.4f} mlm {scalars['mlm_loss']:.4f} "
            f"nsp {scalars['nsp_loss']:.4f} | mlm_acc {scalars['mlm_accuracy']:.4f} "
            f"nsp_acc {scalars['nsp_accuracy']:.4f} | grad_norm {scalars['grad_norm']:.3f} "
            f"lr {scalars['learning_rate']:.3g}")
    if steps_per_second:
        mfu = f"{scalars['mfu']:.1%}" if "mfu" in scalars else "n/a"
        eta = format_duration((num_steps - step) / steps_per_second)
        line += (f" | {scalars['sequences_per_second']:.1f} seq/s {scalars['tokens_per_second']:.0f} tok/s"
                 f" | MFU {mfu} | ETA {eta}")
    return line + "".join(f" | {k} {v:.4f}" for k, v in scalars.items() if k.startswith("eval_"))


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class MetricWriter:
    """Log lines, TensorBoard scalars and a metrics.jsonl in the workdir (local or gs://; process 0 only)."""

    def __init__(self, workdir: str, tensorboard_subdir: str = "tensorboard", jsonl_name: str = "metrics.jsonl"):
        self.enabled = jax.process_index() == 0
        if self.enabled:
            from flax.metrics import tensorboard  # imported lazily: it pulls in TensorFlow's summary ops
            fileio.makedirs(workdir)
            self._summary = tensorboard.SummaryWriter(fileio.join(workdir, tensorboard_subdir))
            # Appended to, so a resumed run continues the file; a step logged twice keeps its last line.
            self._jsonl = fileio.open_file(fileio.join(workdir, jsonl_name), "a")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        for name, value in scalars.items():
            self._summary.scalar(name, value, step)
        self._summary.flush()
        self._jsonl.write(json.dumps({"step": step, **{k: float(v) for k, v in scalars.items()}}) + "\n")
        self._jsonl.flush()

    def close(self):
        if self.enabled:
            self._summary.close()
            self._jsonl.close()
