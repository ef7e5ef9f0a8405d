"""The bert_jax driver: `python -m bert_jax.main --config=configs/pretrain.py:size=tiny --workdir=DIR`.

The same command runs on a laptop CPU, a GPU cluster (one process per host or per GPU) and every host of a Cloud
TPU pod slice; see launch/ for the per-platform wrappers.
"""

import functools
import os
import sys

if __name__ == "__main__":
    # A CPU run re-executes itself once for glibc's allocator (runtime.with_cpu_glibc_tunables): done before the
    # job's imports below (TensorFlow, Flax, Orbax), which the exec would throw away, not after them in run().
    from bert_jax import runtime as _runtime
    _runtime.set_up_jax()
    _runtime.with_cpu_glibc_tunables(__file__)

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bert_jax import checkpoint
from bert_jax import divergence
from bert_jax import finetune
from bert_jax import glue
from bert_jax import job_config
from bert_jax import pretraining
from bert_jax import runtime
from bert_jax import sharding

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/pretrain.py:size=base.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for TensorBoard events, metrics.jsonl and checkpoints.")
flags.DEFINE_enum("mode", "train", job_config.MODES,
                  "train: pretrain (resuming from WORKDIR/checkpoints if there are any); eval: held-out MLM/NSP "
                  "metrics of a checkpoint's parameters; export: a checkpoint to HuggingFace or Flax files; "
                  "finetune: sequence classification (with configs/finetune.py); features: embeddings to .npy "
                  "(with configs/finetune.py); glue: every GLUE task, the learning rate chosen on dev, and the "
                  "table (with configs/glue.py).")
flags.DEFINE_string("checkpoint", "", "With --mode=eval/export: a checkpoint step directory, or a checkpoints "
                    "directory (its latest step). Default: WORKDIR/checkpoints; with configs/finetune.py, "
                    "WORKDIR/finetuned (a fine-tuned classifier, exported for transformers).")
flags.DEFINE_enum("export_format", "hf", ["hf", "flax"], "With --mode=export: 'hf' (a directory transformers' "
                  "from_pretrained loads: config.json, model.safetensors, tokenizer files) or 'flax' (safetensors "
                  "of the parameter tree + our config).")
flags.DEFINE_string("output", "", "With --mode=export: the output directory. Default: WORKDIR/export/FORMAT.")
flags.DEFINE_string("coordinator_address", "", "host:port of process 0, for multi-process runs outside TPU pods "
                    "and SLURM (which are detected automatically).")
flags.DEFINE_integer("num_processes", 0, "Number of processes, with --coordinator_address.")
flags.DEFINE_integer("process_id", -1, "This process's index, with --coordinator_address.")
flags.DEFINE_integer("heartbeat_timeout_s", 30, "Multi-process runs: a process silent for this long counts as dead, "
                     "and the others stop (restart them all to resume).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments {argv[1:]}: every setting is a --flag or a --config.FIELD=VALUE")
    runtime.set_libtpu_options(FLAGS.config.train.dropout_rng)  # before JAX starts its TPU backend (below)
    sharding.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                                    FLAGS.heartbeat_timeout_s)
    config = job_config.prepare(FLAGS.config, FLAGS.workdir, FLAGS.mode,
                                command_line=config_flags.get_override_values(FLAGS["config"]))
    logging.info("config:\n%s", config)
    if os.environ.get("GLIBC_TUNABLES"):
        logging.info("glibc allocator: GLIBC_TUNABLES=%s", os.environ["GLIBC_TUNABLES"])
    if FLAGS.mode == "glue":
        glue.run_glue(config, FLAGS.workdir)
    elif FLAGS.mode == "features":
        logging.info("features written to %s", finetune.extract_features(config, FLAGS.workdir))
    elif FLAGS.mode == "export":
        export = finetune.export_finetuned if job_config.is_finetuning_recipe(config) else functools.partial(
            pretraining.export_checkpoint, config)
        logging.info("exported to %s", export(FLAGS.workdir, FLAGS.checkpoint, FLAGS.export_format, FLAGS.output))
    elif FLAGS.mode == "eval":
        _log_results(pretraining.evaluate_checkpoint(config, FLAGS.workdir, FLAGS.checkpoint))
    else:  # both training jobs run bert_jax.loop
        job = finetune.finetune if FLAGS.mode == "finetune" else pretraining.train_and_evaluate
        result = job(config, FLAGS.workdir)
        if result.preempted_at_step is not None:
            logging.info("stopped by SIGTERM after saving step %d; rerun the same command to resume",
                         result.preempted_at_step)
        else:
            _log_results(result.metrics)


def _log_results(results: dict[str, float]) -> None:
    logging.info("done: %s", " ".join(f"{name}={value:.6g}" for name, value in results.items()))


# User errors (a bad flag, field, file or path), a diverged run and a failed save (a full disk). The driver prints
# the message alone (it names the flag, file or path and the fix); --verbosity=1 adds the traceback.
USER_ERRORS = runtime.USER_ERRORS + (divergence.DivergenceError, checkpoint.CheckpointSaveError)


def _main_reporting_user_errors(argv):
    runtime.run_reporting_user_errors(main, argv, USER_ERRORS)


def _parse_flags(argv):
    """absl's flag parsing, with an override's error (a misspelt or mistyped --config field) as one message."""
    try:
        return FLAGS(argv)
    except flags.Error as error:
        message = str(error)
    except (KeyError, AttributeError, ValueError, TypeError) as error:
        # ml_collections raises AttributeError(KeyError("'name'\nDid you mean ...")) for a misspelt field.
        while error.args and isinstance(error.args[0], Exception):
            error = error.args[0]
        text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        message = "bad --config override: " + " ".join(str(text).split())
    sys.stderr.write(f"bert_jax: error: {message}\n")
    sys.exit(1)


def run():
    """Console-script entry point (`bert-jax`)."""
    runtime.set_up_driver(__file__)
    app.run(_main_reporting_user_errors, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
