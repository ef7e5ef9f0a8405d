"""The one training loop every job runs (pretraining and fine-tuning), and where a run starts from.

`train(job, setup, options, workdir)` starts from the workdir's newest checkpoint (else the job's fresh state:
--config.init or scratch), then runs steps to `job.num_steps` with one in flight: each step is judged by the next
step's metrics read (bert_jax.divergence), log lines carry the window's mean metrics, the throughput and any held-out
scores due, checkpoints are saved (asynchronously) once their loss is known to be healthy, a diverged step rewinds to
the newest verified checkpoint (checkpoint.max_rewinds) or stops naming it, SIGTERM saves and stops, and the profiler
traces the steps asked for.

Everything a job adds comes through one interface, the `Job` it is given, which jobs subclass: what it trains
(num_steps, train_step, its training input from the start, the fresh state of a run with no checkpoint), its held-out
evaluation, its throughput figures, its log line, how its input starts again, and optionally a hook on the state the
run starts from and a judgement of the parameters after the last step. The loop never asks which job it runs.

`options` is the config the loop reads, the same sections in every recipe: `checkpoint` (every_steps, max_to_keep,
keep_best, async_save, compression, restore_step, skip_batches, max_rewinds, rewind_skip_batches) and `train` (seed,
log_every, spike_factor, spike_window, profile_start_step, profile_steps, dropout_rng), plus `init` for the log line
of a fresh start.
"""

import abc
import contextlib
import dataclasses
import time
from typing import Callable, Iterator

from absl import logging
from etils import epath
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import divergence
from bert_jax import fileio
from bert_jax import metrics as metrics_lib
from bert_jax import sharding as sharding_lib
from bert_jax.train import Setup, TrainState, dropout_key


class Job(abc.ABC):
    """Everything a job gives the loop. A base class rather than a Protocol: the optional hooks' defaults are
    written once, here, and a job that lacks a required method fails when it is built, naming it."""

    num_steps: int  # the step the run trains to
    train_step: Callable  # setup's jitted step: (state, batch, rng) -> (state, metrics)

    @abc.abstractmethod
    def batches(self) -> Iterator:
        """The training input from its start (on resume, the checkpoint's position replaces its own)."""

    @abc.abstractmethod
    def fresh_state(self) -> TrainState:
        """The state of a run with no checkpoint (--config.init or scratch)."""

    @abc.abstractmethod
    def eval_due(self, step: int) -> bool:
        """Whether step `step` ends with a held-out evaluation (and so a log line)."""

    @abc.abstractmethod
    def evaluate(self, params) -> dict[str, float]:
        """Held-out scores of `params`, named eval_*."""

    @abc.abstractmethod
    def rates(self, steps_per_second: float) -> dict[str, float]:
        """Throughput scalars for a log line."""

    @abc.abstractmethod
    def log_line(self, step: int, num_steps: int, scalars: dict[str, float], steps_per_second: float) -> str:
        """The text of a log line."""

    @abc.abstractmethod
    def restart_input(self, step: int) -> Iterator:
        """The training input for a run restored at `step` from a checkpoint that holds no input position for this
        number of processes: a stream the run has not just seen."""

    def on_start(self, state: TrainState) -> None:
        """Called with the state the run starts from (restored or fresh); by default nothing."""

    def final_problem(self, params, batches: Iterator) -> str | None:
        """None when the parameters after the last step are healthy on the next batch of `batches`, else the problem
        in words (the last checkpoint is then set aside and DivergenceError names the newest verified one). By
        default None: they go unjudged, and the last checkpoint unverified until a later run steps from it."""
        del params, batches
        return None


@dataclasses.dataclass
class TrainResult:
    metrics: dict[str, float]  # the last log line's, with "step" (empty when there was nothing to train)
    preempted_at_step: int | None = None  # SIGTERM stopped the run after saving a checkpoint of this step


@dataclasses.dataclass
class _Start:
    """What the loop starts from (see `_start`)."""
    state: TrainState
    step_rng: jax.Array
    batches: Iterator  # the training input, at the position the state was saved with
    health: divergence.Health  # the checkpoint's record, with a rewind that checkpoint.restore_step asks for added
    position: int  # the input position the checkpoint holds (before any skip; 0 from scratch)


def checkpointer(options, workdir: str) -> checkpoint_lib.Checkpointer:
    """The run's Checkpointer in WORKDIR/checkpoints, as options.checkpoint sets it."""
    ckpt = options.checkpoint
    return checkpoint_lib.Checkpointer(fileio.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR),
                                       every_steps=ckpt.every_steps, max_to_keep=ckpt.max_to_keep,
                                       keep_best=ckpt.keep_best, async_save=ckpt.async_save,
                                       compression=ckpt.compression)


def train(job: Job, setup: Setup, options, workdir: str) -> tuple[TrainResult, TrainState, Iterator]:
    """Runs (or resumes) `job` to step `job.num_steps`; returns (its result, the final state, the training input).

    `options`: the config sections the loop reads (see the module docstring). Call under
    `jax.set_mesh(setup.mesh)`. On SIGTERM it saves a checkpoint at the current step and returns early
    (TrainResult.preempted_at_step); a run that reaches its last step ends with `job.final_problem`'s judgement.
    """
    saver = checkpointer(options, workdir)
    try:
        start = _start(job, setup, options, saver)
        job.on_start(start.state)
        if int(start.state.step) >= job.num_steps:
            logging.warning("the checkpoint is already at step %d of train.num_steps=%d: nothing to train (raise "
                            "--config.train.num_steps to train on)", int(start.state.step), job.num_steps)
        loop = _Loop(job, setup, options, saver, start, workdir)
        try:
            result = loop.run()
        finally:
            loop.preemption.close()
            loop.writer.close()
        if result.preempted_at_step in (None, job.num_steps):
            loop.judge_final()
    except BaseException:
        with contextlib.suppress(Exception):  # a save in flight completes before the error is raised
            saver.close()
        raise
    saver.close()
    return result, loop.state, loop.batches


def _restore_latest(saver, setup: Setup, batches, rng):
    """(step, state, dropout key, divergence.Health) of the newest checkpoint that restores whole, its input
    position restored into `batches` in place; None when none does. Starting and rewinding both restore this way."""
    restored = saver.restore_latest(setup.abstract, setup.shardings, NamedSharding(setup.mesh, PartitionSpec()),
                                    batches, rng_impl=jax.random.key_impl(rng))
    if restored is None:
        return None
    step, state, rng, record = restored
    return step, state, rng, divergence.Health.from_json(record)


def _log_resumed(saver, step: int, batches) -> None:
    logging.info("resumed from %s at step %d (input position: batch %d)",
                 fileio.join(saver.directory, str(step)), step, batches.position)


def _start(job: Job, setup: Setup, options, saver) -> _Start:
    """The state, RNG and input to start from; see bert_jax/checkpoint.py for the order."""
    train, ckpt = options.train, options.checkpoint
    step_rng = dropout_key(train.seed, train.dropout_rng, jax.devices()[0].platform)
    batches = job.batches()
    rewind = bool(ckpt.restore_step) and _rewind_on_request(saver, ckpt.restore_step, ckpt.skip_batches)
    restored = _restore_latest(saver, setup, batches, step_rng)
    if restored is None:
        logging.info("no checkpoint in %s: starting %s", saver.directory,
                     f"from --config.init={options.init}" if options.init else f"from scratch (seed {train.seed})")
        return _Start(job.fresh_state(), step_rng, batches, divergence.Health(), 0)
    step, state, step_rng, health = restored
    if batches.position == 0 and step > 0:
        # The input position was not restored (another process count): a stream the run has not just seen rather
        # than a replay of its first batches.
        batches = job.restart_input(step)
    position = batches.position
    if rewind:
        if step != ckpt.restore_step:
            raise ValueError(f"--config.checkpoint.restore_step={ckpt.restore_step}: that checkpoint could not "
                             "be restored (set aside as corrupt, see the warning above); name another step")
        _skip_batches(batches, ckpt.skip_batches, "--config.checkpoint.skip_batches")
        health.rewinds.append({"step": step, "skip_batches": ckpt.skip_batches, "automatic": False})
    _log_resumed(saver, step, batches)
    return _Start(state, step_rng, batches, health, position)


def _rewind_on_request(saver, step: int, skip_batches: int) -> bool:
    """checkpoint.restore_step: sets aside the checkpoints newer than `step` (as STEP.rewound) so that the run
    resumes from it; True. False when this run's lineage has already done so (the newest checkpoint records the
    rewind): rerunning the same command after a preemption resumes from the newest checkpoint, skipping nothing."""
    steps = saver.all_steps()
    for newest in reversed(steps):
        try:
            record = saver.read_health(newest)
        except Exception:  # pylint: disable=broad-except  # a damaged one: the restore below sets it aside
            continue
        if divergence.Health.from_json(record).has_rewind(step, skip_batches):
            logging.info("--config.checkpoint.restore_step=%d (skip_batches=%d) is already in effect: checkpoint %d "
                         "was written after that rewind; resuming from the newest checkpoint", step, skip_batches,
                         newest)
            return False
        break
    if step not in steps:
        directory = epath.Path(saver.directory)
        aside = sorted(path.name for path in directory.glob(f"{step}.*")) if directory.exists() else []
        raise ValueError(f"--config.checkpoint.restore_step={step}: {directory} has no checkpoint of step {step} "
                         f"(it has steps {steps}" + (f"; set aside: {aside}, rename one back to {step} to use it"
                                                      if aside else "") + ")")
    for newer in (newer for newer in steps if newer > step):
        target = saver.set_aside(newer, "rewound")
        logging.warning("--config.checkpoint.restore_step=%d: checkpoint %d moved aside to %s", step, newer, target)
    return True


def _skip_batches(batches, count: int, field: str) -> None:
    """Advances the input by `count` batches (read and dropped): nothing else changes."""
    for skipped in range(count):
        if next(batches, None) is None:
            raise ValueError(f"{field}={count}: the training input ended after {skipped} skipped batches")
    if count:
        logging.info("skipped %d batches of input (%s); the input position is now batch %d", count, field,
                     batches.position)


class _Profiler:
    """A profiler trace of steps [start, start + num_steps) into WORKDIR/profile (TensorBoard's profile tab)."""

    def __init__(self, workdir: str, start: int, num_steps: int):
        self.directory = fileio.join(workdir, "profile")
        self.start, self.stop = start, start + num_steps - 1
        self.active = False

    def before_step(self, step: int) -> None:
        if self.start > 0 and step == self.start:
            jax.profiler.start_trace(self.directory)
            self.active = True

    def after_step(self, step: int, outputs) -> None:
        if self.active and step >= self.stop:
            jax.block_until_ready(outputs)
            jax.profiler.stop_trace()
            self.active = False
            logging.info("profiler trace of steps %d-%d written to %s", self.start, step, self.directory)


class _Window:
    """The host metrics of the steps since the last log line, and their rate. The first step after a (re)start
    compiles: it is judged at once and the clock starts at its end."""

    def __init__(self):
        self.metrics: list[dict[str, float]] = []
        self.timed_steps, self.start = 0, None

    def summary(self) -> tuple[dict[str, float], float]:
        """(the mean of each metric, steps per second: 0.0 when no step was timed)."""
        steps_per_second = self.timed_steps / (time.perf_counter() - self.start) if self.timed_steps else 0.0
        return {k: float(np.mean([m[k] for m in self.metrics])) for k in self.metrics[0]}, steps_per_second

    def restart(self) -> None:
        self.metrics, self.timed_steps, self.start = [], 0, time.perf_counter()


class _Lineage:
    """The input positions and judgements the loop keeps for its checkpoints: which checkpoints' parameters the next
    healthy step verifies, the input position each checkpoint holds, and the position each recent step was fed (for
    a step that diverges: how far to skip)."""

    def __init__(self, step: int, position: int, saved: bool):
        self.unjudged = {step} if saved else set()  # the checkpoint started from, if saved, and those saved since
        self.positions = {step: position}  # checkpoint step -> the input position it holds
        self.fed: dict[int, int] = {}  # step -> the input position of its batch, for the steps not yet judged

    def feed(self, step: int, position: int) -> None:
        """Step `step` is fed the batch at input `position`."""
        self.fed[step] = position
        self.fed.pop(step - 3, None)  # judged by now: only the steps not yet judged need theirs

    def judged_healthy(self, step: int) -> bool:
        """Step `step` was healthy: True when that verifies checkpoint step-1, whose parameters it started from."""
        if step - 1 not in self.unjudged:
            return False
        self.unjudged.discard(step - 1)
        return True

    def saved(self, step: int, position: int) -> None:
        self.unjudged.add(step)
        self.positions[step] = position

    def restored(self, step: int, position: int) -> None:
        """Rewound to checkpoint `step`, which holds input `position`: the checkpoints after it are gone."""
        self.positions[step] = position
        self.unjudged = {step}


class _Loop:
    """The training loop: one step in flight, each judged by the next step's metrics read (bert_jax.divergence),
    log lines with evaluations, checkpoints saved once their loss is known to be healthy, SIGTERM, rewinds."""

    def __init__(self, job: Job, setup: Setup, options, saver, start: _Start, workdir: str):
        train = options.train
        self.job, self.setup, self.options, self.checkpointer, self.workdir = job, setup, options, saver, workdir
        self.num_steps, self.train_step = job.num_steps, job.train_step
        self.state, self.rng, self.batches = start.state, start.step_rng, start.batches
        self.batch_sharding = setup.batch_sharding
        # Steps after the one resumed from are logged again: their records from an interrupted run go.
        self.writer = metrics_lib.MetricWriter(workdir, resume_step=int(self.state.step))
        self.preemption = checkpoint_lib.PreemptionWatcher()
        self.profiler = _Profiler(workdir, train.profile_start_step, train.profile_steps)
        self.monitor = divergence.Monitor(train.spike_factor, train.spike_window, start.health)
        saver.protect(self.monitor.newest_verified(saver.all_steps()))
        step = int(self.state.step)
        self.lineage = _Lineage(step, start.position, saved=step in saver.all_steps())
        self.last_logged: dict[str, float] = {}

    def run(self) -> TrainResult:
        while True:
            try:
                return self._train()
            except divergence.Diverged as diverged:
                self._rewind(diverged)

    def _train(self) -> TrainResult:
        train = self.options.train
        window, pending = _Window(), None  # pending: (step, device metrics) of the step before the one in flight
        for step in range(int(self.state.step) + 1, self.num_steps + 1):
            metrics = self._step(step)
            # Reading the previous step's metrics keeps one step in flight while still naming a bad step exactly.
            if pending is not None:
                self._judge(*pending, window)
            pending = (step, metrics)
            if window.start is None:
                self._judge(*pending, window)
                pending = None
                window.start = time.perf_counter()
            else:
                window.timed_steps += 1
            stop = self.preemption.should_stop(step)
            last = step == self.num_steps
            save = self.checkpointer.should_save(step) or last or stop
            evaluate = self.job.eval_due(step)
            log = step % train.log_every == 0 or last or stop or evaluate
            if (save or log) and pending is not None:  # a state is saved only once its loss is known to be healthy
                self._judge(*pending, window)
                pending = None
            scalars = self._log(step, window, evaluate) if log else None
            if save:
                self._save(step, scalars)
            if stop:
                self.checkpointer.wait()
                logging.warning("SIGTERM received: saved a checkpoint at step %d in %s; stopping. Run the same "
                                "command again to resume.", step, self.checkpointer.directory)
                return TrainResult(self.last_logged, preempted_at_step=step)
        return TrainResult(self.last_logged)

    def _step(self, step: int):
        """Dispatches step `step`; returns its metrics, still on the devices."""
        self.profiler.before_step(step)
        self.lineage.feed(step, self.batches.position)
        batch = sharding_lib.make_global_batch(next(self.batches), self.batch_sharding)
        self.state, metrics = self.train_step(self.state, batch, self.rng)
        self.checkpointer.check()  # a background save that failed stops the run now, not at the next save
        self.profiler.after_step(step, metrics)
        return metrics

    def _judge(self, step: int, device_metrics, window: _Window) -> None:
        """Raises divergence.Diverged if step `step` diverged; else verifies the checkpoint it started from."""
        host = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
        self.monitor.check(step, host)
        if self.lineage.judged_healthy(step):
            self.monitor.verify(step - 1)
            self.checkpointer.protect(step - 1)
        del host["params_finite"]
        window.metrics.append(host)

    def _log(self, step: int, window: _Window, evaluate: bool) -> dict[str, float]:
        """The log line of the steps in `window` (plus the job's evaluation when one is due): logged and written."""
        scalars, steps_per_second = window.summary()
        if steps_per_second:
            scalars.update(self.job.rates(steps_per_second))
        if evaluate:
            scalars.update(self.job.evaluate(self.state.params))
        logging.info("%s", self.job.log_line(step, self.num_steps, scalars, steps_per_second))
        self.writer.write(step, scalars)
        self.last_logged = dict(scalars, step=step)
        window.restart()  # after the evaluation: it is not training time
        return scalars

    def _save(self, step: int, scalars: dict[str, float] | None) -> None:
        self.checkpointer.save(step, self.state, self.rng, self.batches, metrics=scalars,
                               health=self.monitor.record(self.checkpointer.all_steps()))  # logs how it saved
        self.lineage.saved(step, self.batches.position)

    def judge_final(self) -> None:
        """Raises DivergenceError, the last checkpoint set aside, unless the job's final_problem finds the
        parameters after the last step healthy."""
        step = int(self.state.step)
        problem = self.job.final_problem(self.state.params, self.batches)
        if problem is None:
            return
        self.checkpointer.wait()
        aside = ""
        if step in self.checkpointer.all_steps() and step not in self.monitor.health.verified:
            target = self.checkpointer.set_aside(step, "diverged")
            aside = f" Checkpoint {step}, which holds them, is set aside as {target}."
        existing = self.checkpointer.all_steps()
        # As for a step that diverged: the batch that judged them is the one to get past.
        raise divergence.DivergenceError(_stopped_message(
            f"the parameters after step {step} {problem} on the next training batch; not saved", step + 1,
            self.batches.position - 1, self.options.checkpoint, self.checkpointer.directory, existing,
            self.monitor.newest_verified(existing), self.lineage.positions, aside))

    def _rewind(self, diverged: divergence.Diverged) -> None:
        """Goes on from the newest verified checkpoint past the input that diverged, or raises DivergenceError."""
        self.state, self.rng, self.monitor = _rewind_after(
            diverged, self.setup, self.options.checkpoint, self.checkpointer, self.monitor, self.rng, self.batches,
            self.lineage)
        self.writer.close()  # its records after the step rewound to go
        self.writer = metrics_lib.MetricWriter(self.workdir, resume_step=int(self.state.step))


def _batches_to_skip(diverged_step: int, diverged_position: int | None, step: int, position: int | None) -> int:
    """Batches to skip after restoring checkpoint `step` (holding input `position`) to be past the batch step
    `diverged_step` was fed (at input `diverged_position`)."""
    if position is None or diverged_position is None:
        return diverged_step - step  # one batch per step since that checkpoint
    return diverged_position + 1 - position


def _rewind_after(diverged: divergence.Diverged, setup: Setup, ckpt, saver, monitor, rng, train_batches,
                  lineage: _Lineage):
    """After step S diverged: checkpoint S-1, whose parameters S started from, is set aside as diverged; then,
    while checkpoint.max_rewinds allows, the newest verified checkpoint is restored and
    checkpoint.rewind_skip_batches of input skipped (returns (state, rng, monitor) to go on from, the input advanced
    in place, `lineage` restarted there); otherwise DivergenceError names the checkpoint to resume from."""
    diverged_position = lineage.fed.get(diverged.step)
    saver.wait()  # a save in flight completes: the checkpoints left stay whole
    existing = saver.all_steps()
    aside = ""
    if diverged.step - 1 in existing and diverged.step - 1 not in monitor.health.verified:
        target = saver.set_aside(diverged.step - 1, "diverged")
        aside = (f" Checkpoint {diverged.step - 1}, whose parameters that step started from, is set aside as "
                 f"{target}.")
        existing = saver.all_steps()
    verified = monitor.newest_verified(existing)
    rewinds = monitor.health.automatic_rewinds()
    if verified is not None and rewinds < ckpt.max_rewinds:
        logging.warning("%s; stopped without saving it.%s Rewinding to checkpoint %d, the newest verified one, and "
                        "skipping the input through the batch that diverged, plus checkpoint.rewind_skip_batches=%d "
                        "(automatic rewind %d of checkpoint.max_rewinds=%d)", diverged, aside, verified,
                        ckpt.rewind_skip_batches, rewinds + 1, ckpt.max_rewinds)
        for newer in (newer for newer in existing if newer > verified):  # never judged: a restart must not use them
            saver.set_aside(newer, "rewound")
        restored = _restore_latest(saver, setup, train_batches, rng)
        if restored is None:
            raise divergence.DivergenceError(f"no checkpoint in {saver.directory} could be restored to rewind "
                                             "to (see the warnings above): rerun to start again")
        step, state, rng, health = restored
        lineage.restored(step, train_batches.position)
        # Past the batch that diverged: from the same parameters, with the same dropout, it would diverge again.
        skip = _batches_to_skip(diverged.step, diverged_position, step, train_batches.position)
        skip += ckpt.rewind_skip_batches
        # The lineage this process knows (which may hold rewinds since that checkpoint was saved), plus this one.
        health.rewinds = [*monitor.health.rewinds, {"step": step, "skip_batches": skip, "automatic": True}]
        health.verified = sorted({*health.verified, *(s for s in monitor.health.verified if s <= step), step})
        _skip_batches(train_batches, skip, "--config.checkpoint.rewind_skip_batches")
        _log_resumed(saver, step, train_batches)
        return state, rng, divergence.Monitor(monitor.spike_factor, monitor.spike_window, health)
    raise divergence.DivergenceError(_stopped_message(f"{diverged}; stopped without saving it", diverged.step,
                                                      diverged_position, ckpt, saver.directory, existing, verified,
                                                      lineage.positions, aside))


def _stopped_message(what: str, diverged_step: int, diverged_position: int | None, ckpt, directory, existing,
                     verified, positions, aside) -> str:
    """What a diverged run that stops says: the checkpoint to resume from, and how to get past the bad data."""
    past = "--config.checkpoint.restore_step=STEP --config.checkpoint.skip_batches=K"
    if verified is not None:
        past = (f"--config.checkpoint.restore_step={verified} --config.checkpoint.skip_batches="
                f"{_batches_to_skip(diverged_step, diverged_position, verified, positions.get(verified))}")
    fix = "with a lower --config.optim.learning_rate (or stronger clipping, --config.optim.max_grad_norm)"
    if existing:
        fix += f", or past the data that diverged ({past}; or automatically: --config.checkpoint.max_rewinds=N)"
    if verified is not None:
        how = (f"The newest checkpoint whose parameters gave a healthy next step is step {verified} in "
               f"{directory}: rerun to resume from it" if verified == existing[-1] else
               f"The newest checkpoint whose parameters gave a healthy next step is step {verified} in "
               f"{directory}: rerun with --config.checkpoint.restore_step={verified} to resume from it")
    elif existing:
        how = (f"No checkpoint left was verified by a healthy next step; the newest is step {existing[-1]} in "
               f"{directory}: rerun to resume from it")
    else:
        how = "No checkpoint is left to resume from: rerun to start again"
    if verified is not None and ckpt.max_rewinds:
        how = f"checkpoint.max_rewinds={ckpt.max_rewinds} automatic rewinds are used up. " + how
    return f"{what}.{aside} {how}, {fix}"
