"""The GPU check (bert_jax.benchmarks.gpu) on the CPU: it runs to its table without TensorFlow, transformers runs on
the JAX side's platform, and its synthetic packed rows are the input pipeline packer's."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.benchmarks import batches
from bert_jax.benchmarks import gpu
from bert_jax.benchmarks import gpu_table
from bert_jax.benchmarks import step as step_benchmark
from bert_jax.benchmarks import torch_reference
from tests.helpers import ROOT


def test_the_gpu_check_runs_to_its_table_without_tensorflow(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    # GPU images often have no TensorFlow: a `tensorflow` that cannot be imported comes first on the path.
    fake = tmp_path / "no_tensorflow" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('tensorflow is not installed here')\n")
    # One CPU device: the suite's 8 fake ones would partition every program for nothing here.
    xla_flags = os.environ.get("XLA_FLAGS", "").replace("device_count=8", "device_count=1")
    # One torch thread: on a host whose cores are all busy, torch's spinning OpenMP threads slow its tiny steps many
    # times over; the check's figures are checked, not its speed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), ROOT]), XLA_FLAGS=xla_flags,
               OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    # cudnn falls back to xla on the CPU; the pack shape is the first shape,
    # so its unpacked side is timed with that row's executable. --dtype is left to auto: float32 on a CPU.
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.benchmarks.gpu", "--shapes=tiny:64", "--batch_sizes=8",
         "--attention=cudnn", "--pack_shape=tiny:64", "--finetune_shape=tiny:32",
         "--finetune_tasks=qa", "--finetune_batch=8", "--steps=1", "--warmup=0",
         "--matmul_size=128", f"--out_dir={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; dropout RNG threefry" in result.stdout  # auto, on a CPU
    lines = result.stdout.splitlines()
    header = next(index for index, line in enumerate(lines) if line.startswith("section"))
    assert lines[header].split("  ")[0] == "section"
    positions = [lines[header].index(column) for column in gpu_table.COLUMNS]
    assert positions == sorted(positions), lines[header]  # every column, in order
    rows = [line.split() for line in lines[header + 1:header + 5]]
    assert [row[:5] for row in rows] == [["pretrain", "tiny", "64", "8", "cudnn>xla"],
                                         ["pack", "off", "tiny", "64", "8"], ["pack", "on", "tiny", "64", "8"],
                                         ["qa", "tiny", "32", "8", "auto>reference"]]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["jax"]["platform"] == "cpu" and not report["jax_error"] and not report["torch_error"]
    assert report["jax"]["dtype"] == "float32" and "float32 compute" in result.stdout
    jobs = report["torch"]["jobs"]
    assert {(job["task"], job["seq_length"], job["batch_size"]) for job in jobs} == {("pretraining", 64, 8),
                                                                                    ("qa", 32, 8)}
    assert all(job["device"] == "cpu" and job["step_s"] > 0 for job in jobs)  # the JAX side's platform
    table = report["table"]
    assert [list(row) for row in table] == [list(gpu_table.COLUMNS)] * 4
    pack_off, pack_on = report["jax"]["rows"][1:3]
    assert (pack_off["packed"], pack_on["packed"]) == (False, True)
    # Packed rows of the same instances hold more real tokens (instance lengths uniform in [16, 64]: about 60% of
    # the padded rows), and so train more instances a step.
    assert pack_on["real_tokens"] > 1.3 * pack_off["real_tokens"] and pack_on["sequences"] > 1.3 * 8
    for row in table:
        assert float(row["step s"]) > 0 and float(row["x torch"]) > 0 and row["note"] == ""
    markdown = (out / "gpu_check.md").read_text()
    assert "| " + " | ".join(gpu_table.COLUMNS) + " |" in markdown and "MLPerf" in markdown


def test_packed_rows_hold_whole_instances_laid_out_as_the_packer_lays_them():
    lengths = batches.pack_instance_lengths(64, 128, seed=3)
    batch, placed = batches.packed_batch(lengths, 8, 128, 4, vocab_size=30522, seed=4)
    slots = batches.packed_predictions(128, 4)
    assert batch["masked_lm_positions"].shape == (8, slots) and batch["nsp_positions"].shape == (8, 4)
    real = 0
    for row in range(8):
        ids, positions = batch["instance_ids"][row], batch["position_ids"][row]
        count = int(batch["nsp_weights"][row].sum())
        assert count >= 1 and np.all(batch["nsp_weights"][row, count:] == 0)
        for slot in range(count):
            start = batch["nsp_positions"][row, slot]
            where = np.flatnonzero(ids == slot + 1)
            # Contiguous, starting at its NSP position, positions restarting at 0, one of the drawn lengths.
            assert where[0] == start and np.all(np.diff(where) == 1)
            assert np.array_equal(positions[where], np.arange(len(where))) and len(where) in lengths
            real += len(where)
        assert np.all(batch["input_mask"][row] == (ids > 0))
        predictions = batch["masked_lm_weights"][row] > 0
        masked = batch["masked_lm_positions"][row][predictions]
        assert np.all(batch["input_ids"][row][masked] == batches.MASK_ID)
        assert np.all(batch["masked_lm_ids"][row][predictions] >= 1000) and np.all(ids[masked] > 0)
    assert real == batch["input_mask"].sum() and placed == int(batch["nsp_weights"].sum())
    assert batch["input_mask"].mean() > 0.9  # the packer over 64 instances fills the rows (rows taken evenly)
    unpacked = batches.unpacked_batch(lengths[:8], 128, batches.default_max_predictions(128), vocab_size=30522, seed=4)
    assert np.array_equal(unpacked["input_mask"].sum(1), lengths[:8])


def test_transformers_runs_on_the_jax_sides_platform():
    assert torch_reference.torch_device("gpu") == "cuda" and torch_reference.torch_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="JAX's platform is tpu"):
        torch_reference.torch_device("tpu")
    # The step benchmark compares on a GPU too now, and refuses only where torch cannot run.
    assert step_benchmark._torch_comparison(None, "gpu")[0] == (not torch_reference.unavailable_reason())
    with pytest.raises(RuntimeError, match="platform is tpu"):
        step_benchmark._torch_comparison(True, "tpu")


def test_bad_shapes_name_the_flag():
    with pytest.raises(ValueError, match=r"--shapes='huge:128': expected PRESET:SEQ_LENGTH"):
        gpu.parse_shape("huge:128", "shapes")
    assert gpu.parse_shape("large:512", "pack_shape") == ("large", 512)


def test_rows_a_stopped_side_never_reached_are_listed_in_the_tables_order():
    spec = {"shapes": [("base", 128), ("large", 512)], "attention": ["cudnn", "xla"], "pack_shape": ("large", 512),
            "finetune_shape": ("base", 384), "finetune_tasks": ["sequence", "qa"], "finetune_attention": "auto"}
    done = [{"section": "pretrain", "preset": "base", "seq_length": 128, "batch_size": 64, "attention": "cudnn",
             "step_s": 0.07}]
    rows = gpu.with_unreached_rows(spec, done, "not reached: stopped")
    assert [(row["section"], row["preset"], row["attention"], row.get("packed")) for row in rows] == [
        ("pretrain", "base", "cudnn", None), ("pretrain", "base", "xla", None), ("pretrain", "large", "cudnn", None),
        ("pretrain", "large", "xla", None), ("pack", "large", "cudnn", False), ("pack", "large", "cudnn", True),
        ("sequence", "base", "auto", None), ("qa", "base", "auto", None)]
    assert rows[0] is done[0] and all(row["skipped"] == "not reached: stopped" for row in rows[1:])
