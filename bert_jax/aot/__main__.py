"""`python -m bert_jax.aot`: the ahead-of-time compilation report for TPU topologies, or with --plan the planner's
search (bert_jax.aot.planner). The command line only: the library is bert_jax.aot, which imports no absl flags.
"""

import logging
import os
import re

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax import aot
from bert_jax import model as model_lib
from bert_jax import runtime
from bert_jax.aot import plan as plan_lib
from bert_jax.aot import planner

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Only when run as a program, so that importing the module claims no flag (bert_jax.main has --config too)."""
    flags.DEFINE_list("topology", None, "TPU topologies to compile for, CHIP:AxB[xC] (chips: "
                      f"{', '.join(sorted(aot.HBM_GIB_PER_CHIP))}), e.g. v5e:16x16,v5p:4x4x4,v4:2x2x4.")
    flags.DEFINE_integer("num_slices", 1, "Slices of each topology joined by the data-centre network (multi-slice): "
                         "data parallel across them (--config.mesh.dcn_data is set to it).")
    config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/pretrain.py:size=large.",
                                    lock_config=True)
    flags.DEFINE_bool("plan", False, "Search, for one --topology, the mesh split, remat policy, scan_layers, batch and "
                      "accumulation predicted fastest (bert_jax.aot.planner); print a table and the best one's flags.")
    flags.DEFINE_integer("plan_batch", 0, "--plan: the global batch per optimizer step to reach (e.g. BERT's 256), by "
                         "the largest micro-batch that fits and gradient accumulation; 0: the batch is free (the "
                         "largest that fits, or where a larger one would add less than --plan_saturation).")
    flags.DEFINE_float("plan_saturation", plan_lib.SATURATION, "--plan without --plan_batch: stop growing the batch "
                       "once the predicted throughput reaches this fraction of its limit at an unbounded batch "
                       "(1: the largest batch that fits).")
    flags.DEFINE_float("plan_headroom", 0.1, "--plan: the fraction of HBM a configuration must leave free.")
    flags.DEFINE_float("plan_hbm_gib", 0, "--plan: the HBM per chip to plan for, in GiB (0: the chip's), e.g. "
                       "less than the chip's when something else shares it.")
    flags.DEFINE_list("plan_meshes", [], "--plan: the DATAxFSDPxTENSOR splits of a slice to try, e.g. 256x1x1,1x256x1 "
                      "(default: pure data, full FSDP, FSDP in groups of 8, FSDP with 2- and 4-way tensor).")
    flags.DEFINE_float("plan_resolution", plan_lib.RESOLUTION, "--plan: bisect until the batch found is known to "
                       "within this fraction of itself.")
    flags.DEFINE_list("plan_remat", list(plan_lib.REMAT_CANDIDATES), "--plan: the remat policies to try.")
    flags.DEFINE_list("plan_scan", ["off", "on"], "--plan: model.scan_layers settings to try (off, on); on is "
                      "searched only where off does not fit, as a scanned step is no faster.")
    flags.DEFINE_string("plan_cache_dir", os.path.join(os.path.expanduser("~"), ".cache", "bert_jax", "aot"),
                        "--plan: where compiled configurations' reports are kept, so a rerun compiles only what is "
                        "new; empty keeps nothing.")
    flags.mark_flags_as_required(["config", "topology"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Before libtpu loads (the first topology): the option the config's dropout RNG needs, as the driver sets it.
    runtime.set_libtpu_options(FLAGS.config.train.dropout_rng)
    # JAX logs, at absl's default INFO, that no TPU backend starts on this host: expected of a compile-only run.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if FLAGS.plan:
        return _plan()
    reports = []
    for topology in FLAGS.topology:
        try:
            reports.append(aot.compile_train_step(FLAGS.config, topology, FLAGS.num_slices)[1])
        except ValueError as error:  # bad topology or a config that does not suit it: name the flag, no traceback
            raise app.UsageError(str(error)) from None
        except aot.LibtpuMissingError as error:
            raise SystemExit(f"bert_jax.aot: {error}") from None
    print(aot.format_reports(reports))
    if any(report.while_loops for report in reports):
        print("* the compiled step has while loops, whose bodies XLA's cost analysis counts once: its FLOPs are a "
              "lower bound (grad_accum_steps > 1, scan_layers, or XLA's own loops such as collective matmuls)")


def _plan() -> None:
    if len(FLAGS.topology) != 1:
        raise app.UsageError(f"--plan searches one topology at a time; got --topology={','.join(FLAGS.topology)}")
    scans = {"off": False, "on": True}
    bad_remat = sorted(set(FLAGS.plan_remat) - set(model_lib.REMAT_POLICIES))
    bad_scan = sorted(set(FLAGS.plan_scan) - set(scans))
    if bad_remat or bad_scan or not FLAGS.plan_remat or not FLAGS.plan_scan:
        raise app.UsageError(f"--plan_remat={','.join(FLAGS.plan_remat)} must name policies of "
                             f"{sorted(model_lib.REMAT_POLICIES)} and --plan_scan={','.join(FLAGS.plan_scan)} "
                             "settings of off,on")
    meshes = []
    for mesh in FLAGS.plan_meshes:
        if not re.fullmatch(r"\d+x\d+x\d+", mesh):
            raise app.UsageError(f"--plan_meshes: {mesh!r} is not DATAxFSDPxTENSOR, e.g. 64x4x1")
        meshes.append(tuple(int(size) for size in mesh.split("x")))
    try:
        spec = plan_lib.PlanSpec(
            FLAGS.config, FLAGS.topology[0], FLAGS.num_slices, headroom=FLAGS.plan_headroom,
            hbm_bytes=int(FLAGS.plan_hbm_gib * aot.GIB), remats=tuple(FLAGS.plan_remat),
            scans=tuple(scans[scan] for scan in FLAGS.plan_scan), meshes=tuple(meshes) or None,
            resolution=FLAGS.plan_resolution, saturation=FLAGS.plan_saturation, target_batch=FLAGS.plan_batch)
        planner.run(spec, FLAGS.plan_cache_dir)
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    except aot.LibtpuMissingError as error:
        raise SystemExit(f"bert_jax.aot: {error}") from None


def _set_compile_only_environment() -> None:
    """Process-wide settings for a compile-only run, made before JAX starts its backends (not at import)."""
    # With libtpu installed JAX tries a TPU backend first; compiling for a topology needs only libtpu's compiler, and
    # this process runs everything else (tracing, shape inference) on the CPU.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # libtpu takes a one-process-per-host lock when it loads, meant for processes that drive TPU chips. A compile-only
    # process drives none, and must not fail because a training run or another compilation holds the lock.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # Off a TPU VM libtpu asks the metadata server what it runs on, finds nothing and prints errors about it
    # ("Failed to find host bounds for accelerator type", "Logging before InitGoogle()") although compiling for a
    # named topology needs neither answer. Naming any accelerator and worker host stops the questions.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


if __name__ == "__main__":
    _set_compile_only_environment()
    _define_flags()
    app.run(main)
