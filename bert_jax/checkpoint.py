"""Orbax checkpoints of a whole run: train state, the dropout RNG, and every process's input position.

Where a run starts from (`Checkpointer.restore_latest` and bert_jax.pretraining decide it, in this order):
1. The workdir's own checkpoints (WORKDIR/checkpoints): the latest one that restores (or the one
   checkpoint.restore_step names: newer ones are moved aside to `STEP.rewound`). A corrupt or partial one
   (unreadable, failing its checksums, or holding a NaN) is skipped with a warning naming it, moved aside to
   `STEP.corrupt` (kept, never deleted), and the one before is used. One whose parameters made the next step
   diverge is moved aside to `STEP.diverged` by the run that saw it (bert_jax.divergence). A run restarted after a crash or a preemption
   continues exactly where it stopped: same parameters, optimizer state, step, RNG and input position, so the
   losses are the ones the uninterrupted run would have had.
2. `--config.init`: a checkpoint of another run (a step directory, or a checkpoints directory whose latest step is
   taken): its parameters only; the optimizer, step counter, schedule and input start afresh (continued
   pretraining with a new recipe). Used only while the workdir has no checkpoint of its own.
3. Otherwise from scratch: parameters initialised from `train.seed`.

Saves are asynchronous by default: `save` blocks only while the arrays are copied to host memory; writing happens
in the background (checkpoint.async_save=False: in the foreground), into a temporary directory that becomes the
step directory only once complete (an atomic rename on local disks, a commit marker on GCS), so a half-written
checkpoint is never restored. A save that fails raises CheckpointSaveError once its write reports it; a state
holding a NaN is never saved. Restoring onto a different mesh or device count works: arrays are read into the
shardings of the new state.
"""

import contextlib
import dataclasses
import os
import signal
import threading
import time
from typing import Any

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers
# Not re-exported by orbax.checkpoint; the same store its default jax.Array handler writes array metadata with.
from orbax.checkpoint._src.metadata import array_metadata_store

from bert_jax import sharding as sharding_lib

CHECKPOINT_SUBDIR = "checkpoints"
STATE_ITEM = "state"  # {"train_state": TrainState, "rng": uint32 key data}
DATA_ITEM = "data"  # one input-position file set per process
INTEGRITY_ITEM = "integrity"  # JSON: {"checksums": {array name: checksum}} of the state item's arrays
HEALTH_ITEM = "health"  # JSON: bert_jax.divergence.Health (recent losses, verified steps, rewinds)


@dataclasses.dataclass
class KeepStep:
    """A preservation policy (orbax's protocol) that keeps one step, changed as the run goes: the newest verified
    checkpoint (bert_jax.divergence) survives max_to_keep."""
    step: int | None = None

    def should_preserve(self, checkpoints, *, context):  # pylint: disable=unused-argument
        return [info.step == self.step for info in checkpoints]


# ---------------------------------------------------------------------------------------------------------------
# The input position: each process saves its own iterator (tf.data checkpoint or a batch counter).

class DataIteratorHandler(ocp.CheckpointHandler):
    """Saves/restores an iterator with `save_state(path)` / `restore_state(path)`, one file set per process."""

    @staticmethod
    def _prefix(directory: epath.Path) -> str:
        return str(directory / f"process_{jax.process_index()}-of-{jax.process_count()}")

    def save(self, directory: epath.Path, args: "DataIteratorSave"):
        args.iterator.save_state(self._prefix(directory))

    def restore(self, directory: epath.Path, args: "DataIteratorRestore"):
        prefix = self._prefix(directory)
        if not any(directory.glob(os.path.basename(prefix) + "*")):
            saved = sorted(path.name for path in directory.iterdir())
            raise ProcessCountChangedError(f"{directory} holds no input position for this process ({prefix}); it "
                                           f"was written by a different number of processes: {saved[:4]}")
        args.iterator.restore_state(prefix)
        return args.iterator

    def metadata(self, directory: epath.Path):
        return None

    def finalize(self, directory: epath.Path):
        pass

    def close(self):
        pass


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    iterator: Any


class ProcessCountChangedError(RuntimeError):
    """The checkpoint's input positions were written by a different number of processes."""


class CheckpointMismatchError(ValueError):
    """A readable checkpoint whose arrays do not fit this config (another model size, optimizer, ...)."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint that read back with other values than were saved, or with non-finite ones."""


class CheckpointSaveError(RuntimeError):
    """A save that failed (a full disk, permissions, the store's error). Earlier checkpoints are intact."""


def _leaf_name(path) -> str:
    """'train_state.params.layer_0.attention.query.kernel' for any mix of dict, attribute and index keys."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
    return ".".join(parts)


def _shapes(tree) -> dict[str, tuple]:
    return {_leaf_name(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


# ---------------------------------------------------------------------------------------------------------------
# Integrity: every saved array's bits summed, each weighted by its odd position factor 2 * index + 1, in wrapping
# uint32 arithmetic. That is associative, so the sum comes out the same for any sharding, mesh or reduction order,
# and one pass over the state on its devices computes it. Any change to one element changes it (an odd factor is
# invertible modulo 2**32), and so does almost any reordering. A guard against damage, not a cryptographic hash.

def _bits(x):
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _leaf_summary(x):
    """[checksum, 1 if every value is finite else 0] of one array, as uint32."""
    position, stride = jnp.zeros(x.shape, jnp.uint32), 1  # each element's row-major index, modulo 2**32
    for axis in reversed(range(x.ndim)):
        position = position + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride % 2**32)
        stride *= x.shape[axis]
    checksum = jnp.sum(_bits(x) * (2 * position + 1), dtype=jnp.uint32)
    finite = jnp.isfinite(x).all() if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)
    return jnp.stack([checksum, finite.astype(jnp.uint32)])


# One program per distinct array (shape, dtype, sharding), not one for the whole state: a model's layers share their
# shapes. A 6-layer tiny state's first summaries took 1.3 s instead of 9.4 (2 layers: 0.9, 3.1) at -O0 on the 2-core
# machine, and states of other depths or runs reuse the programs (jit's cache, the persistent compilation cache).
_leaf_summary_program = jax.jit(_leaf_summary)


def summarize(tree) -> tuple[dict[str, int], list[str]]:
    """({array name: checksum}, [names of arrays holding a NaN or an infinity]) of a tree of arrays."""
    checksums, non_finite = {}, []
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    # One at a time: XLA:CPU deadlocked (its rendezvous timed out) with several of these sharded programs' all-reduces
    # in flight at once over 8 host devices; a few hundred waits cost milliseconds at a save.
    summaries = [jax.device_get(_leaf_summary_program(leaf)) for _, leaf in leaves]
    for (path, _), (checksum, finite) in zip(leaves, summaries):
        name = _leaf_name(path)
        checksums[name] = int(checksum)
        if not finite:
            non_finite.append(name)
    return checksums, non_finite


def _key_data_shape(impl) -> tuple:
    """The shape of a key's raw data under PRNG implementation `impl` (None: the default): (2,) or (4,)."""
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape)


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def tree_handler(**kwargs) -> ocp.PyTreeCheckpointHandler:
    """Orbax's PyTree handler, whose jax.Array handler splits the writing of a replicated array between its
    replicas except on the CPU. There every replica is the same host's memory, so splitting gains nothing, and it
    costs a small slicing program per array shape and device: 80 compiled at a tiny run's first save (12 of its 20 s
    on the 2-core machine), and a second at every later save."""
    def default(*kinds):
        return [(kind, ocp.type_handlers.get_type_handler(kind)) for kind in kinds]

    registry = ocp.type_handlers.create_type_handler_registry(  # orbax's default order, one handler replaced
        *default(int, float, bytes, np.number, np.ndarray),
        (jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=jax.default_backend() != "cpu",
                                                   array_metadata_store=array_metadata_store.Store())),
        *default(str, type(ocp.PLACEHOLDER)))
    return ocp.PyTreeCheckpointHandler(type_handler_registry=registry, **kwargs)


class Checkpointer:
    """The run's CheckpointManager: periodic asynchronous saves, retention, and the resume order."""

    def __init__(self, directory: str, *, every_steps: int, max_to_keep: int, keep_best: bool = False,
                 async_save: bool = True, compression: bool = False, checksums: bool = True):
        self.directory = directory
        self.every_steps = every_steps
        self.async_save = async_save
        self.checksums = checksums  # and the checks on restore; off only to measure their cost (benchmarks.checkpoint)
        self._saving = None  # the step of the asynchronous save in flight, until its outcome is known
        self.keep_verified = KeepStep()
        policies = [checkpoint_managers.LatestN(n=max_to_keep), self.keep_verified]
        if keep_best:
            # Lowest eval loss; checkpoints saved without an evaluation are kept by recency alone.
            policies.append(checkpoint_managers.BestN(get_metric_fn=lambda metrics: metrics["eval_loss"],
                                                      reverse=True, n=1, keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # a save killed half-way leaves a temporary directory: drop it
            create=True,
        )
        self.manager = ocp.CheckpointManager(
            epath.Path(directory), options=options,
            item_handlers={STATE_ITEM: tree_handler(use_compression=compression),
                           DATA_ITEM: DataIteratorHandler(),
                           INTEGRITY_ITEM: ocp.JsonCheckpointHandler(),
                           HEALTH_ITEM: ocp.JsonCheckpointHandler()})

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def protect(self, step: int | None) -> None:
        """Keeps checkpoint `step` whatever max_to_keep (from the next save's clean-up on); None keeps none."""
        self.keep_verified.step = step

    def should_save(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def save(self, step: int, state, rng: jax.Array, data_iterator, metrics: dict[str, float] | None = None,
             health: dict | None = None) -> float:
        """Saves (asynchronously: starts saving) and logs which; returns the seconds the caller was blocked (the
        whole write when synchronous; the host copy, and any previous save still in flight, when asynchronous).

        A state holding a NaN or an infinity is never saved (CheckpointSaveError). A save that fails raises
        CheckpointSaveError, here or, when asynchronous, from the next `check`, `wait` or `save`.
        """
        start = time.perf_counter()
        saved = {"train_state": state, "rng": jax.random.key_data(rng)}
        items = {STATE_ITEM: ocp.args.PyTreeSave(saved), DATA_ITEM: DataIteratorSave(data_iterator)}
        if health is not None:
            items[HEALTH_ITEM] = ocp.args.JsonSave(health)
        if self.checksums:
            checksums, non_finite = summarize(saved)
            if non_finite:
                raise CheckpointSaveError(f"refusing to save step {step}: the state holds NaN or infinite values in "
                                          f"{len(non_finite)} array(s), e.g. {non_finite[:3]}")
            items[INTEGRITY_ITEM] = ocp.args.JsonSave({"checksums": checksums})
        eval_loss = None  # what keep_best ranks: a task's held-out loss, or pretraining's MLM + NSP
        if metrics and "eval_loss" in metrics:
            eval_loss = {"eval_loss": float(metrics["eval_loss"])}
        elif metrics and "eval_mlm_loss" in metrics:
            eval_loss = {"eval_loss": float(metrics["eval_mlm_loss"] + metrics.get("eval_nsp_loss", 0.0))}
        self.wait()  # the previous save's outcome first: a failed one stops the run before another is started
        with self._reporting_save_errors(step):
            self.manager.save(step, args=ocp.args.Composite(**items), metrics=eval_loss, force=True)
        blocked = time.perf_counter() - start
        if self.async_save:
            self._saving = step
            logging.info("checkpoint: saving step %d to %s in the background (the loop waited %.3f s)", step,
                         self.directory, blocked)
        else:
            logging.info("checkpoint: saved step %d to %s in %.3f s (checkpoint.async_save=False)", step,
                         self.directory, blocked)
        return blocked

    @contextlib.contextmanager
    def _reporting_save_errors(self, step: int):
        try:
            yield
        except Exception as error:  # pylint: disable=broad-except  # whatever the store raised, named once
            self._saving = None
            last = self.manager.latest_step()
            kept = (f"the last complete checkpoint, step {last}, is intact: fix the cause and rerun to resume from "
                    "it" if last is not None and last != step else "fix the cause and rerun")
            cause = " ".join(f"{type(error).__name__}: {error}".split())
            raise CheckpointSaveError(f"saving checkpoint step {step} to {epath.Path(self.directory) / str(step)} "
                                      f"failed ({cause[:600]}); {kept}") from error

    def check(self) -> None:
        """Raises CheckpointSaveError if the save in flight has failed; returns at once otherwise (every step)."""
        if self._saving is not None and not self.manager.is_saving_in_progress():
            self.wait()

    def wait(self) -> None:
        """Waits for the save in flight; raises CheckpointSaveError if it failed."""
        if self._saving is None:
            return
        with self._reporting_save_errors(self._saving):
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
        self._saving = None

    def close(self) -> None:
        """Waits for the save in flight (raising CheckpointSaveError if it failed), then releases the manager."""
        try:
            self.wait()
        except CheckpointSaveError:
            with contextlib.suppress(Exception):  # the failure is already being reported
                self.manager.close()
            raise
        self.manager.close()

    def _check_fits(self, step: int, target) -> None:
        """Raises CheckpointMismatchError, naming an array, if the checkpoint was written for another config.

        Only a checkpoint whose metadata is readable gets here, so a mismatch is a config change, not damage: the
        run stops rather than skipping (and setting aside) every checkpoint of the workdir.
        """
        saved = _shapes(self.manager.item_metadata(step)[STATE_ITEM])
        wanted = _shapes(target)
        where = str(epath.Path(self.directory) / str(step))
        fix = ("use the config the checkpoint was written with, or a new --workdir (--config.init=" + where +
               " starts a new run from its parameters)")
        missing, extra = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
        if missing or extra:
            raise CheckpointMismatchError(f"checkpoint {where} does not fit this config: it lacks {missing[:3]} "
                                          f"and has {extra[:3]} that this config does not (a different optimizer "
                                          f"or model?); {fix}")
        if saved.get("rng") != wanted.get("rng"):
            raise CheckpointMismatchError(f"checkpoint {where} does not fit this config: its dropout key has shape "
                                          f"{saved.get('rng')} where this config's train.dropout_rng has "
                                          f"{wanted.get('rng')}; resume with the train.dropout_rng it was written "
                                          "with (threefry keys have 2 words, rbg and unsafe_rbg keys 4)")
        for name, shape in wanted.items():
            if saved[name] != shape:
                raise CheckpointMismatchError(f"checkpoint {where} does not fit this config: {name} has shape "
                                              f"{saved[name]} there but {shape} here (check --config.model.*); "
                                              f"{fix}")

    def _restore_step(self, step: int, abstract_state, state_shardings, rng_sharding, data_iterator, rng_impl):
        target = {"train_state": _abstract(abstract_state, state_shardings),
                  "rng": jax.ShapeDtypeStruct(_key_data_shape(rng_impl), np.uint32, sharding=rng_sharding)}
        items = {STATE_ITEM: ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target))}
        if data_iterator is not None:
            items[DATA_ITEM] = DataIteratorRestore(data_iterator)
        recorded = (epath.Path(self.directory) / str(step) / INTEGRITY_ITEM).exists()
        if recorded:
            items[INTEGRITY_ITEM] = ocp.args.JsonRestore()
        has_health = (epath.Path(self.directory) / str(step) / HEALTH_ITEM).exists()
        if has_health:
            items[HEALTH_ITEM] = ocp.args.JsonRestore()
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        state = restored[STATE_ITEM]
        if self.checksums:
            self._verify(step, state, restored[INTEGRITY_ITEM]["checksums"] if recorded else None)
        return (state["train_state"], jax.random.wrap_key_data(state["rng"], impl=rng_impl),
                restored[HEALTH_ITEM] if has_health else None)

    def read_health(self, step: int) -> dict | None:
        """Checkpoint `step`'s health record (bert_jax.divergence.Health as JSON), None if it has none."""
        if not (epath.Path(self.directory) / str(step) / HEALTH_ITEM).exists():
            return None
        return self.manager.restore(step, args=ocp.args.Composite(**{HEALTH_ITEM: ocp.args.JsonRestore()}))[
            HEALTH_ITEM]

    def _verify(self, step: int, state, recorded: dict[str, int] | None) -> None:
        """Raises CorruptCheckpointError unless the restored arrays are finite and have the checksums they were
        saved with (checkpoints written without checksums are checked for finite values only)."""
        checksums, non_finite = summarize(state)
        if non_finite:
            raise CorruptCheckpointError(f"NaN or infinite values in {len(non_finite)} array(s), e.g. "
                                         f"{non_finite[:3]}")
        if recorded is None:
            logging.warning("checkpoint %s has no checksums (written by an older bert_jax): its values are checked "
                            "for NaNs only", epath.Path(self.directory) / str(step))
            return
        changed = sorted(name for name in checksums.keys() | recorded.keys()
                         if checksums.get(name) != recorded.get(name))
        if changed:
            raise CorruptCheckpointError(f"{len(changed)} array(s) read back with other values than were saved "
                                         f"(checksum mismatch), e.g. {changed[:3]}")

    def restore_latest(self, abstract_state, state_shardings, rng_sharding, data_iterator, rng_impl=None):
        """(step, state, rng, health record or None) of the newest checkpoint that restores, or None. A corrupt one
        (unreadable, partial, failing its checksums, or holding non-finite values) is moved aside and the one before
        is tried. `rng_impl`: the PRNG implementation of the saved dropout key (None: JAX's default)."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                self._check_fits(step, {"train_state": abstract_state,
                                        "rng": jax.ShapeDtypeStruct(_key_data_shape(rng_impl), np.uint32)})
                try:
                    result = self._restore_step(step, abstract_state, state_shardings, rng_sharding, data_iterator,
                                                rng_impl)
                except ProcessCountChangedError as changed:
                    # Parameters and optimizer state are fine; only the input position cannot be carried over.
                    logging.warning("%s; the input pipeline starts a new stream (seed train.seed + step)", changed)
                    result = self._restore_step(step, abstract_state, state_shardings, rng_sharding, None, rng_impl)
                error = None
            except CheckpointMismatchError:
                raise
            except Exception as exception:  # pylint: disable=broad-except  # any unreadable file means: skip it
                result, error = None, exception
            if sharding_lib.all_processes_agree(error is None):
                return step, *result
            target = self.set_aside(step, "corrupt")
            logging.warning("checkpoint %s is corrupt or partial (%s: %s); skipping it (moved to %s) and trying the "
                            "one before", epath.Path(self.directory) / str(step),
                            type(error).__name__ if error else "unreadable on another process",
                            str(error)[:300] if error else "", target)
        return None

    def set_aside(self, step: int, suffix: str) -> epath.Path:
        """Renames checkpoint `step` to STEP.SUFFIX (kept, never deleted: `corrupt`, `diverged`, `rewound`) so that
        no run restores it; returns the new path. Every process calls it."""
        path = epath.Path(self.directory) / str(step)
        target = path.parent / f"{step}.{suffix}"
        if target.exists():
            target = path.parent / f"{step}.{suffix}-{int(time.time())}"
        if jax.process_index() == 0 and path.exists():
            path.rename(target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"bert_jax_set_aside_{step}_{suffix}")
        self.manager.reload()
        return target


def step_directory(path: str) -> epath.Path | None:
    """The step directory `path` names (itself, or a checkpoints directory's latest step); None if neither."""
    directory = epath.Path(path)
    if (directory / STATE_ITEM).exists():
        return directory
    if not directory.is_dir():
        return None
    steps = [int(child.name) for child in directory.iterdir() if child.name.isdigit()
             and (child / STATE_ITEM).exists()]
    return directory / str(max(steps)) if steps else None


def is_checkpoint(path: str) -> bool:
    """True for one of our checkpoints: a step directory or a checkpoints directory with at least one step."""
    return step_directory(path) is not None


def state_metadata(path: str) -> dict:
    """The saved train state's tree of array metadata (shape, dtype, sharding), no array read: {"train_state":
    {"params": ..., "opt_state": ...}, "rng": ...}. `path` is a step directory or a checkpoints directory (its
    latest step).

    Read through the item's handler. `PyTreeCheckpointer().metadata(STEP/state)` also looks for the step's own
    metadata file inside the item directory, where Orbax never writes it, and warns "Metadata file does not exist"
    on every call.
    """
    directory = step_directory(path)
    if directory is None:
        raise FileNotFoundError(f"{path} is neither a checkpoint step directory (no '{STATE_ITEM}' inside) nor "
                                "a checkpoints directory with numbered steps")
    handler = ocp.PyTreeCheckpointHandler()
    try:
        return handler.metadata(directory / STATE_ITEM).tree
    finally:
        handler.close()


def restore_params(path: str, abstract_params, params_shardings):
    """Parameters only from a checkpoint of any run (optimizer state and input position are not read).

    `path` is a step directory (.../checkpoints/1000) or a checkpoints directory (its latest step is used).
    """
    if not epath.Path(path).exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist; give a step directory (.../checkpoints/1000) "
                                "or a checkpoints directory")
    directory = step_directory(path)
    if directory is None:
        raise FileNotFoundError(f"{path} is neither a checkpoint step directory (no '{STATE_ITEM}' inside) nor "
                                "a checkpoints directory with numbered steps")
    target = {"train_state": {"params": _abstract(abstract_params, params_shardings)}}
    restore_args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), target)
    checkpointer = ocp.PyTreeCheckpointer()
    restored = checkpointer.restore(directory / STATE_ITEM, args=ocp.args.PyTreeRestore(
        item=target, restore_args=restore_args, partial_restore=True))
    logging.info("read parameters from %s", directory)
    return restored["train_state"]["params"], str(directory)


def save_params(directory: str, params) -> None:
    """Writes `params` (sharded arrays; every process calls it) as `directory`/state in a checkpoint step's layout, so
    that restore_params and --config.init read it back onto any mesh. Replaces what was there."""
    with ocp.Checkpointer(tree_handler()) as saver:
        saver.save(epath.Path(directory) / STATE_ITEM, args=ocp.args.PyTreeSave({"train_state": {"params": params}}),
                   force=True)


class PreemptionWatcher:
    """Tells the loop when to save and stop: on SIGTERM (what schedulers, `kill` and TPU VM preemption send).

    With several processes, JAX's preemption service (started by jax.distributed) catches the signal on any host
    and picks one step at which every process stops, so all of them save the same step. In a single process a
    SIGTERM handler sets a flag the loop reads after each step. Further signals while stopping are ignored.
    """

    def __init__(self):
        self._multi_process = jax.process_count() > 1
        self._signals = 0
        self._previous = None
        if not self._multi_process and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):  # pylint: disable=unused-argument
        self._signals += 1

    def should_stop(self, step: int) -> bool:
        if self._multi_process:
            try:
                return multihost_utils.reached_preemption_sync_point(step)
            except RuntimeError:  # the preemption service is disabled (jax_enable_preemption_service=False)
                return False
        return self._signals > 0

    def close(self) -> None:
        if self._previous is not None:
            if self._signals > 1:
                logging.warning("%d further SIGTERMs arrived while stopping; ignored", self._signals - 1)
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
