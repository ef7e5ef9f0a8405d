"""Compile-time benchmark: `python -m bert_jax.benchmarks.compile --size=large --layers=6,12,24`.

Traces, lowers and compiles the real train step for several depths, with the layers scanned (model.scan_layers)
and unrolled: with the scan, compile time should not grow with depth.
"""

import time

from absl import app
from absl import flags
import jax

from bert_jax import presets
from bert_jax import train

flags.DEFINE_string("size", "large", "Preset whose widths are used.")
flags.DEFINE_list("layers", ["6", "12", "24"], "Depths to compile.")
flags.DEFINE_list("scan", ["true", "false"], "scan_layers settings to compare.")
flags.DEFINE_enum("remat", "none", ["none", "matmuls", "full"], "Rematerialisation policy.")
flags.DEFINE_integer("seq_length", 128, "Sequence length.")
flags.DEFINE_integer("batch_size", 8, "Global batch.")
FLAGS = flags.FLAGS


def compile_seconds(size: str, layers: int, scan: bool, remat: str, seq_length: int, batch_size: int):
    """(trace + lower seconds, compile seconds) of the train step on the first device."""
    config = presets.pretraining_config(size, "synthetic")
    config.model.num_layers, config.model.scan_layers, config.model.remat = layers, scan, remat
    predictions = max(1, round(0.15 * seq_length))
    config.data.max_seq_length, config.data.max_predictions_per_seq = seq_length, predictions
    setup = train.pretraining_setup(config, jax.devices()[:1])
    with jax.set_mesh(setup.mesh):
        batch = {name: jax.ShapeDtypeStruct(value.shape, value.dtype)
                 for name, value in train.dummy_batch(batch_size, seq_length, predictions).items()}
        start = time.perf_counter()
        step = setup.pretraining_step()
        lowered = step.lower(setup.abstract, batch, jax.random.key(0))
        lowered_at = time.perf_counter()
        lowered.compile()
        return lowered_at - start, time.perf_counter() - lowered_at


def main(argv):
    del argv
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; {FLAGS.size} widths, seq {FLAGS.seq_length}, "
          f"batch {FLAGS.batch_size}, remat {FLAGS.remat}")
    print(f"{'layers':>6} {'scan_layers':>11} {'trace+lower s':>14} {'compile s':>10} {'total s':>8}")
    for scan in (value.lower() in ("1", "true", "yes") for value in FLAGS.scan):
        for layers in map(int, FLAGS.layers):
            lower, compile_ = compile_seconds(FLAGS.size, layers, scan, FLAGS.remat, FLAGS.seq_length,
                                              FLAGS.batch_size)
            print(f"{layers:>6} {scan!s:>11} {lower:>14.1f} {compile_:>10.1f} {lower + compile_:>8.1f}", flush=True)


if __name__ == "__main__":
    app.run(main)
