"""Evaluation: every held-out record counts exactly once (any batch size, mesh or process count), and the held-out
files are checked at start-up, before the first training step."""

import functools
import math
import os

import jax
import numpy as np
import pytest

from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import pretraining
from bert_jax import sharding as sharding_lib
from bert_jax import steps as steps_lib
from bert_jax import train
from bert_jax.data import input_pipeline
from bert_jax import job_config
from tests import helpers
from tests._session import small_records, trained_run  # noqa: F401  (session fixtures)

NUM_RECORDS = 21  # not a multiple of the eval batch of 8: the last batch is 5 records and 3 padding rows
METRICS = ("eval_mlm_loss", "eval_mlm_accuracy", "eval_mlm_perplexity", "eval_nsp_loss", "eval_nsp_accuracy")


def _config(held_out):
    """tiny_config evaluating `held_out` only: no training files at all."""
    config = helpers.tiny_config()
    config.data.source, config.data.input_files, config.data.eval_input_files = "tfrecord", "", held_out
    return config


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    return helpers.write_pretraining_records(tmp_path_factory.mktemp("held_out") / "eval.tfrecord",
                                             num_records=NUM_RECORDS, seed=5)


@pytest.fixture(scope="module")
def host_params():
    """Random weights of the tiny model's parameters, on the host (what they are does not matter here): drawn over
    the shapes of its init, which is traced, not compiled."""
    config = helpers.tiny_config()
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    ids = np.zeros((1, 32), np.int32)
    return helpers.random_params(model, ids, ids, ids, ids[:, :5])


@functools.lru_cache(maxsize=None)
def _eval_step(mesh_shape):
    """(mesh, parameter shardings, batch sharding, the jitted eval step) of the tiny model over the first devices:
    one eval step per mesh, so that each batch shape compiles once in this module."""
    config = helpers.tiny_config(mesh_shape)
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    mesh = sharding_lib.create_mesh(config.mesh, jax.devices()[:math.prod(mesh_shape)])
    rules = sharding_lib.logical_rules(config.mesh)
    tx, _ = optim.create_optimizer(config.optim, config.train.num_steps)
    with jax.set_mesh(mesh):
        _, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
    eval_step = train.jit_eval_step(steps_lib.make_eval_step(model, rules), shardings.params, mesh, rules)
    return mesh, shardings.params, sharding_lib.batch_sharding(mesh, rules), eval_step


def _evaluate(data_config, params, batch_size, mesh_shape=(1, 1, 1), batches=None, num_batches=None):
    """pretraining.evaluate as the pretraining job runs it, on a mesh of `mesh_shape`; `batches` default to
    make_iterator's held-out batches of `batch_size` from `data_config`."""
    mesh, params_shardings, batch_sharding, eval_step = _eval_step(mesh_shape)
    if batches is None:
        batches = input_pipeline.make_iterator(data_config, split="eval", batch_size=batch_size,
                                               vocab_size=helpers.TINY_VOCAB, seed=0)
    with jax.set_mesh(mesh):
        return pretraining.evaluate(eval_step, jax.device_put(params, params_shardings), batches, batch_sharding,
                                    num_batches)


def _assert_same_metrics(got, want):
    assert got["eval_records"] == want["eval_records"]
    for name in METRICS:
        assert got[name] == pytest.approx(want[name], rel=1e-5), name


def test_every_record_counts_once_when_the_batch_does_not_divide_the_set(held_out, host_params, caplog):
    data = _config(held_out).data
    # Reference: all 21 records in one batch, no padding.
    reference = _evaluate(data, host_params, NUM_RECORDS)
    assert reference["eval_records"] == NUM_RECORDS
    with caplog.at_level("INFO"):
        padded = _evaluate(data, host_params, 8)  # 8 + 8 + (5 records, 3 padding rows)
    _assert_same_metrics(padded, reference)
    assert f"evaluation: {NUM_RECORDS} held-out records" in caplog.text and "in 3 batches" in caplog.text
    # The last, padded batch is what brings in the last five records: without it the numbers differ.
    first_two = _evaluate(data, host_params, 8, num_batches=2)
    assert first_two["eval_records"] == 16
    assert first_two["eval_mlm_loss"] != pytest.approx(reference["eval_mlm_loss"], rel=1e-5)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 devices (tests/conftest.py fakes 8 CPU devices)")
def test_two_devices_evaluate_as_one(held_out, host_params):
    """The global batch of 8 (its last one padded) split over a mesh of 2 data-parallel devices."""
    data = _config(held_out).data
    one = _evaluate(data, host_params, 8)
    two = _evaluate(data, host_params, 8, mesh_shape=(2, 1, 1))
    _assert_same_metrics(two, one)
    assert two["eval_records"] == NUM_RECORDS


def test_processes_with_unequal_shares_evaluate_every_record_once(tmp_path, host_params):
    """Two processes' shares of two held-out files, 13 and 3 records, batches of 4 per process: process 0 has 4
    batches (its last one padded), process 1 one, then empty ones while process 0 goes on, as
    pretraining.evaluate feeds them. The global batches give the metrics of one process reading all 16 records."""
    helpers.write_pretraining_records(tmp_path / "eval-0.tfrecord", num_records=13, seed=6)
    helpers.write_pretraining_records(tmp_path / "eval-1.tfrecord", num_records=3, seed=7)
    config = _config(str(tmp_path / "eval-*.tfrecord"))
    processes = [input_pipeline.make_iterator(config.data, split="eval", batch_size=4, vocab_size=helpers.TINY_VOCAB,
                                              seed=0, process_index=index, process_count=2) for index in (0, 1)]
    global_batches, empty = [], 0
    while True:
        local = [next(batches, None) for batches in processes]
        if all(batch is None for batch in local):
            break
        empty += sum(batch is None for batch in local)
        local = [batches.empty_batch() if batch is None else batch for batches, batch in zip(processes, local)]
        assert all(set(batch) == set(local[0]) and batch["input_ids"].shape == (4, 32) for batch in local)
        global_batches.append({name: np.concatenate([batch[name] for batch in local]) for name in local[0]})
    assert len(global_batches) == 4 and empty == 3
    assert sum(float(batch["nsp_weights"].sum()) for batch in global_batches) == 16
    sharded = _evaluate(config.data, host_params, 8, batches=iter(global_batches))
    one_process = _evaluate(config.data, host_params, 16)
    assert one_process["eval_records"] == 16
    _assert_same_metrics(sharded, one_process)


def test_a_process_whose_share_ran_out_feeds_empty_batches(held_out, host_params, monkeypatch, caplog):
    """pretraining.evaluate on a process whose 3 batches are done while another process has 2 more (what the
    collective all_processes_agree would say): it steps on with 2 empty batches, and its numbers do not change."""
    data = _config(held_out).data
    reference = _evaluate(data, host_params, 8)
    other_process_done = iter([False, False])  # asked only once this process has run out
    monkeypatch.setattr(sharding_lib, "all_processes_agree", lambda ok: ok and next(other_process_done, True))
    with caplog.at_level("INFO"):
        waiting = _evaluate(data, host_params, 8)
    assert "in 5 batches" in caplog.text and next(other_process_done, None) is None
    _assert_same_metrics(waiting, reference)


@pytest.mark.parametrize("lengths, feature, field, files_length", [
    ((64, 5), "input_ids", "max_seq_length", 64),
    ((32, 10), "masked_lm_positions", "max_predictions_per_seq", 10),
])
def test_mismatched_held_out_files_stop_training_before_its_first_step(tmp_path, lengths, feature, field,
                                                                       files_length):
    training = helpers.write_pretraining_records(tmp_path / "train.tfrecord", num_records=16, seed=0)
    mismatched = helpers.write_pretraining_records(tmp_path / "eval.tfrecord", num_records=4, seed=1,
                                                   max_seq_length=lengths[0], max_predictions_per_seq=lengths[1])
    config = _config(mismatched)
    config.data.input_files, config.mesh.data = training, -1  # all devices, as a run would use them
    workdir = tmp_path / "run"
    with pytest.raises(ValueError) as error:
        helpers.run_pretraining(config, str(workdir))
    message = str(error.value)
    configured = config.data[field]
    assert mismatched in message and "--config.data.eval_input_files" in message
    assert f"feature {feature!r} has length {files_length} but --config.data.{field}={configured}" in message
    # The fix is in the held-out files: the training data has the configured lengths.
    assert (f"held-out files must be made with the training's {field}={configured}" in message
            and "point --config.data.eval_input_files at files that have them" in message)
    assert f"set --config.data.{field}={files_length}" not in message
    assert not workdir.exists() or not any(workdir.iterdir())  # no step, no checkpoint, no metrics

    # --mode=eval has no training data: there, the config's length may follow the files instead.
    with pytest.raises(ValueError) as error:
        helpers.run_eval(config, str(workdir))
    assert f"set --config.data.{field}={files_length} to evaluate at the files' lengths" in str(error.value)


def test_eval_mode_needs_only_the_held_out_files(trained_run, tmp_path):
    """--mode=eval of tests/_session.py's run with data.input_files empty: the numbers its training computed at
    step 4 over the whole held-out file (48 records), and the count."""
    config = trained_run["config"]()
    config.data.input_files = ""
    with pytest.raises(ValueError, match="needs --config.data.input_files"):
        job_config.validate(config, "train", jax.device_count())
    job_config.validate(config, "eval", jax.device_count())
    results = helpers.run_eval(config, str(tmp_path),
                                              os.path.join(trained_run["workdir"], "checkpoints"))
    assert results["step"] == 4 and results["eval_records"] == 48
    for name in METRICS:
        assert results[name] == pytest.approx(trained_run["final"][name], rel=1e-6), name

    config.data.eval_input_files = ""
    with pytest.raises(ValueError, match=r"--mode=eval needs held-out data: set --config\.data\.eval_input_files"):
        helpers.run_eval(config, str(tmp_path))
