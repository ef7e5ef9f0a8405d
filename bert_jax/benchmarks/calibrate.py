"""How far the planner's step-time estimate is from a measured step, on this machine's CPU:
`python -m bert_jax.benchmarks.calibrate --size=tiny,mini,base --batch_size=32`.

The planner predicts a TPU step from what XLA reports for the compiled program (bert_jax.chips.estimate: the larger
of FLOPs / peak FLOP/s and bytes accessed / memory bandwidth, plus transfers). Here the same estimate is made for
the real train step compiled by XLA:CPU, with this CPU's measured figures in place of a chip's datasheet: the matmul
ceiling (bert_jax.benchmarks.step.matmul_ceiling) and the bandwidth of a large elementwise pass over memory; and it
is set beside the step's measured median time (bert_jax.benchmarks.step.benchmark_step). "serial" adds compute and
memory time instead of taking the larger: a CPU overlaps little of one with the other.
"""

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import chips
from bert_jax import runtime
from bert_jax.benchmarks import matmul_bound
from bert_jax.benchmarks import step as step_benchmark

# --size, --seq_length, --batch_size and --steps are the step benchmark's flags (defaults set in __main__).
flags.DEFINE_integer("bandwidth_mib", 512, "Size of the array the memory bandwidth is measured on (MiB).")
FLAGS = flags.FLAGS

COLUMNS = ("preset", "batch", "GFLOP", "GB accessed", "compute s", "memory s", "predicted s", "serial s",
           "measured s", "predicted/measured", "serial/measured")


def memory_bandwidth(mib: int = 512, repeats: int = 10) -> float:
    """Bytes per second of an elementwise pass over a float32 array of `mib` MiB (read once, written once)."""
    values = jnp.ones((mib << 20) // 4, jnp.float32)
    scale = jax.jit(lambda x: x * 1.0001 + 1.0)
    jax.block_until_ready(scale(values))  # compiled outside the timing
    return 2 * values.nbytes / matmul_bound.median_seconds(lambda: jax.block_until_ready(scale(values)), repeats)


def calibrate(sizes, seq_length: int, batch_size: int, steps: int, bandwidth_mib: int, print_fn=print,
              matmul_size: int = 2048) -> list[dict]:
    max_predictions = max(1, round(0.15 * seq_length))
    flops_per_s = step_benchmark.matmul_ceiling(matmul_size, np.float32)
    bytes_per_s = memory_bandwidth(bandwidth_mib)
    cpu = chips.Chip("cpu", flops_per_s, 0, bytes_per_s, float("inf"), float("inf"), "measured")
    print_fn(f"{jax.devices()[0].device_kind}, {step_benchmark.schedulable_cores()} cores: float32 matmul ceiling "
             f"{flops_per_s / 1e9:.1f} GFLOP/s ({matmul_size}^3), memory bandwidth {bytes_per_s / 1e9:.2f} GB/s "
             f"({bandwidth_mib} MiB elementwise pass)")
    results = []
    for size in sizes:
        result = step_benchmark.benchmark_step(size, seq_length, batch_size, max_predictions, "float32", steps, 1)
        cost = result["cost"]
        estimate = chips.estimate(cpu, cost["flops"], cost["bytes accessed"])
        serial = estimate.compute_s + estimate.memory_s
        results.append(dict(size=size, batch=batch_size, chip=cpu, flops=cost["flops"], bytes=cost["bytes accessed"],
                            estimate=estimate, serial_s=serial, measured_s=result["step_s"]))
        print_fn(step_benchmark.spread(size, result["step_times"]))
    widths = [max(len(column), 7) for column in COLUMNS]
    print_fn(" ".join(column.rjust(width) for column, width in zip(COLUMNS, widths)))
    for row in results:
        estimate = row["estimate"]
        values = (row["size"], str(row["batch"]), f"{row['flops'] / 1e9:.1f}", f"{row['bytes'] / 1e9:.2f}",
                  f"{estimate.compute_s:.3f}", f"{estimate.memory_s:.3f}", f"{estimate.seconds:.3f}",
                  f"{row['serial_s']:.3f}", f"{row['measured_s']:.3f}", f"{estimate.seconds / row['measured_s']:.2f}",
                  f"{row['serial_s'] / row['measured_s']:.2f}")
        print_fn(" ".join(value.rjust(width) for value, width in zip(values, widths)))
    return results


def main(argv):
    del argv
    jax.config.update("jax_platforms", "cpu")  # a calibration of the CPU, also where libtpu is installed
    runtime.set_up_jax()
    calibrate(FLAGS.size, FLAGS.seq_length, FLAGS.batch_size, FLAGS.steps, FLAGS.bandwidth_mib,
              print_fn=lambda line: print(line, flush=True))


if __name__ == "__main__":
    FLAGS.set_default("size", ["tiny", "mini", "base"])
    FLAGS.set_default("batch_size", 32)
    FLAGS.set_default("steps", 5)
    app.run(main)
