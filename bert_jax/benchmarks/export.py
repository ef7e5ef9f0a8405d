"""Export / import benchmark: `python -m bert_jax.benchmarks.export --size=base`.

Writes a preset's parameters as one of our Orbax checkpoints, then times: export of that checkpoint to a
HuggingFace directory and to the Flax format, import of each back (bert_jax.interop.pretrained.load_pretrained),
and loading the HuggingFace directory with transformers (when installed), printing the sizes on disk.
"""

import os
import shutil
import tempfile
import time

from absl import app
from absl import flags
import jax
import numpy as np

from bert_jax import checkpoint as checkpoint_lib
from bert_jax.interop import export
from bert_jax.interop import pretrained
from bert_jax.data import synthetic
from bert_jax import presets
from bert_jax import train

flags.DEFINE_list("size", ["base"], "Presets to measure.")
flags.DEFINE_string("directory", "", "Where to write (default: a temporary directory, removed).")
FLAGS = flags.FLAGS


def _megabytes(path: str) -> float:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names) / 2**20


def _timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def measure(size: str, root: str) -> list[tuple[str, float, str]]:
    config = presets.pretraining_config(size, "synthetic")
    config.data.max_seq_length, config.data.max_predictions_per_seq = 128, 20
    setup = train.pretraining_setup(config)
    model_config = setup.model.config
    with jax.set_mesh(setup.mesh):
        state = setup.create_state(jax.random.key(0))
        checkpointer = checkpoint_lib.Checkpointer(os.path.join(root, "checkpoints"), every_steps=1, max_to_keep=1)
        batches = synthetic.synthetic_batches(batch_size=1, max_seq_length=8, max_predictions_per_seq=1,
                                              vocab_size=128, seed=0)
        checkpointer.save(1, state, jax.random.key(0), batches)
        checkpointer.close()
    del state
    rows = []
    checkpoint = os.path.join(root, "checkpoints", "1")
    hf_dir, flax_dir = os.path.join(root, "hf"), os.path.join(root, "flax")
    _, seconds = _timed(export.export_checkpoint, checkpoint, model_config, hf_dir, export_format="hf")
    rows.append(("export checkpoint -> HuggingFace", seconds, f"{_megabytes(hf_dir):.0f} MiB"))
    _, seconds = _timed(export.export_checkpoint, checkpoint, model_config, flax_dir, export_format="flax")
    rows.append(("export checkpoint -> Flax safetensors", seconds, f"{_megabytes(flax_dir):.0f} MiB"))
    (_, hf_params, _), seconds = _timed(pretrained.load_pretrained, hf_dir)
    rows.append(("import HuggingFace -> params", seconds, ""))
    (_, flax_params, _), seconds = _timed(pretrained.load_pretrained, flax_dir)
    rows.append(("import Flax safetensors -> params", seconds, ""))
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(hf_params), jax.tree.leaves(flax_params)))
    rows.append(("both imports bit-identical", float(same), ""))
    try:
        import transformers  # pylint: disable=import-outside-toplevel
    except ImportError:
        return rows
    _, seconds = _timed(transformers.BertForPreTraining.from_pretrained, hf_dir)
    rows.append(("transformers BertForPreTraining.from_pretrained", seconds, "(reference)"))
    return rows


def main(argv):
    del argv
    for size in FLAGS.size:
        root = FLAGS.directory or tempfile.mkdtemp(prefix="bert_jax_export_bench_")
        try:
            print(f"{size}: devices {jax.device_count()} x {jax.devices()[0].device_kind}")
            for name, seconds, note in measure(size, root):
                value = ("yes" if seconds else "NO") if name.startswith("both") else f"{seconds:8.2f} s"
                print(f"  {name:<50} {value:>10}  {note}", flush=True)
        finally:
            if not FLAGS.directory:
                shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
