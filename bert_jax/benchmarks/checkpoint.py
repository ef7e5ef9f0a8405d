"""Checkpoint benchmark: `python -m bert_jax.benchmarks.checkpoint --size=base,large`.

For each preset it creates the real train state (fp32 parameters + AdamW moments) on all devices and prints:
how long an asynchronous save blocks the caller (the copy to host memory) and, where the train step is timed
(`--step_sizes`), that time as a fraction of one step; how long the background write takes; how long a restore
into freshly sharded arrays takes; and the checkpoint's size on disk. Saves and restores are timed with the
integrity checks and without them, interleaved, to show what the checks cost.
"""

import os
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpoint as checkpoint_lib
from bert_jax.data import synthetic
from bert_jax import presets
from bert_jax import sharding as sharding_lib
from bert_jax import train

flags.DEFINE_list("size", ["base", "large"], "Presets to measure.")
flags.DEFINE_list("step_sizes", ["base"], "Presets whose train step is also timed, for the blocking fraction.")
flags.DEFINE_integer("seq_length", 128, "Sequence length of the timed train step.")
flags.DEFINE_integer("batch_size", 8, "Global batch of the timed train step.")
flags.DEFINE_integer("saves", 3, "Saves per preset (the median is reported).")
flags.DEFINE_string("directory", "", "Where to write the checkpoints (default: a temporary directory, removed).")
FLAGS = flags.FLAGS


def _disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def measure(size: str, directory: str, time_step: bool) -> dict[str, float]:
    config = presets.pretraining_config(size, "synthetic")
    config.data.max_seq_length = FLAGS.seq_length
    config.data.max_predictions_per_seq = max(1, round(0.15 * FLAGS.seq_length))
    config.train.batch_size = FLAGS.batch_size
    setup = train.pretraining_setup(config)
    mesh, tx, shardings = setup.mesh, setup.tx, setup.shardings
    data = config.data
    batches = synthetic.synthetic_batches(batch_size=FLAGS.batch_size, max_seq_length=data.max_seq_length,
                                          max_predictions_per_seq=data.max_predictions_per_seq,
                                          vocab_size=config.model.vocab_size, seed=0)
    result = {}
    with jax.set_mesh(mesh):
        state = setup.create_state(jax.random.key(0))
        replicated = NamedSharding(mesh, PartitionSpec())
        batch_sharding = setup.batch_sharding
        if time_step:
            step = setup.pretraining_step()
            state, result["step_s"] = _time_steps(step, state, batches, batch_sharding)
        else:
            state = _with_trained_moments(state, tx, shardings)
        jax.block_until_ready(state)
        result["parameters"] = sum(x.size for x in jax.tree.leaves(state.params))
        result.update(_time_saves_and_restores(state, directory, batches, setup.abstract, shardings, replicated))
        result["size_bytes"] = _disk_bytes(os.path.join(directory, "checksums_True", str(FLAGS.saves)))
    return result


def _time_steps(step, state, batches, batch_sharding):
    """(the state after four steps, the median time of the last three)."""
    step_times = []
    for index in range(4):
        start = time.perf_counter()
        state, metrics = step(state, sharding_lib.make_global_batch(next(batches), batch_sharding),
                              jax.random.key(1))
        jax.block_until_ready(metrics)
        if index:  # the first includes compilation
            step_times.append(time.perf_counter() - start)
    return state, statistics.median(step_times)


def _with_trained_moments(state, tx, shardings):
    """`state` after one update with small random gradients."""
    # Optimizer moments of a trained run, not the zeros of a fresh one (zstd shrinks zeros to nothing).
    def update(state):
        leaves, treedef = jax.tree.flatten(state.params)
        keys = jax.random.split(jax.random.key(2), len(leaves))
        grads = jax.tree.unflatten(treedef, [1e-3 * jax.random.normal(key, x.shape, x.dtype)
                                             for key, x in zip(keys, leaves)])
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return state.replace(step=state.step + 1, opt_state=opt_state,
                             params=jax.tree.map(lambda p, u: p + u, state.params, updates))
    return jax.jit(update, out_shardings=shardings, donate_argnums=0)(state)


def _time_saves_and_restores(state, directory: str, batches, abstract, abstract_shardings,
                             replicated) -> dict[str, float]:
    """Median save (blocking and total) and restore times, with the integrity checks and ("_unchecked") without."""
    # Saves and restores with and without the integrity checks, interleaved so that both see the same machine.
    blocked, written, restore = {False: [], True: []}, {False: [], True: []}, {False: [], True: []}
    for save in range(FLAGS.saves):
        for checksums in (False, True):
            subdirectory = os.path.join(directory, f"checksums_{checksums}")
            checkpointer = checkpoint_lib.Checkpointer(subdirectory, every_steps=1, max_to_keep=1,
                                                       checksums=checksums)
            blocked[checksums].append(checkpointer.save(save + 1, state, jax.random.key(1), batches))
            start = time.perf_counter()
            checkpointer.wait()
            written[checksums].append(time.perf_counter() - start + blocked[checksums][-1])
            checkpointer.close()
            checkpointer = checkpoint_lib.Checkpointer(subdirectory, every_steps=1, max_to_keep=1,
                                                       checksums=checksums)
            start = time.perf_counter()
            _, restored, _, _ = checkpointer.restore_latest(abstract, abstract_shardings, replicated, batches)
            jax.block_until_ready(restored)
            restore[checksums].append(time.perf_counter() - start)
            checkpointer.close()
            del restored
    result = {}
    for checksums, suffix in ((True, ""), (False, "_unchecked")):
        result["save_blocking_s" + suffix] = statistics.median(blocked[checksums])
        result["save_total_s" + suffix] = statistics.median(written[checksums])
        result["restore_s" + suffix] = statistics.median(restore[checksums])
    return result


def main(argv):
    del argv
    root = FLAGS.directory or tempfile.mkdtemp(prefix="bert_jax_ckpt_bench_")
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; checkpoints under {root}")
    print("Each save and restore with the integrity checks (checksums at save, checksums and finite values at "
          "restore), and in brackets without them.")
    print(f"{'size':<6} {'params':>12} {'on disk':>10} {'step s':>8} {'save blocks s':>20} {'% of step':>9} "
          f"{'save total s':>20} {'restore s':>20}")
    try:
        for size in FLAGS.size:
            figures = measure(size, os.path.join(root, size), size in FLAGS.step_sizes)
            step = figures.get("step_s")
            fraction = f"{figures['save_blocking_s'] / step:.1%}" if step else "-"
            both = {name: f"{figures[name]:.3f} ({figures[name + '_unchecked']:.3f})"
                    for name in ("save_blocking_s", "save_total_s", "restore_s")}
            print(f"{size:<6} {figures['parameters']:>12,} {figures['size_bytes'] / 2**30:>8.2f} GiB "
                  f"{step if step else float('nan'):>8.3f} {both['save_blocking_s']:>20} {fraction:>9} "
                  f"{both['save_total_s']:>20} {both['restore_s']:>20}", flush=True)
    finally:
        if not FLAGS.directory:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
