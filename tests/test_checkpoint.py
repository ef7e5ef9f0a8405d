"""Checkpoints in-process: resharding on restore, corrupt checkpoints, exact resume, refused configs."""

import copy
import glob
import json
import logging
import os
import re
import shutil

import jax
import numpy as np
import pytest

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import train
from bert_jax.data import input_pipeline
from bert_jax import job_config
from tests import helpers
from tests._session import small_records, trained_run  # noqa: F401  (session fixtures)


def _config(**train_overrides):
    config = helpers.tiny_config(mesh_shape=(2, 2, 2), dropout=True, **train_overrides)
    config.train.batch_size = 8
    config.train.log_every = 1
    return config


def test_restore_onto_other_meshes(tmp_path):
    """Saved on 2 slices of (1,2,2), restored on one slice of (8,1,1) and of (1,1,8): every parameter and optimizer
    moment is equal."""
    config = _config()
    config.model.num_layers = 1  # one layer shows every kind of parameter and its sharding
    mesh, rules, model, tx = helpers.state_on_mesh(config, (2, 1, 2, 2))
    with jax.set_mesh(mesh):
        abstract, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
        # Distinct values in every parameter and optimizer moment (the step and counts 7), drawn on the host and
        # placed with the state's shardings: nothing to compile, and no leaf that a zero or a constant could match.
        draws = np.random.default_rng(0)

        def value(leaf, sharding):
            if np.issubdtype(leaf.dtype, np.inexact):
                return jax.device_put(draws.standard_normal(leaf.shape).astype(leaf.dtype), sharding)
            return jax.device_put(np.full(leaf.shape, 7, leaf.dtype), sharding)

        state = jax.tree.map(value, abstract, shardings)
        saved = jax.device_get(state)
        checkpointer = checkpoint_lib.Checkpointer(str(tmp_path / "ckpt"), every_steps=1, max_to_keep=2)
        iterator = input_pipeline.synthetic_batches(batch_size=8, max_seq_length=32, max_predictions_per_seq=5,
                                                    vocab_size=512, seed=0)
        next(iterator)
        checkpointer.save(7, state, jax.random.key(42), iterator)
        checkpointer.close()

    for mesh_shape in [(8, 1, 1), (1, 1, 8)]:
        mesh, rules, model, tx = helpers.state_on_mesh(config, mesh_shape)
        with jax.set_mesh(mesh):
            abstract, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
            fresh_iterator = input_pipeline.synthetic_batches(batch_size=8, max_seq_length=32,
                                                              max_predictions_per_seq=5, vocab_size=512, seed=0)
            checkpointer = checkpoint_lib.Checkpointer(str(tmp_path / "ckpt"), every_steps=1, max_to_keep=2)
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            step, restored, rng, _ = checkpointer.restore_latest(abstract, shardings, replicated, fresh_iterator)
            checkpointer.close()
        assert step == 7 and int(restored.step) == 7 and fresh_iterator.position == 1
        np.testing.assert_array_equal(jax.random.key_data(rng), jax.random.key_data(jax.random.key(42)))
        # The arrays really are laid out for the new mesh.
        embedding = restored.params["embeddings"]["word_embeddings"]["embedding"]
        assert embedding.sharding.mesh.devices.shape == (1, *mesh_shape)
        assert embedding.sharding == shardings.params["embeddings"]["word_embeddings"]["embedding"]
        for path, (want, got) in zip(jax.tree_util.tree_leaves_with_path(saved),
                                     zip(jax.tree.leaves(saved), jax.tree.leaves(jax.device_get(restored)))):
            np.testing.assert_array_equal(got, want, err_msg=jax.tree_util.keystr(path[0]))


@pytest.mark.slow
def test_interrupted_run_resumes_exactly_and_skips_corrupt_checkpoints(tmp_path, caplog, small_records):
    """A run resumed from its step-2 checkpoint reproduces the uninterrupted run's losses bit for bit (same
    batches, dynamic masks and dropout). The two newer checkpoints are damaged: flipped bytes in step 4 (which
    still reads, with other values: the checksums catch it) and a truncated step 3; both are set aside."""
    config = helpers.small_tfrecord_config(small_records, dropout=True, num_steps=4, log_every=1)
    config.train.batch_size = 8
    config.model.num_layers = 1  # one layer shows exactness; the step compiles twice, as it would after a restart
    config.data.masking = "dynamic"
    config.data.eval_input_files = ""  # no evaluation: not what this test is about
    config.checkpoint.every_steps = 1
    config.checkpoint.max_to_keep = 5
    run = tmp_path / "run"
    helpers.run_pretraining(copy.deepcopy(config), str(run))
    expected = helpers.metrics_by_step(run)
    assert sorted(expected) == list(range(1, 5))
    assert sorted(os.listdir(run / "checkpoints")) == ["1", "2", "3", "4"]
    # Step 4: 64 bytes flipped in the middle of its largest file (compressed array data: it decodes, to other values).
    largest = max((path for path in glob.glob(str(run / "checkpoints" / "4" / "state" / "**" / "*"), recursive=True)
                   if os.path.isfile(path)), key=os.path.getsize)
    with open(largest, "r+b") as file:
        file.seek(os.path.getsize(largest) // 2)
        data = file.read(64)
        file.seek(-len(data), os.SEEK_CUR)
        file.write(bytes(byte ^ 0x01 for byte in data))
    # Step 3: interrupted half-way through its write. Truncate every file of its state.
    for path in glob.glob(str(run / "checkpoints" / "3" / "state" / "**" / "*"), recursive=True):
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            with open(path, "r+b") as file:
                file.truncate(os.path.getsize(path) // 2)
    with caplog.at_level(logging.INFO):
        helpers.run_pretraining(copy.deepcopy(config), str(run))
    # Which of the two checks fires depends on the values the damage decodes to: either sets it aside.
    assert re.search(rf"checkpoint {run / 'checkpoints' / '4'} is corrupt or partial \(CorruptCheckpointError: "
                     r"(NaN or infinite values in|\d+ array\(s\) read back with other values)", caplog.text)
    assert f"checkpoint {run / 'checkpoints' / '3'} is corrupt or partial" in caplog.text
    assert f"resumed from {run / 'checkpoints' / '2'} at step 2" in caplog.text
    # Kept for inspection, not deleted.
    assert sorted(os.listdir(run / "checkpoints")) == ["1", "2", "3", "3.corrupt", "4", "4.corrupt"]
    # Steps 3-4 ran twice; the resumed run replaced the first run's records of them.
    logged = [json.loads(line)["step"] for line in open(run / "metrics.jsonl", encoding="utf-8")]
    assert logged == list(range(1, 5))
    got = helpers.metrics_by_step(run)
    for step in range(3, 5):
        for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm"):
            assert got[step][name] == expected[step][name], (step, name)


def test_checkpoints_with_changed_or_non_finite_values_are_set_aside_and_never_saved(tmp_path, caplog):
    """Step 3 holds a NaN (written without checks, as an older bert_jax could), step 2 an element changed after the
    save (its checksums no longer match): both are set aside and step 1 restores. A NaN state is never saved."""
    mesh = jax.make_mesh((8,), ("data",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    iterator = input_pipeline.synthetic_batches(batch_size=8, max_seq_length=32, max_predictions_per_seq=5,
                                                vocab_size=512, seed=0)
    directory = tmp_path / "checkpoints"
    weights = np.arange(16, dtype=np.float32)
    with_nan = weights.copy()
    with_nan[5] = np.nan
    for step, values, checksums in ((1, weights, True), (2, weights, True), (3, with_nan, False)):
        checkpointer = checkpoint_lib.Checkpointer(str(directory), every_steps=1, max_to_keep=5, checksums=checksums)
        checkpointer.save(step, {"weights": jax.device_put(values, sharded)}, jax.random.key(step), iterator)
        checkpointer.close()
    checkpointer = checkpoint_lib.Checkpointer(str(directory), every_steps=1, max_to_keep=5)
    with pytest.raises(checkpoint_lib.CheckpointSaveError,
                       match=r"refusing to save step 4: .* \['train_state.weights'\]"):
        checkpointer.save(4, {"weights": jax.device_put(with_nan, sharded)}, jax.random.key(4), iterator)
    checkpointer.close()
    assert sorted(os.listdir(directory)) == ["1", "2", "3"]
    # Step 2's array rewritten in place with one element 1 ulp off: it reads back cleanly, with another value.
    state_dir = directory / "2" / checkpoint_lib.STATE_ITEM
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    saved = jax.tree.map(np.array, jax.device_get(ocp.StandardCheckpointer().restore(state_dir)))
    saved["train_state"]["weights"][9] = np.nextafter(saved["train_state"]["weights"][9], np.float32(np.inf))
    shutil.rmtree(state_dir)
    with ocp.StandardCheckpointer() as writer:
        writer.save(state_dir, saved)

    abstract = {"weights": jax.ShapeDtypeStruct((16,), np.float32)}
    with caplog.at_level(logging.INFO, logger="absl"):
        checkpointer = checkpoint_lib.Checkpointer(str(directory), every_steps=1, max_to_keep=5)
        step, restored, _, _ = checkpointer.restore_latest(abstract, {"weights": sharded}, replicated, iterator)
        checkpointer.close()
    assert step == 1
    np.testing.assert_array_equal(jax.device_get(restored["weights"]), weights)
    assert (f"checkpoint {directory / '3'} is corrupt or partial (CorruptCheckpointError: NaN or infinite values in "
            "1 array(s), e.g. ['train_state.weights'])") in caplog.text
    assert (f"checkpoint {directory / '2'} is corrupt or partial (CorruptCheckpointError: 1 array(s) read back with "
            "other values than were saved (checksum mismatch), e.g. ['train_state.weights'])") in caplog.text
    assert sorted(os.listdir(directory)) == ["1", "2.corrupt", "3.corrupt"]
    # The checksums see the order of the elements, not only their values.
    assert (checkpoint_lib.summarize({"a": jax.numpy.asarray([1.0, 2.0])})[0]
            != checkpoint_lib.summarize({"a": jax.numpy.asarray([2.0, 1.0])})[0])


def test_saves_say_how_they_saved_and_a_restore_warns_of_nothing(tmp_path, caplog):
    """An asynchronous save says it goes on in the background, a synchronous one that it is done and how long it
    took; restoring them logs no warning (Orbax's "Metadata file does not exist" among them). On the CPU a save
    compiles no program but the integrity summary's: no slicing of a replicated array per device (Orbax's
    replica-parallel writing, 80 programs at a tiny model's first save)."""
    mesh = jax.make_mesh((8,), ("data",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = {"weights": jax.device_put(np.arange(16, dtype=np.float32), sharded),
             "bias": jax.device_put(np.arange(24, dtype=np.float32).reshape(8, 3), replicated)}
    iterator = input_pipeline.synthetic_batches(batch_size=8, max_seq_length=32, max_predictions_per_seq=5,
                                                vocab_size=512, seed=0)
    directory = str(tmp_path / "checkpoints")
    with caplog.at_level(logging.INFO, logger="absl"), jax.log_compiles(True):  # absl: its own level from --verbosity
        for step, async_save in ((1, True), (2, False)):
            next(iterator)
            checkpointer = checkpoint_lib.Checkpointer(directory, every_steps=1, max_to_keep=2, async_save=async_save)
            checkpointer.save(step, state, jax.random.key(step), iterator)
            checkpointer.close()
    compiled = re.findall(r"Compiling jit\((\w+)\)", caplog.text)
    assert "_leaf_summary" in compiled and not [name for name in compiled if "slice" in name], compiled
    where = re.escape(directory)
    assert re.search(rf"checkpoint: saving step 1 to {where} in the background \(the loop waited \d+\.\d+ s\)",
                     caplog.text)
    assert re.search(rf"checkpoint: saved step 2 to {where} in \d+\.\d+ s \(checkpoint\.async_save=False\)",
                     caplog.text)
    assert "saving step 2" not in caplog.text and "saved step 1" not in caplog.text

    caplog.clear()
    fresh = input_pipeline.synthetic_batches(batch_size=8, max_seq_length=32, max_predictions_per_seq=5,
                                             vocab_size=512, seed=0)
    abstract = {"weights": jax.ShapeDtypeStruct((16,), np.float32), "bias": jax.ShapeDtypeStruct((8, 3), np.float32)}
    with caplog.at_level(logging.INFO, logger="absl"):
        checkpointer = checkpoint_lib.Checkpointer(directory, every_steps=1, max_to_keep=2)
        step, restored, rng, _ = checkpointer.restore_latest(abstract, {"weights": sharded, "bias": replicated},
                                                             replicated, fresh)
        checkpointer.close()
        # What --config.init and fine-tuning read to check a checkpoint's shapes before restoring it.
        metadata = checkpoint_lib.state_metadata(directory)
    assert step == 2 and fresh.position == 2
    np.testing.assert_array_equal(jax.device_get(restored["weights"]), np.arange(16, dtype=np.float32))
    np.testing.assert_array_equal(jax.device_get(restored["bias"]), np.arange(24, dtype=np.float32).reshape(8, 3))
    np.testing.assert_array_equal(jax.random.key_data(rng), jax.random.key_data(jax.random.key(2)))
    assert metadata["train_state"]["weights"].shape == (16,) and metadata["rng"].shape == (2,)
    assert "Metadata file does not exist" not in caplog.text
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("field, value, message", [
    ("every_steps", -1, "checkpoint.every_steps=-1"),
    ("max_to_keep", 0, "checkpoint.max_to_keep=0"),
    ("keep_best", True, "checkpoint.keep_best=True ranks checkpoints by eval loss"),
])
def test_bad_checkpoint_config_is_named(field, value, message):
    config = _config()
    config.checkpoint[field] = value
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        job_config.validate(config, "train", jax.device_count())


def test_a_checkpoint_of_another_model_is_refused_not_skipped(trained_run, tmp_path):
    """A readable checkpoint that does not fit the config stops the run with the array named, and stays put."""
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(os.path.join(trained_run["workdir"], "checkpoints"), checkpoints)
    config = trained_run["config"]()
    config.model.intermediate_size = 256  # the run's is 512
    mesh, rules, model, tx = helpers.state_on_mesh(config, (2, 2, 2))
    iterator = input_pipeline.synthetic_batches(batch_size=16, max_seq_length=32, max_predictions_per_seq=5,
                                                vocab_size=512, seed=0)
    with jax.set_mesh(mesh):
        abstract, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
        checkpointer = checkpoint_lib.Checkpointer(str(checkpoints), every_steps=1, max_to_keep=2)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        with pytest.raises(checkpoint_lib.CheckpointMismatchError,
                           match=r"train_state\.params\.layer_0\.intermediate\.bias has shape \(512,\) there but "
                                 r"\(256,\) here"):
            checkpointer.restore_latest(abstract, shardings, replicated, iterator)
        checkpointer.close()
    assert sorted(os.listdir(checkpoints)) == ["4"]
