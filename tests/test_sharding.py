"""Sharded equals unsharded: loss, every gradient, and five optimizer steps, on several (data, fsdp, tensor) meshes.

This guards the XLA:CPU miscompilation seen on this stack (wrong gradients for a batch sharded over
('data', 'fsdp') with FSDP + tensor-parallel parameters) as well as any sharding rule that changes the maths.
"""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.data import input_pipeline
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax import steps as steps_lib
from bert_jax import train
from tests import helpers

MESHES = [(8, 1, 1), (2, 2, 2), (1, 4, 2), (2, 1, 4), (1, 1, 8)]
SEQ, PREDS, BATCH = 32, 5, 16
STEPS = 5
STEP_RNG = jax.random.key(1)
# The train step's dropout key for its first step (state.step 0): gradient functions called with it see the same
# dropout masks as that step.
FIRST_STEP_DROPOUT_RNG = jax.random.fold_in(STEP_RNG, 0)


def _setup(mesh_shape, dropout, batch_axes=None, scan_layers=False):
    """`mesh_shape`: (data, fsdp, tensor) on one slice, or (dcn_data, data, fsdp, tensor) over slices."""
    config = helpers.tiny_config(mesh_shape[-3:], dropout=dropout)
    config.mesh.dcn_data = 1 if len(mesh_shape) == 3 else mesh_shape[0]
    config.model.scan_layers = scan_layers
    # One encoder layer holds every sharding rule a layer has, and each mesh's programs compile in less; scanned
    # layers keep two, so that the scan stacks more than one layer, each with its own dropout key.
    if not scan_layers:
        config.model.num_layers = 1
    if batch_axes is not None:
        config.mesh.rules = tuple(("batch", batch_axes) if name == "batch" else (name, axes)
                                  for name, axes in config.mesh.rules)
    devices = jax.devices()[: int(np.prod(mesh_shape))]
    mesh = sharding_lib.create_mesh(config.mesh, devices)
    rules = sharding_lib.logical_rules(config.mesh)
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps)
    return config, mesh, rules, model, tx, schedule


def _batches(vocab_size, count):
    batches = input_pipeline.synthetic_batches(batch_size=BATCH, max_seq_length=SEQ, max_predictions_per_seq=PREDS,
                                               vocab_size=vocab_size, seed=7)
    return [next(batches) for _ in range(count)]


def _loss_and_grads(mesh_shape, batch, rng, batch_axes=None, scan_layers=False):
    """Loss and gradients (dropout on) of one batch, jitted with the mesh's shardings, and the initial parameters."""
    config, mesh, rules, model, tx, _ = _setup(mesh_shape, True, batch_axes, scan_layers)
    with jax.set_mesh(mesh):
        state, shardings = train.create_train_state(model, tx, mesh, rules, jax.random.key(0), SEQ, PREDS)
        batch_sharding = sharding_lib.batch_sharding(mesh, rules)
        replicated = NamedSharding(mesh, PartitionSpec())
        grad_fn = steps_lib.make_grad_fn(model, rules)

        def loss_and_grads(params, batch, rng):
            (loss, _), grads = grad_fn(params, batch, rng, *steps_lib.batch_denominators(batch))
            return loss, grads

        fn = jax.jit(loss_and_grads, in_shardings=(shardings.params, batch_sharding, replicated),
                     out_shardings=(replicated, shardings.params))
        loss, grads = fn(state.params, sharding_lib.make_global_batch(batch, batch_sharding), rng)
        return float(loss), jax.device_get(grads), jax.device_get(state.params)


@dataclasses.dataclass
class Run:
    initial_params: dict
    losses: np.ndarray  # one per step
    first_grad_norm: float
    first_grads: dict  # the gradient of the first step
    final_state: train.TrainState
    initial_state: train.TrainState


def _train(mesh_shape, batches, dropout=True, grad_accum_steps=1, initial_state=None):
    """len(batches) steps of the training loop's jitted train step (state donated) over the mesh, from a state
    created on the mesh or, given `initial_state` (a Run's), that state placed on it (no initialisation compiled)."""
    config, mesh, rules, model, tx, schedule = _setup(mesh_shape, dropout=dropout)
    with jax.set_mesh(mesh):
        if initial_state is None:
            state, shardings = train.create_train_state(model, tx, mesh, rules, jax.random.key(0), SEQ, PREDS)
        else:
            _, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, SEQ, PREDS)
            state = jax.device_put(initial_state, shardings)
        initial_state = jax.device_get(state)
        initial_params = initial_state.params
        step = train.jit_train_step(steps_lib.make_train_step(model, tx, schedule, rules, mesh, grad_accum_steps),
                                    shardings, mesh, rules)
        batch_sharding = sharding_lib.batch_sharding(mesh, rules)
        losses = []
        for batch in batches:
            state, metrics = step(state, sharding_lib.make_global_batch(batch, batch_sharding), STEP_RNG)
            losses.append(float(metrics["loss"]))
            if len(losses) == 1:
                first_grad_norm = float(metrics["grad_norm"])
                first_grads = helpers.first_step_gradients(jax.device_get(state.opt_state), first_grad_norm,
                                                           config.optim)
        return Run(initial_params, np.array(losses), first_grad_norm, first_grads, jax.device_get(state),
                   initial_state)


def _assert_trees_close(actual, expected, rtol, what):
    flat_actual = jax.tree_util.tree_leaves_with_path(actual)
    flat_expected = [np.asarray(e, np.float64) for e in jax.tree.leaves(expected)]
    assert len(flat_actual) == len(flat_expected)
    # A tensor whose true value is zero (the attention key bias gets no gradient: softmax ignores a per-query
    # constant) holds rounding noise; measure it against the scale of the whole tree instead.
    floor = 1e-3 * max(np.max(np.abs(e)) for e in flat_expected if e.size)
    for (path, a), e in zip(flat_actual, flat_expected):
        a = np.asarray(a, np.float64)
        scale = max(np.max(np.abs(e)), floor, 1e-30)
        error = np.max(np.abs(a - e)) / scale
        assert error <= rtol, f"{what} {jax.tree_util.keystr(path)}: max error {error:.3g} of scale {scale:.3g}"


@pytest.fixture(scope="module")
def reference():
    """The unsharded run, once per module: the batches and a Run on one device."""
    batches = _batches(helpers.TINY_VOCAB, STEPS)
    return batches, _train((1, 1, 1), batches)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
def test_sharded_gradients_and_five_optimizer_steps_equal_unsharded(mesh_shape, reference):
    batches, expected = reference
    got = _train(mesh_shape, batches)
    # Same initial parameters: initialisation must not depend on the mesh.
    _assert_trees_close(got.initial_params, expected.initial_params, 0.0, "initial parameter")
    # The first step: its loss and every gradient.
    assert abs(got.losses[0] - expected.losses[0]) <= 1e-5 * abs(expected.losses[0])
    assert got.first_grad_norm == pytest.approx(expected.first_grad_norm, rel=1e-5)
    _assert_trees_close(got.first_grads, expected.first_grads, 1e-5, "gradient")
    # Every gradient is real: a broken (all-zero) path would pass the relative check trivially.
    assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(expected.first_grads))
    # Five optimizer steps.
    np.testing.assert_allclose(got.losses, expected.losses, rtol=1e-5)
    assert int(got.final_state.step) == STEPS
    _assert_trees_close(got.final_state.params, expected.final_state.params, 1e-5, f"parameter after {STEPS} steps")
    _assert_trees_close(got.final_state.opt_state, expected.final_state.opt_state, 1e-4,
                        f"optimizer state after {STEPS} steps")


@pytest.fixture(scope="module")
def reference_without_dropout():
    """The unsharded run without dropout, once per module (every slices test compares with it)."""
    batches = _batches(helpers.TINY_VOCAB, STEPS)
    return batches, _train((1, 1, 1), batches, dropout=False)


@pytest.mark.parametrize("mesh_shape,grad_accum_steps", [((2, 1, 2, 2), 1), ((2, 2, 1, 2), 2), ((4, 2, 1, 1), 1)],
                         ids=["2x1x2x2", "2x2x1x2-accum2", "4x2x1x1"])
def test_slices_train_as_one_device(mesh_shape, grad_accum_steps, reference_without_dropout):
    """Over slices each slice computes its rows' gradient (train.across_slices) and one psum joins them: without
    dropout (each slice draws its own masks) the losses, gradients and five optimizer steps equal one device's.
    They start from the unsharded run's state (the mesh test shows initialisation does not depend on the mesh)."""
    batches, expected = reference_without_dropout
    got = _train(mesh_shape, batches, dropout=False, grad_accum_steps=grad_accum_steps,
                 initial_state=expected.initial_state)
    np.testing.assert_allclose(got.losses, expected.losses, rtol=1e-5)
    assert got.first_grad_norm == pytest.approx(expected.first_grad_norm, rel=1e-5)
    _assert_trees_close(got.first_grads, expected.first_grads, 1e-5, "gradient")
    _assert_trees_close(got.final_state.params, expected.final_state.params, 1e-5, f"parameter after {STEPS} steps")


@pytest.fixture(scope="module")
def scanned_reference():
    batch = _batches(helpers.TINY_VOCAB, 1)[0]
    return batch, _loss_and_grads((1, 1, 1), batch, FIRST_STEP_DROPOUT_RNG, scan_layers=True)


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 1, 8)], ids=lambda m: "x".join(map(str, m)))
def test_scanned_layers_sharded_gradients_equal_unsharded(mesh_shape, scanned_reference):
    # Scanned layers (one nn.scan, parameters stacked on an unsharded leading layer axis), with dropout: the scan
    # body's sharding constraints and per-layer dropout keys must not depend on the mesh either.
    batch, (ref_loss, ref_grads, ref_params) = scanned_reference
    loss, grads, params = _loss_and_grads(mesh_shape, batch, FIRST_STEP_DROPOUT_RNG, scan_layers=True)
    assert model_lib.SCANNED_LAYERS in params
    _assert_trees_close(params, ref_params, 0.0, "initial parameter")
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    _assert_trees_close(grads, ref_grads, 1e-5, "gradient")


def test_batch_axis_order_does_not_change_gradients(reference):
    # XLA:CPU in jaxlib 0.10.2 was seen computing wrong gradients for a batch over ('data', 'fsdp') with FSDP + TP
    # parameters; whichever order a user's rules pick, the gradients must stay those of the unsharded model. The
    # default order, ('fsdp', 'data'), is the mesh test's on (2, 2, 2); this is the other one. Its gradient function
    # is compared with the gradient the unsharded train step's first moment gives back, which also checks that reading.
    assert dict(helpers.tiny_config().mesh.rules)["batch"] == ("dcn_data", "fsdp", "data")
    batches, expected = reference
    loss, grads, _ = _loss_and_grads((2, 2, 2), batches[0], FIRST_STEP_DROPOUT_RNG, batch_axes=("data", "fsdp"))
    assert abs(loss - expected.losses[0]) <= 1e-5 * abs(expected.losses[0])
    _assert_trees_close(grads, expected.first_grads, 1e-5, "gradient")


def test_parameters_and_optimizer_state_are_sharded():
    config, mesh, rules, model, tx, _ = _setup((2, 2, 2), dropout=False)
    with jax.set_mesh(mesh):
        state, _ = train.create_train_state(model, tx, mesh, rules, jax.random.key(0), SEQ, PREDS)
    query = state.params["layer_0"]["attention"]["query"]["kernel"]
    assert query.sharding.spec == PartitionSpec("fsdp", "tensor")
    # Each device holds a quarter of the kernel: born sharded, never replicated.
    assert query.addressable_shards[0].data.shape == (query.shape[0] // 2, query.shape[1] // 2)
    adam_mu = state.opt_state[1][0].mu["layer_0"]["attention"]["query"]["kernel"]
    assert adam_mu.sharding.spec == PartitionSpec("fsdp", "tensor")
    assert state.params["embeddings"]["LayerNorm"]["scale"].sharding.spec == PartitionSpec(None)


def test_uneven_dimension_is_replicated_not_refused():
    config, mesh, rules, *_ = _setup((1, 1, 8), dropout=False)
    spec = sharding_lib.mesh_spec(("vocab", "embed"), (30522, 128), mesh, rules)
    assert spec == PartitionSpec(None, "fsdp")
    assert sharding_lib.mesh_spec(("vocab", "embed"), (30720, 128), mesh, rules) == PartitionSpec("tensor", "fsdp")


@pytest.mark.parametrize("sizes, message", [
    ({"data": 3, "fsdp": 1, "tensor": 1}, "there are 8 devices"),
    ({"data": -1, "fsdp": -1, "tensor": 1}, "only one axis may be -1"),
    ({"data": -1, "fsdp": 3, "tensor": 1}, "does not divide the 8 devices"),
    ({"data": 0, "fsdp": 8, "tensor": 1}, "--config.mesh.data=0"),
    ({"dcn_data": 3, "data": -1, "fsdp": 1, "tensor": 1}, "--config.mesh.dcn_data=3 does not divide the 8 devices"),
    ({"dcn_data": 0, "data": -1, "fsdp": 1, "tensor": 1}, "--config.mesh.dcn_data=0: must be the number of slices"),
    ({"dcn_data": 2, "data": 8, "fsdp": 1, "tensor": 1}, r"there are 4 devices per slice \(8 over 2 slices\)"),
])
def test_bad_mesh_is_refused_with_the_field(sizes, message):
    with pytest.raises(ValueError, match=message):
        sharding_lib.mesh_shape(sizes, 8)


def test_mesh_fills_minus_one():
    assert sharding_lib.mesh_shape({"data": -1, "fsdp": 2, "tensor": 2}, 8) == (1, 2, 2, 2)
    assert sharding_lib.mesh_shape({"dcn_data": 2, "data": -1, "fsdp": 2, "tensor": 1}, 8) == (2, 2, 2, 1)


def test_two_slices_of_cpu_devices_shard_the_batch_over_both():
    """Devices without a slice_index (CPU) form slices of consecutive devices; the batch's first half goes to the
    first slice, and parameters are not split across slices (only the gradient all-reduce crosses them)."""
    config = helpers.tiny_config((1, 2, 2))
    config.mesh.dcn_data = 2
    mesh = sharding_lib.create_mesh(config.mesh)
    assert dict(mesh.shape) == {"dcn_data": 2, "data": 1, "fsdp": 2, "tensor": 2}
    assert [device.id for device in mesh.devices[0].flat] == [0, 1, 2, 3]
    rules = sharding_lib.logical_rules(config.mesh)
    sharding = sharding_lib.batch_sharding(mesh, rules)
    assert sharding.spec == PartitionSpec(("dcn_data", "fsdp", "data"))
    rows = {device.id: index[0] for device, index in sharding.devices_indices_map((8, 32)).items()}
    assert all(rows[device].stop <= 4 for device in range(4)) and all(rows[device].start >= 4 for device in range(4, 8))
    assert "dcn_data" not in str(sharding_lib.mesh_spec(("vocab", "embed"), (512, 128), mesh, rules))


def test_partial_distributed_flags_are_refused():
    with pytest.raises(ValueError, match="--coordinator_address, --num_processes and --process_id"):
        sharding_lib.initialize_distributed(coordinator_address="10.0.0.1:1234", num_processes=2)
    with pytest.raises(ValueError, match="--heartbeat_timeout_s=0: must be a positive number of seconds"):
        sharding_lib.initialize_distributed(heartbeat_timeout_s=0)


def test_global_batch_is_sharded_over_the_batch_axes():
    config, mesh, rules, *_ = _setup((2, 2, 2), dropout=False)
    batch = _batches(helpers.TINY_VOCAB, 1)[0]
    global_batch = sharding_lib.make_global_batch(batch, sharding_lib.batch_sharding(mesh, rules))
    ids = global_batch["input_ids"]
    assert ids.sharding.spec == PartitionSpec(("dcn_data", "fsdp", "data"))
    assert ids.addressable_shards[0].data.shape == (BATCH // 4, SEQ)  # 4-way over data x fsdp, whole rows
    np.testing.assert_array_equal(np.asarray(ids), batch["input_ids"])


@pytest.mark.parametrize("environment, starts", [
    ({}, False),
    ({"TPU_WORKER_HOSTNAMES": "t1v-0"}, False),  # one host, one slice
    ({"TPU_WORKER_HOSTNAMES": "t1v-0,t1v-1"}, True),  # a pod slice
    ({"TPU_WORKER_HOSTNAMES": "t1v-0", "MEGASCALE_NUM_SLICES": "2"}, True),  # two one-host slices
    ({"SLURM_NTASKS": "2"}, True),
])
def test_distributed_start_is_detected_from_the_cluster(monkeypatch, environment, starts):
    for name in ("TPU_WORKER_HOSTNAMES", "MEGASCALE_NUM_SLICES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    sharding_lib.initialize_distributed(heartbeat_timeout_s=12)
    assert calls == ([{"heartbeat_timeout_seconds": 12}] if starts else [])
