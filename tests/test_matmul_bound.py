"""bert_jax.benchmarks.matmul_bound: the matmuls it finds in a step (counts and FLOPs, exactly) and the bound it sums
from them."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.benchmarks import batches
from bert_jax.benchmarks import step as benchmark
from bert_jax.benchmarks import matmul_bound
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax import steps as steps_lib
from bert_jax import train


def _flops(counts):
    return sum(matmul.flops * count for matmul, count in counts.items())


def test_counts_matmuls_through_jit_scan_and_the_backward_pass():
    batch, width, steps = 4, 8, 3

    def loss(w, x):
        def layer(h, _):
            return jnp.tanh(h @ w), None
        h, _ = jax.lax.scan(layer, x, None, length=steps)
        return jnp.sum(h)

    w, x = jnp.ones((width, width)), jnp.ones((batch, width))
    counts, notes = matmul_bound.collect_matmuls(jax.jit(jax.grad(loss)), w, x)
    # Forward: one [4, 8] x [8, 8] product a step; backward: the input and the weight gradient a step.
    assert sum(counts.values()) == 3 * steps and notes == []
    assert _flops(counts) == 3 * steps * 2 * batch * width * width
    forward = matmul_bound.Matmul((batch, width), "float32", (width, width), "float32",
                                  ((((1,), (0,)), ((), ())), "float32"))
    assert counts[forward] == steps


def test_cond_counts_its_most_expensive_branch_and_while_is_noted():
    def f(flag, x, y):
        return jax.lax.cond(flag, lambda: x @ y @ y, lambda: x @ y)

    x, y = jnp.ones((2, 4)), jnp.ones((4, 4))
    counts, notes = matmul_bound.collect_matmuls(f, True, x, y)
    assert sum(counts.values()) == 2 and _flops(counts) == 2 * (2 * 2 * 4 * 4)
    assert notes == ["a cond's most expensive branch is counted every time it runs, an upper bound"]
    # Branches of equal cost: the count is exact, with no note.
    counts, notes = matmul_bound.collect_matmuls(lambda flag: jax.lax.cond(flag, lambda: x @ y, lambda: -x @ y), True)
    assert sum(counts.values()) == 1 and notes == []

    def g(x, y):
        return jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] @ y, c[1] + 1), (x, 0))[0]

    counts, notes = matmul_bound.collect_matmuls(g, x, y)
    assert sum(counts.values()) == 1 and notes == [
        "a while loop's body is counted once (its trip count is not known when tracing)"]


def test_flops_of_batched_dots():
    attention = matmul_bound.Matmul((8, 12, 128, 64), "float32", (8, 12, 128, 64), "float32",
                                    ((((3,), (3,)), ((0, 1), (0, 1))), "float32"))
    assert attention.flops == 2 * 8 * 12 * 128 * 128 * 64
    assert attention.describe() == ("dot float32[8, 12, 128, 64] x float32[8, 12, 128, 64], contracting [3]/[3], "
                                    "batch [0, 1]/[0, 1]")


def test_each_matmul_alone_computes_its_product():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(20, dtype=np.float32).reshape(5, 4)
    dot = matmul_bound.Matmul((3, 4), "float32", (5, 4), "float32", ((((1,), (1,)), ((), ())), None))
    np.testing.assert_allclose(jax.jit(dot.function())(a, b), a @ b.T)


def test_time_alone_keeps_the_fastest_round_of_each_matmul(monkeypatch):
    small = matmul_bound.Matmul((2, 3), "float32", (3, 4), "float32", ((((1,), (0,)), ((), ())), None))
    large = matmul_bound.Matmul((4, 3), "float32", (3, 4), "float32", ((((1,), (0,)), ((), ())), None))
    # Rounds go over every matmul in turn: small, large, small, large, small, large.
    medians = iter([0.5, 2.0, 0.3, 3.0, 0.4, 1.0])
    monkeypatch.setattr(matmul_bound, "median_seconds", lambda run, repeats: next(medians))
    # At 1 FLOP/s each product is expected to take longer than a call should: one product per call.
    assert matmul_bound.time_alone([small, large], rounds=3, flops_per_s=1.0) == [0.3, 1.0]
    assert next(medians, None) is None
    # At the default rate these products take nanoseconds: each call runs the most products a call may (a median of
    # 2 s per call is 2 ms per product).
    inner, _ = matmul_bound._plan(small, 2e11)  # pylint: disable=protected-access
    assert inner == matmul_bound._MAX_INNER  # pylint: disable=protected-access
    medians = iter([2.0] * 6)
    assert matmul_bound.time_alone([small, large], rounds=3) == [2.0 / inner] * 2


def test_a_call_runs_enough_products_for_its_share_of_time():
    plan = matmul_bound._plan  # pylint: disable=protected-access
    big = matmul_bound.Matmul((1024, 768), "float32", (768, 3072), "float32",
                              ((((1,), (0,)), ((), ())), None))
    assert big.flops == 2 * 1024 * 768 * 3072
    # 4.8 GFLOP at 0.2 TFLOP/s is 24 ms, longer than a call's 2 ms: one product a call, 5 calls (the fewest).
    assert plan(big, 2e11) == (1, 5)
    # At 0.5 PFLOP/s it is 9.664 us: 207 products a call (2 ms), and 49 calls (0.1 s / 2.0004 ms, rounded down).
    assert plan(big, 5e14) == (207, 49)
    # At 5 PFLOP/s a call holds 2070 products, above the most (1000); still 50 calls at most.
    assert plan(big, 5e15) == (1000, 50)


def test_products_run_in_a_compiled_loop_equal_the_product():
    dot = matmul_bound.Matmul((3, 4), "float32", (4, 5), "float32", ((((1,), (0,)), ((), ())), None))
    keys = jax.random.split(jax.random.key(0))
    lhs, rhs = jax.random.normal(keys[0], (3, 4)), jax.random.normal(keys[1], (4, 5))
    looped = jax.jit(matmul_bound.looped(dot, 7))
    np.testing.assert_allclose(looped(lhs, rhs), lhs @ rhs, rtol=1e-6, atol=1e-6)  # fp32 sums of four products
    # The product stays inside the loop (the barrier keeps XLA from hoisting it out): the loop's body holds the dot.
    text = looped.lower(lhs, rhs).compile().as_text()
    body = re.search(r"while\(.*?body=%([\w.\-]+)", text).group(1)
    body_text = text[text.index(f"%{body} "):]
    body_text = body_text[:body_text.index("\n}")]
    assert re.search(r"dot\(|__onednn_fusion", body_text), body_text
    matmul_bound.alone(dot, inner=7)()  # compiles, runs and waits


def test_bound_is_the_sum_of_count_times_the_time_alone():
    def f(x, y, z):
        # The second product contracts z's last axis: another dot (z.T @ would transpose first, then the same dot).
        return (x @ y) @ z + jax.lax.dot_general(x @ y, z, (((1,), (1,)), ((), ())))

    x, y, z = jnp.ones((2, 3)), jnp.ones((3, 4)), jnp.ones((4, 4))
    seconds = {(2, 3): 1.0, (2, 4): 0.25}
    bound = matmul_bound.matmul_bound(f, x, y, z, timer=lambda matmuls: [seconds[m.lhs_shape] for m in matmuls])
    # x @ y twice (the same product: one group of two), then two different [2, 4] x [4, 4] products.
    assert bound["calls"] == 4 and len(bound["groups"]) == 3
    assert bound["seconds"] == pytest.approx(2 * 1.0 + 0.25 + 0.25)
    assert bound["flops"] == 2 * (2 * 2 * 3 * 4) + 2 * (2 * 2 * 4 * 4)
    assert bound["groups"][0]["count"] == 2 and bound["groups"][0]["matmul"].lhs_shape == (2, 3)


def _train_step_matmuls(**model_overrides):
    config = benchmark.preset_config("tiny", 32, 5, "float32", 4, 10)
    for name, value in model_overrides.items():
        setattr(config.model, name, value)
    model_config = model_lib.BertConfig.from_config(config.model)
    model = model_lib.BertForPreTraining(model_config)
    mesh = sharding_lib.create_mesh(config.mesh, jax.devices()[:1])
    rules = sharding_lib.logical_rules(config.mesh)
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps)
    batch = batches.synthetic_batch(4, 32, 5, model_config.vocab_size)
    with jax.set_mesh(mesh):
        # The state's shapes only: the matmuls are read from the step's trace, so no init program is compiled.
        state, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
        step = train.jit_train_step(steps_lib.make_train_step(model, tx, schedule, rules, mesh), shardings, mesh, rules)
        device_batch = sharding_lib.make_global_batch(batch, sharding_lib.batch_sharding(mesh, rules))
        counts, notes = matmul_bound.collect_matmuls(step, state, device_batch, jax.random.key(1))
    assert notes == []
    return counts, model_config


def test_train_step_matmuls_are_the_counted_flops_and_remat_adds_the_recomputed_forward():
    counts, config = _train_step_matmuls()
    model_flops = metrics_lib.model_flops_per_sequence(config, 32, 5) * 4
    tokens, d, layers = 4 * 32, config.hidden_size, config.num_layers
    # The step's last layer computes the [CLS] and 5 masked rows of each sequence only: each of the other rows
    # skips its query/output projections, feed-forward and attention over 32 keys, forward and backward.
    skipped_rows = 4 * (32 - 1 - 5)
    skipped = skipped_rows * 12 * d * (d + config.intermediate_size + 32)
    assert _flops(counts) == model_flops - skipped
    assert _flops(counts) == metrics_lib.step_matmul_flops_per_sequence(config, 32, 5) * 4
    # Scanned layers compute every row of every layer: the model FLOPs, counted through the scan's trip count.
    scanned, scanned_config = _train_step_matmuls(scan_layers=True)
    assert _flops(scanned) == model_flops == metrics_lib.step_matmul_flops_per_sequence(scanned_config, 32, 5) * 4
    encoder_kernels = layers * (4 * d * d + 2 * d * config.intermediate_size)
    # remat=full recomputes every layer's forward in the backward pass: its projections and attention products
    # (the last layer's at its computed rows: the forward third of `skipped` is not recomputed either).
    full, _ = _train_step_matmuls(remat="full")
    assert _flops(full) - _flops(counts) == (2 * encoder_kernels * tokens + 4 * layers * d * 32 * tokens
                                             - skipped // 3)
    # remat=matmuls saves the projections (no batch axes) and recomputes only the attention's batched products.
    saved, _ = _train_step_matmuls(remat="matmuls")
    assert _flops(saved) - _flops(counts) == 4 * layers * d * 32 * tokens - skipped_rows * 4 * d * 32
