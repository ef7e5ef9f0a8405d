"""What a run reports: the log line, TensorBoard scalars and metrics.jsonl, evaluation summaries, and MFU (the
model's FLOPs per sequence, the device's peak)."""

import itertools
import json
import math
import os
import socket
import time

import jax
import numpy as np

from bert_jax import arch as arch_lib
from bert_jax import fileio
from bert_jax import record_framing

# Dense bf16 peak FLOP/s per chip, for the MFU estimate; matched against jax.Device.device_kind.
PEAK_FLOPS_BY_DEVICE_KIND = (
    ("TPU v6", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
    ("TPU v4", 275e12), ("TPU v3", 123e12), ("H200", 989e12), ("H100", 989e12), ("A100", 312e12),
)


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
    mlm_loss = sums["mlm_loss_sum"] / max(sums["mlm_weight"], 1e-5)
    return {"eval_mlm_loss": mlm_loss, "eval_mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_weight"], 1e-5),
            "eval_mlm_perplexity": math.exp(min(mlm_loss, 80.0)),
            **({"eval_nsp_loss": sums["nsp_loss_sum"] / sums["nsp_count"],
                "eval_nsp_accuracy": sums["nsp_correct"] / sums["nsp_count"]}
               if "nsp_loss_sum" in sums and sums["nsp_count"] > 0 else {})}  # MLM-only rows have no NSP label


def model_flops_per_sequence(config, seq_length: int, max_predictions: int) -> float:
    """Training FLOPs (forward + backward = 3x forward) for one sequence of `config`'s architecture, counting matmuls
    only (bert_jax.arch.base.encoder_flops, plus the architecture's heads)."""
    return arch_lib.of(config).flops_per_sequence(config, seq_length, max_predictions)


def head_cls_rows(nsp_positions) -> int:
    """[CLS] rows per row of the batch that the NSP head reads: 1, or (packed rows) nsp_positions' width."""
    return 1 if nsp_positions is None else nsp_positions.shape[1]


def step_matmul_flops_per_sequence(config, seq_length: int, max_predictions: int, cls_rows: int = 1) -> float:
    """The matmul FLOPs the pretraining train step executes for one row of `seq_length` tokens: fewer than
    model_flops_per_sequence where the architecture's last layer computes only the rows the heads read (`cls_rows`
    [CLS] rows, see head_cls_rows, and the masked positions)."""
    return arch_lib.of(config).step_matmul_flops_per_sequence(config, seq_length, max_predictions, cls_rows)


def peak_flops_per_device(device: jax.Device, override: float = 0.0) -> float:
    """Peak FLOP/s of one device for the MFU estimate; 0 when unknown (CPUs, unlisted accelerators)."""
    if override > 0:
        return override
    for kind, flops in PEAK_FLOPS_BY_DEVICE_KIND:
        if kind.lower() in device.device_kind.lower():
            return flops
    return 0.0


def log_line(step: int, num_steps: int, scalars: dict[str, float], steps_per_second: float) -> str:
    nsp = "nsp_loss" in scalars  # a masked-LM-only model logs no NSP figures
    line = (f"step {step}/{num_steps} | loss {scalars['loss']:.4f} mlm {scalars['mlm_loss']:.4f} "
            + (f"nsp {scalars['nsp_loss']:.4f} " if nsp else "") + f"| mlm_acc {scalars['mlm_accuracy']:.4f} "
            + (f"nsp_acc {scalars['nsp_accuracy']:.4f} " if nsp else "") + f"| grad_norm {scalars['grad_norm']:.3f} "
            f"lr {scalars['learning_rate']:.3g}")
    if steps_per_second:
        mfu = f"{scalars['mfu']:.1%}" if "mfu" in scalars else "n/a"
        eta = format_duration((num_steps - step) / steps_per_second)
        line += (f" | {scalars['sequences_per_second']:.1f} seq/s {scalars['tokens_per_second']:.0f} tok/s"
                 f" | MFU {mfu} | ETA {eta}")
    return line + "".join(f" | {k} {v:.4f}" if k != "eval_records" else f" | {k} {v:.0f}"
                          for k, v in scalars.items() if k.startswith("eval_"))


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


_EVENT_FILES = itertools.count()  # tells apart the event files one process opens within a second


class _EventWriter:
    """A TensorBoard event file of scalars as TensorFlow's tf.summary.scalar writes them (a float32 tensor for the
    scalars plugin, in TFRecord framing), written without importing TensorFlow on local disk (seconds at every start
    of the driver; absent from many GPU images)."""

    def __init__(self, directory: str):
        from tensorboard.compat.proto import event_pb2  # pylint: disable=import-outside-toplevel
        from tensorboard.plugins.scalar import summary_v2  # pylint: disable=import-outside-toplevel
        self._event_pb2, self._summary_v2 = event_pb2, summary_v2
        fileio.makedirs(directory)
        name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(_EVENT_FILES)}"
                ".v2")
        self._file = record_framing.TFRecordWriter(fileio.join(directory, name))
        self._write(event_pb2.Event(file_version="brain.Event:2"))

    def _write(self, event) -> None:
        event.wall_time = time.time()
        self._file.write(event.SerializeToString())

    def scalar(self, name: str, value, step: int) -> None:
        summary = self._summary_v2.scalar_pb(name, float(value))
        tensor = summary.value[0].tensor
        tensor.ClearField("float_val")  # the value's bytes instead, as TensorFlow writes it
        tensor.tensor_content = np.float32(value).tobytes()
        self._write(self._event_pb2.Event(step=int(step), summary=summary))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class MetricWriter:
    """Log lines, TensorBoard scalars and a metrics.jsonl in the workdir (local or gs://; process 0 only).

    `resume_step`: the step a run starts from (its checkpoint's, 0 from scratch). Records of later steps, written
    by an earlier run that stopped before saving them, are dropped from both metrics.jsonl and the TensorBoard
    event files, since this run logs those steps again: one record per step, whichever reader reads them back.
    None (fine-tuning, --mode=eval) appends to what is there.
    """

    def __init__(self, workdir: str, tensorboard_subdir: str = "tensorboard", jsonl_name: str = "metrics.jsonl",
                 resume_step: int | None = None):
        self.enabled = jax.process_index() == 0
        if self.enabled:
            fileio.makedirs(workdir)
            jsonl_path = fileio.join(workdir, jsonl_name)
            tensorboard_dir = fileio.join(workdir, tensorboard_subdir)
            if resume_step is not None:
                drop_jsonl_records_after(jsonl_path, resume_step)
                drop_events_after(tensorboard_dir, resume_step)  # before this run's own event file exists
            self._summary = _EventWriter(tensorboard_dir)
            self._jsonl = fileio.open_file(jsonl_path, "a")

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


_REWRITE_SUFFIX = ".rewrite-tmp"


def _temporary(path: str) -> str:
    # No "tfevents" in the name: TensorBoard reads every file whose name has it, and must not read a half-written one.
    directory, name = path[:len(path) - len(os.path.basename(path))], os.path.basename(path)
    return directory + name.replace("tfevents", "rewriting") + _REWRITE_SUFFIX


def _replace(path: str, write_contents) -> None:
    """Writes `path` anew through a temporary file renamed over it: a kill half-way leaves the old file whole."""
    temporary = _temporary(path)
    write_contents(temporary)
    fileio.rename(temporary, path)


def drop_jsonl_records_after(path: str, step: int) -> int:
    """Rewrites the metrics.jsonl at `path` without the records of steps after `step`, and without a last line cut
    short by a kill. Returns how many lines were dropped (the file is left untouched when none is)."""
    if fileio.exists(_temporary(path)):
        fileio.remove(_temporary(path))  # a rewrite that was killed before its rename
    if not fileio.exists(path):
        return 0
    with fileio.open_file(path) as file:
        lines = file.readlines()
    kept = []
    for line in lines:
        try:
            complete = line.endswith("\n") and int(json.loads(line)["step"]) <= step
        except (ValueError, KeyError, TypeError):
            complete = False  # not a whole record
        if complete:
            kept.append(line)
    if len(kept) < len(lines):
        def write(temporary):
            with fileio.open_file(temporary, "w") as file:
                file.writelines(kept)
        _replace(path, write)
    return len(lines) - len(kept)


def drop_events_after(directory: str, step: int) -> int:
    """Rewrites each TensorBoard event file in `directory` that holds events of steps after `step` (or a record
    cut short by a kill, or failing its CRC) without them. Returns how many events were dropped.

    Rewriting, rather than a SessionLog.START purge marker, leaves one event per tag and step for every reader:
    TensorBoard, and tf.compat.v1.train.summary_iterator or tf.data, which apply no purge.
    """
    if not fileio.exists(directory):
        return 0
    from tensorboard.compat.proto import event_pb2  # pylint: disable=import-outside-toplevel
    dropped = 0
    for path in fileio.glob(fileio.join(directory, "*")):
        if path.endswith(_REWRITE_SUFFIX):
            fileio.remove(path)  # a rewrite that was killed before its rename
            continue
        if "tfevents" not in os.path.basename(path):
            continue
        records, cut = record_framing.read_framed_records(path)
        # A framed record is the 12-byte length header, the Event, and its 4-byte CRC.
        kept = [record for record in records if event_pb2.Event.FromString(record[12:-4]).step <= step]
        if cut or len(kept) < len(records):
            def write(temporary, kept=kept):
                with fileio.open_file(temporary, "wb") as file:
                    file.write(b"".join(kept))
            _replace(path, write)
            dropped += len(records) - len(kept)
    return dropped
