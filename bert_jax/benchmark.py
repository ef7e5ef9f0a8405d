"""Training-step benchmark: `python -m bert_jax.benchmark --size=base --seq_length=128 --batch_size=8`.

Prints one table row per configuration: compile time, median step time, sequences/s, tokens/s, model TFLOP/s, and
model-FLOPs utilisation against both the device's nominal peak (where known) and a matmul ceiling measured in the
same run. Synthetic batches, fed already on device, so the figure is the step alone.
"""

import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax import train
from configs import pretrain

flags.DEFINE_list("size", ["base"], "Presets to measure (tiny, mini, small, medium, base, large).")
flags.DEFINE_integer("seq_length", 128, "Sequence length.")
flags.DEFINE_integer("batch_size", 8, "Global batch size.")
flags.DEFINE_integer("max_predictions", 0, "Masked positions per sequence; 0 means 15% of seq_length.")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
flags.DEFINE_integer("steps", 10, "Timed steps (after one compile step and warmup steps).")
flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
flags.DEFINE_integer("matmul_size", 0, "Square matmul size for the ceiling; 0 picks 2048 on CPU, 8192 elsewhere.")
FLAGS = flags.FLAGS


def matmul_ceiling(size: int, dtype, repeats: int = 10) -> float:
    """Measured FLOP/s of one square matmul on the first device: the practical ceiling for this dtype."""
    keys = jax.random.split(jax.random.key(0))
    a = jax.random.normal(keys[0], (size, size), dtype)
    b = jax.random.normal(keys[1], (size, size), dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / statistics.median(times)


def benchmark_step(size: str, seq_length: int, batch_size: int, max_predictions: int, dtype: str, steps: int,
                   warmup: int) -> dict[str, float]:
    """Median wall time of the real sharded train step (data parallel over all devices)."""
    config = pretrain.get_config(f"size={size}")
    config.model.dtype = dtype
    config.data.max_seq_length = seq_length
    config.data.max_predictions_per_seq = max_predictions
    config.train.batch_size = batch_size
    config.train.num_steps = max(steps + warmup + 1, config.optim.warmup_steps)
    model_config = model_lib.BertConfig.from_config(config.model)
    model = model_lib.BertForPreTraining(model_config)
    mesh = sharding_lib.create_mesh(config.mesh)
    rules = sharding_lib.logical_rules(config.mesh)
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps)
    rng = np.random.default_rng(0)
    lengths = rng.integers(seq_length // 2, seq_length + 1, size=batch_size)
    batch = train.dummy_batch(batch_size, seq_length, max_predictions)
    batch["input_ids"] = rng.integers(1000, model_config.vocab_size, size=(batch_size, seq_length)).astype(np.int32)
    batch["input_mask"] = (np.arange(seq_length)[None] < lengths[:, None]).astype(np.int32)
    batch["masked_lm_positions"] = np.sort(rng.integers(1, seq_length // 2, size=(batch_size, max_predictions)), 1)
    batch["masked_lm_positions"] = batch["masked_lm_positions"].astype(np.int32)
    batch["masked_lm_ids"] = rng.integers(1000, model_config.vocab_size, (batch_size, max_predictions)).astype(np.int32)
    batch["masked_lm_weights"] = np.ones((batch_size, max_predictions), np.float32)

    with jax.set_mesh(mesh):
        state, shardings = train.create_train_state(model, tx, mesh, rules, jax.random.key(0), seq_length,
                                                    max_predictions)
        batch_sharding = sharding_lib.batch_sharding(mesh, rules)
        replicated = NamedSharding(mesh, PartitionSpec())
        step = jax.jit(train.make_train_step(model, tx, schedule, rules, mesh),
                       in_shardings=(shardings, batch_sharding, replicated), out_shardings=(shardings, replicated),
                       donate_argnums=0)
        device_batch = sharding_lib.make_global_batch(batch, batch_sharding)
        step_rng = jax.random.key(1)
        start = time.perf_counter()
        compiled = step.lower(state, device_batch, step_rng).compile()
        compile_seconds = time.perf_counter() - start
        for _ in range(warmup + 1):
            state, metrics = compiled(state, device_batch, step_rng)
        jax.block_until_ready(metrics)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            state, metrics = compiled(state, device_batch, step_rng)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    flops = model_lib.model_flops_per_sequence(model_config, seq_length, max_predictions) * batch_size
    memory = jax.devices()[0].memory_stats() or {}
    return {"compile_s": compile_seconds, "step_s": median, "seq_per_s": batch_size / median,
            "tokens_per_s": batch_size * seq_length / median, "model_tflops": flops / median / 1e12,
            "loss": float(metrics["loss"]), "peak_memory_gib": memory.get("peak_bytes_in_use", 0) / 2 ** 30}


def main(argv):
    del argv
    dtype = jnp.dtype(FLAGS.dtype)
    device = jax.devices()[0]
    matmul_size = FLAGS.matmul_size or (2048 if device.platform == "cpu" else 8192)
    ceiling = matmul_ceiling(matmul_size, dtype) * jax.device_count()
    peak = train.peak_flops_per_device(device) * jax.device_count()
    max_predictions = FLAGS.max_predictions or max(1, round(0.15 * FLAGS.seq_length))
    print(f"devices: {jax.device_count()} x {device.device_kind} ({device.platform}), jax {jax.__version__}")
    print(f"measured {FLAGS.dtype} matmul ceiling ({matmul_size}^3): {ceiling / 1e12:.3f} TFLOP/s; "
          f"nominal bf16 peak: {peak / 1e12:.0f} TFLOP/s" if peak else
          f"measured {FLAGS.dtype} matmul ceiling ({matmul_size}^3): {ceiling / 1e12:.3f} TFLOP/s")
    header = (f"{'preset':<7} {'seq':>4} {'batch':>5} {'dtype':<8} {'compile s':>9} {'step s':>8} {'seq/s':>9} "
              f"{'tok/s':>10} {'TFLOP/s':>8} {'of ceiling':>10} {'MFU':>6} {'peak GiB':>8}")
    print(header)
    for size in FLAGS.size:
        r = benchmark_step(size, FLAGS.seq_length, FLAGS.batch_size, max_predictions, FLAGS.dtype, FLAGS.steps,
                           FLAGS.warmup)
        mfu = f"{r['model_tflops'] * 1e12 / peak:.1%}" if peak else "n/a"
        print(f"{size:<7} {FLAGS.seq_length:>4} {FLAGS.batch_size:>5} {FLAGS.dtype:<8} {r['compile_s']:>9.1f} "
              f"{r['step_s']:>8.4f} {r['seq_per_s']:>9.1f} {r['tokens_per_s']:>10.0f} {r['model_tflops']:>8.3f} "
              f"{r['model_tflops'] * 1e12 / ceiling:>10.1%} {mfu:>6} {r['peak_memory_gib']:>8.2f}", flush=True)


if __name__ == "__main__":
    app.run(main)
