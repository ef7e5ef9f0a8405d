"""bert_jax.benchmarks.calibrate: the planner's step-time estimate fed with XLA:CPU's figures for the real step."""

import jax
import pytest

from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax.benchmarks import calibrate
from configs import pretrain


def test_the_estimate_is_made_from_the_compiled_steps_own_work():
    lines = []
    devices = len(jax.devices())
    (row,) = calibrate.calibrate(["tiny"], seq_length=16, batch_size=devices, steps=1, bandwidth_mib=8,
                                 print_fn=lines.append, matmul_size=256)
    config = model_lib.BertConfig.from_config(pretrain.get_config("size=tiny").model)
    executed = metrics_lib.step_matmul_flops_per_sequence(config, 16, 2) * row["batch"] / devices
    # XLA's count for one device's program: its share of the matmuls the step executes (forward and backward), and
    # the elementwise work and the optimizer's besides (large beside the matmuls of 16 tokens of tiny).
    assert executed <= row["flops"] <= 4 * executed
    assert row["bytes"] > 0 and row["measured_s"] > 0
    estimate = row["estimate"]
    assert estimate.seconds == pytest.approx(max(estimate.compute_s, estimate.memory_s))
    # XLA's work at this CPU's measured rates: its FLOPs at the matmul ceiling, its bytes at the memory bandwidth.
    assert estimate.compute_s == pytest.approx(row["flops"] / row["chip"].peak_flops)
    assert estimate.memory_s == pytest.approx(row["bytes"] / row["chip"].hbm_bytes_per_s)
    assert row["chip"].peak_flops > 0 and row["chip"].hbm_bytes_per_s > 0
    assert lines[-2].split() == list(" ".join(calibrate.COLUMNS).split())
    assert lines[-1].split()[:2] == ["tiny", str(row["batch"])]
