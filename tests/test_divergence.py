"""Divergence: checkpoints judged by the loss their parameters give, spikes, retention of the verified checkpoint,
rewinds (by hand and automatic) and skipped input; fine-tuning's saved parameters likewise."""

import copy
import json
import logging
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import divergence
from bert_jax.data import sources
from tests import helpers


def _config(num_steps, dropout=False, **train_overrides):
    """One encoder layer on 8 devices, a log line and a synchronous checkpoint every step."""
    train_overrides.setdefault("log_every", 1)
    config = helpers.tiny_config((-1, 1, 1), dropout=dropout, num_steps=num_steps, **train_overrides)
    config.model.num_layers = 1
    config.checkpoint.every_steps = 1
    config.checkpoint.async_save = False
    return config


def _steps(directory):
    return sorted(int(path.name) for path in directory.iterdir() if path.name.isdigit())


def _losses(workdir):
    return {line["step"]: line["loss"] for line in map(json.loads, open(workdir / "metrics.jsonl", encoding="utf-8"))}


def _health(directory, step):
    return json.load(open(directory / str(step) / checkpoint_lib.HEALTH_ITEM / "metadata", encoding="utf-8"))


class _Batches:
    """The pipeline's training iterator with a hook on each batch by input position (save/restore delegated)."""

    def __init__(self, inner, change):
        self.inner, self.change = inner, change

    @property
    def position(self):
        return self.inner.position

    def __iter__(self):
        return self

    def __next__(self):
        return self.change(self.inner)

    def save_state(self, path):
        self.inner.save_state(path)

    def restore_state(self, path):
        self.inner.restore_state(path)


def _wrap_training_input(monkeypatch, change):
    """Hooks the training iterator the driver reads, of either source (bert_jax.data.sources)."""
    real = sources.make_iterator

    def make_iterator(*args, **kwargs):
        batches = real(*args, **kwargs)
        return _Batches(batches, change) if kwargs.get("split") == "train" else batches

    monkeypatch.setattr(sources, "make_iterator", make_iterator)


def _poison(positions):
    """A hook that gives the batches at `positions` NaN weights: the step fed one goes non-finite."""
    def change(inner):
        position = inner.position
        batch = next(inner)
        if position in positions:
            batch = dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"], np.nan))
        return batch
    return change


def test_a_non_finite_step_stops_the_run_naming_the_step(tmp_path, monkeypatch):
    """Named exactly although the loop reads each step's metrics one step late; with no checkpoint, none named."""
    config = _config(num_steps=6, log_every=2)
    config.checkpoint.every_steps = 0
    _wrap_training_input(monkeypatch, _poison({3}))  # the 4th batch feeds step 4
    with pytest.raises(divergence.DivergenceError, match=r"^step 4 went non-finite \(loss, gradient norm, parameters; "
                                                         r"loss nan, gradient norm nan\); stopped without saving it. "
                                                         r"No checkpoint is left to resume from: rerun to start "
                                                         r"again, with a lower --config.optim.learning_rate"):
        helpers.run_pretraining(config, str(tmp_path))


def test_the_checkpoint_a_diverged_run_names_is_one_a_saner_run_continues_from(tmp_path, caplog):
    """A huge learning rate with a checkpoint every step: checkpoint 2's parameters are finite but destroyed (step
    3's loss is NaN), so it is set aside and checkpoint 1 named; the rerun at a sane rate resumes there and finishes.
    No checkpoint left holds a non-finite value."""
    config = _config(num_steps=8)
    config.optim.learning_rate, config.optim.warmup_steps = 1e6, 1
    with pytest.raises(divergence.DivergenceError) as raised:
        helpers.run_pretraining(copy.deepcopy(config), str(tmp_path))
    directory = tmp_path / "checkpoints"
    message = str(raised.value)
    bad = int(message.split()[1])  # the first step whose loss is NaN (3 for the default tiny model)
    assert bad >= 3 and message.startswith(f"step {bad} went non-finite (loss")
    assert (f"Checkpoint {bad - 1}, whose parameters that step started from, is set aside as "
            f"{directory / f'{bad - 1}.diverged'}") in message
    assert (f"The newest checkpoint whose parameters gave a healthy next step is step {bad - 2} in {directory}: "
            "rerun to resume from it") in message
    assert f"--config.checkpoint.restore_step={bad - 2} --config.checkpoint.skip_batches=2" in message
    assert _steps(directory)[-1] == bad - 2 and (directory / f"{bad - 1}.diverged").is_dir()
    for name in (str(bad - 2), f"{bad - 1}.diverged"):
        arrays = ocp.StandardCheckpointer().restore(directory / name / checkpoint_lib.STATE_ITEM)
        assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(arrays)
                   if np.issubdtype(np.asarray(leaf).dtype, np.inexact)), name
    # The sane rate is the default one: the train step the other tests compile. It runs past the step that went
    # non-finite, and no further.
    sane = _config(num_steps=bad + 1)
    with caplog.at_level(logging.INFO):
        final = helpers.run_pretraining(sane, str(tmp_path)).metrics
    assert f"resumed from {directory / str(bad - 2)} at step {bad - 2} " in caplog.text
    assert final["step"] == bad + 1 and np.isfinite(final["loss"])
    assert _health(directory, bad + 1)["verified"][-1] == bad


def test_a_gradual_blow_up_leaves_only_checkpoints_a_sane_rerun_continues_from(tmp_path, caplog):
    """Trained sanely for 8 steps, then resumed at a rate that makes the loss climb (finite) step after step: the
    spike is caught, the checkpoint whose parameters spiked is set aside, max_to_keep=1 still keeps the newest
    verified checkpoint, and a rerun at the sane rate from every checkpoint left finishes."""
    config = _config(num_steps=8, spike_window=4)
    config.checkpoint.max_to_keep = 1
    run = tmp_path / "run"
    helpers.run_pretraining(copy.deepcopy(config), str(run))
    directory = run / "checkpoints"
    assert _steps(directory) == [7, 8]  # the newest, and the newest verified (by step 8)
    assert _health(directory, 8)["verified"][-1] == 7
    blow_up = copy.deepcopy(config)
    blow_up.optim.learning_rate, blow_up.train.num_steps = 0.3, 20
    # The blow-up's rate decays over its own 20 steps, which makes the loss climb for a step or more before it
    # spikes; over the tests' common 100-step schedule it spikes at once. The sane runs keep that schedule: their
    # train step is the other tests' one.
    blow_up.optim.schedule_steps = 0
    with pytest.raises(divergence.DivergenceError, match=r"^step (\d+) spiked: loss [\d.]+ is [\d.]+ times the "
                                                         r"median [\d.]+ of the previous 4 steps") as raised:
        helpers.run_pretraining(blow_up, str(run))
    losses = _losses(run)
    spiked = int(str(raised.value).split()[1])
    assert spiked >= 10 and losses[spiked - 1] > losses[8]  # the loss rose, finite, before it spiked
    assert (directory / f"{spiked - 1}.diverged").is_dir()
    left = _steps(directory)
    assert left == [spiked - 2], left  # verified by step spiked - 1, kept although max_to_keep=1
    for step in left:
        rerun = tmp_path / f"rerun_{step}"
        shutil.copytree(run, rerun)
        sane = copy.deepcopy(config)
        sane.train.num_steps = spiked + 1  # past the step that spiked, and no further
        with caplog.at_level(logging.INFO):
            final = helpers.run_pretraining(sane, str(rerun)).metrics
        assert f"resumed from {rerun / 'checkpoints' / str(step)} at step {step} " in caplog.text
        assert final["step"] == spiked + 1


def test_skipped_batches_give_the_losses_of_a_run_without_them_and_the_rewind_happens_once(tmp_path, caplog,
                                                                                          monkeypatch):
    """Rewinding to checkpoint 2 and skipping 2 batches gives, bit for bit, the losses of an uninterrupted run whose
    input lacks batches 2 and 3 (with dropout). The newer checkpoint is moved aside; rerunning the same command
    later resumes from the newest checkpoint and skips nothing again."""
    config = _config(num_steps=4, dropout=True)
    # The sharded mesh and batch of the exact-resume test (tests/test_checkpoint.py), whose train step it shares.
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
    config.train.batch_size = 8
    config.checkpoint.every_steps = 2
    run = tmp_path / "run"
    helpers.run_pretraining(copy.deepcopy(config), str(run))
    rewind = copy.deepcopy(config)
    rewind.checkpoint.restore_step, rewind.checkpoint.skip_batches = 2, 2
    with caplog.at_level(logging.INFO):
        helpers.run_pretraining(copy.deepcopy(rewind), str(run))
    directory = run / "checkpoints"
    assert sorted(os.listdir(directory)) == ["2", "4", "4.rewound"]
    assert "skipped 2 batches of input (--config.checkpoint.skip_batches)" in caplog.text
    assert _health(directory, 4)["rewinds"] == [{"step": 2, "skip_batches": 2, "automatic": False}]
    rewound = _losses(run)

    def without_2_and_3(inner):
        if inner.position == 2:
            next(inner), next(inner)
        return next(inner)

    _wrap_training_input(monkeypatch, without_2_and_3)
    reference = tmp_path / "reference"
    helpers.run_pretraining(copy.deepcopy(config), str(reference))
    monkeypatch.undo()
    expected = _losses(reference)
    assert sorted(rewound) == sorted(expected) == list(range(1, 5))
    assert all(rewound[step] == expected[step] for step in range(1, 5)), (rewound, expected)
    # The same command again, after the run went on: the rewind is already in effect.
    caplog.clear()
    rewind.train.num_steps = 6
    with caplog.at_level(logging.INFO):
        helpers.run_pretraining(rewind, str(run))
    assert "--config.checkpoint.restore_step=2 (skip_batches=2) is already in effect" in caplog.text
    assert f"resumed from {directory / '4'} at step 4 (input position: batch 6)" in caplog.text
    assert sorted(os.listdir(directory)) == ["2", "4", "4.rewound", "6"]


def test_automatic_rewinds_skip_the_batch_that_diverged_and_never_loop_forever(tmp_path, caplog, monkeypatch):
    config = _config(num_steps=6)
    config.checkpoint.every_steps = 2
    config.checkpoint.max_rewinds = 2
    # One bad batch (input position 4, fed to step 5): one rewind to checkpoint 2, past it, and the run finishes.
    _wrap_training_input(monkeypatch, _poison({4}))
    once = tmp_path / "once"
    with caplog.at_level(logging.INFO):
        final = helpers.run_pretraining(copy.deepcopy(config), str(once)).metrics
    assert final["step"] == 6
    assert "step 5 went non-finite (loss" in caplog.text
    assert "Rewinding to checkpoint 2, the newest verified one" in caplog.text
    assert "(automatic rewind 1 of checkpoint.max_rewinds=2)" in caplog.text
    assert f"resumed from {once / 'checkpoints' / '2'} at step 2 (input position: batch 5)" in caplog.text
    directory = once / "checkpoints"
    assert sorted(os.listdir(directory)) == ["2", "4", "4.diverged", "6"]
    assert _health(directory, 6)["rewinds"] == [{"step": 2, "skip_batches": 3, "automatic": True}]
    assert sorted(_losses(once)) == list(range(1, 7))
    # Every batch from position 4 on is bad: two rewinds, then the error, naming the verified checkpoint 2.
    monkeypatch.undo()
    _wrap_training_input(monkeypatch, _poison(set(range(4, 100))))
    always = tmp_path / "always"
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(divergence.DivergenceError) as raised:
        helpers.run_pretraining(copy.deepcopy(config), str(always))
    assert caplog.text.count("Rewinding to checkpoint 2") == 2
    assert str(raised.value).startswith("step 3 went non-finite")
    assert "checkpoint.max_rewinds=2 automatic rewinds are used up. The newest checkpoint whose parameters gave a " \
           "healthy next step is step 2" in str(raised.value)
    assert sorted(os.listdir(always / "checkpoints")) == ["2", "4.diverged"]


def test_spike_detection_judges_against_the_median_of_its_window():
    monitor = divergence.Monitor(spike_factor=2.0, spike_window=3)
    healthy = {"grad_norm": 1.0, "params_finite": 1.0}
    for loss in (9.0, 4.0, 5.0, 6.0, 9.9):  # fewer than 3 known, then 9.9 < 2 * median(4, 5, 6)
        assert monitor.problem(dict(healthy, loss=loss)) is None
    assert monitor.health.losses == [5.0, 6.0, 9.9]
    assert monitor.problem(dict(healthy, loss=12.1)).startswith("spiked: loss 12.1 is 2.02 times the median 6")
    assert monitor.health.losses == [5.0, 6.0, 9.9]  # a spike does not join the history
    assert monitor.problem(dict(healthy, loss=1.0, params_finite=0.0)) == \
        "went non-finite (parameters; loss 1, gradient norm 1)"
    assert divergence.Monitor(spike_factor=0.0, spike_window=3, health=monitor.health).problem(
        dict(healthy, loss=1e6)) is None


def test_a_rewind_to_a_missing_step_names_what_there_is(tmp_path):
    config = _config(num_steps=2)
    helpers.run_pretraining(copy.deepcopy(config), str(tmp_path))
    config.checkpoint.restore_step = 5
    with pytest.raises(ValueError, match=r"--config.checkpoint.restore_step=5: .*checkpoints has no checkpoint of "
                                         r"step 5 \(it has steps \[1, 2\]\)"):
        helpers.run_pretraining(config, str(tmp_path))
