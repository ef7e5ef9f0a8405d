"""Compiling the real train step for a TPU topology's compile-only devices, on any host: nothing is allocated, and
XLA:TPU's compiler (libtpu) gives the memory and cost analyses of the step the training run would execute."""

import re
import time

import jax
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np

from bert_jax import job_config
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import train
from bert_jax.aot import hlo
from bert_jax.aot.report import GIB, HBM_GIB_PER_CHIP, AotReport

# libtpu's compile-only topologies give v4 one device per TensorCore unless asked for megacore, which is what a v4
# TPU VM runs (one JAX device per chip). v5p topologies are megacore already; v5e and v6e chips have one core.
_TOPOLOGY_OPTIONS = {"v4": {"chip_config_name": "megacore"}}
_TOPOLOGY_PATTERN = re.compile(r"^(v\w+):(\d+(?:x\d+){1,2})$")
_ACCELERATOR_TYPE_PATTERN = re.compile(r"^(v\d\w*)-(\d+)$")


class LibtpuMissingError(RuntimeError):
    """libtpu (the `aot` extra), whose compiler this module needs, is not installed."""


def topology_devices(topology: str, num_slices: int = 1) -> list[jax.Device]:
    """The compile-only devices (one per chip) of a TPU topology such as `v5e:4x4` or `v5p:4x4x4`, or of
    `num_slices` such slices joined by the data-centre network (each device knows its `slice_index`).

    Errors name --topology and say what is wrong; a missing libtpu says which extra installs it.
    """
    match = _TOPOLOGY_PATTERN.match(topology)
    if not match:
        hint = ""
        accelerator = _ACCELERATOR_TYPE_PATTERN.match(topology)
        if accelerator:
            hint = (f"; {topology!r} looks like a Cloud TPU accelerator type, whose number counts TensorCores on "
                    "v4/v5p (v4-32 = v4:2x2x4, v5p-128 = v5p:4x4x4) and chips on v5e/v6e (v5litepod-256 = "
                    "v5e:16x16)")
        raise ValueError(f"--topology={topology!r}: expected CHIP:AxB or CHIP:AxBxC with CHIP one of "
                         f"{sorted(HBM_GIB_PER_CHIP)} (e.g. v5e:16x16, v5p:4x4x4, v4:2x2x4){hint}")
    chip = match.group(1)
    if chip not in HBM_GIB_PER_CHIP:
        raise ValueError(f"--topology={topology!r}: unknown TPU chip {chip!r}; known: {sorted(HBM_GIB_PER_CHIP)}")
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
    try:
        options = dict(_TOPOLOGY_OPTIONS.get(chip, {}), **({"num_slices": num_slices} if num_slices > 1 else {}))
        description = topologies.get_topology_desc(topology_name=topology, platform="tpu", **options)
    except RuntimeError as error:
        if _is_libtpu_missing(error):
            raise LibtpuMissingError("compiling for a TPU topology needs libtpu: pip install -e '.[aot]' (or the "
                                     f"test extra, '.[test]'), then rerun (--topology={topology!r})") from error
        # libtpu refuses a grid it cannot build (e.g. v5e:3x3, not a multiple of its 2x2 hosts).
        raise ValueError(f"--topology={topology!r}: libtpu cannot build it: {error}") from None
    return list(description.devices)


def _is_libtpu_missing(error: Exception) -> bool:
    return "TPU support not installed" in str(error)


def _abstract_batch(config) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one global batch as the input pipeline delivers it (packed rows with data.pack)."""
    data, batch_size = config.data, config.train.batch_size
    seq_length, max_predictions = data.max_seq_length, data.max_predictions_per_seq
    if not data.get("pack", False):
        batch = train.dummy_batch(batch_size, seq_length, max_predictions)
        if data.source == "corpus" and data.get("instances", "pairs") != "pairs":
            batch["nsp_weights"] = np.zeros((batch_size,), np.float32)  # MLM-only rows carry NSP weights of 0
        return {name: jax.ShapeDtypeStruct(value.shape, value.dtype) for name, value in batch.items()}
    from bert_jax.data import packing  # pylint: disable=import-outside-toplevel
    widths = packing.feature_widths(seq_length, packing.PackingOptions.from_config(data))
    return {name: jax.ShapeDtypeStruct((batch_size, width),
                                       np.float32 if name in packing.FLOAT_FEATURES else np.int32)
            for name, width in widths.items()}


def _abstract(tree, shardings):
    return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                        tree, shardings)


def compile_train_step(config, topology: str, num_slices: int = 1):
    """Compiles the train step of `config` for a TPU `topology` (`num_slices` of them, data parallel across the
    slices: config.mesh.dcn_data is set to it); returns (jax.stages.Compiled, AotReport).

    Nothing is allocated: the state, batch and RNG key are abstract (shapes, dtypes and shardings only). A step
    that cannot fit a chip's HBM is refused by XLA itself: then the compiled step is None and the report says why.
    """
    if num_slices < 1:
        raise ValueError(f"--num_slices={num_slices}: must be 1 or more")
    devices = topology_devices(topology, num_slices)
    config = config.copy_and_resolve_references()
    config.mesh.dcn_data = num_slices
    num_hosts = len({device.process_index for device in devices})
    job_config.validate(config, "train", len(devices), num_hosts)
    # Outside jax.set_mesh: under a mesh of compile-only devices any eager operation (the state's shapes are
    # inferred from an init key made eagerly) fails, as there is nothing to run it on. Setup.build only evaluates
    # shapes.
    setup = train.pretraining_setup(config, devices)
    batch = _abstract_batch(config)
    abstract_args = _abstract_args(setup, config, batch)
    step = setup.pretraining_step(config.optim.grad_accum_steps)
    compiled, out_of_memory, lower_seconds, compile_seconds = _lower_and_compile(step, abstract_args, setup.mesh)
    common = _common_fields(setup, batch, topology, num_slices, devices, num_hosts)
    common.update(lower_seconds=lower_seconds, compile_seconds=compile_seconds)
    if compiled is None:
        return None, AotReport(**common, argument_bytes=0, output_bytes=0, alias_bytes=0, temp_bytes=0,
                               generated_code_bytes=0, xla_peak_bytes=0, flops_per_device=0.0, while_loops=0,
                               out_of_memory=out_of_memory)
    return compiled, _compiled_report(compiled, common, num_slices)


def _abstract_args(setup: train.Setup, config, batch: dict[str, jax.ShapeDtypeStruct]) -> tuple:
    """The step's (state, batch, dropout key), abstract and sharded as the training loop passes them."""
    key = jax.eval_shape(lambda: train.dropout_key(0, config.train.dropout_rng, "tpu"))
    batch_sharding = setup.batch_sharding
    return (_abstract(setup.abstract, setup.shardings),
            {name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=batch_sharding)
             for name, value in batch.items()},
            jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=NamedSharding(setup.mesh, PartitionSpec())))


def _common_fields(setup: train.Setup, batch: dict, topology: str, num_slices: int, devices: list,
                   num_hosts: int) -> dict:
    """The report's fields that do not depend on the compile: the run's shape and the model's FLOPs."""
    model_config = setup.model.config
    rows, seq_length = batch["input_ids"].shape
    predictions = batch["masked_lm_positions"].shape[1]
    model_flops = metrics_lib.model_flops_per_sequence(model_config, seq_length, predictions) * rows
    executed_flops = metrics_lib.step_matmul_flops_per_sequence(
        model_config, seq_length, predictions, metrics_lib.head_cls_rows(batch.get("nsp_positions"))) * rows
    return dict(
        topology=topology if num_slices == 1 else f"{num_slices} x {topology}", device_kind=devices[0].device_kind,
        num_chips=len(devices), num_hosts=num_hosts,
        mesh=dict(setup.mesh.shape), batch_size=rows, seq_length=seq_length, dtype=model_config.dtype,
        num_params=sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(setup.abstract.params)),
        model_flops_per_device=model_flops / len(devices),
        executed_flops_per_device=executed_flops / len(devices),
        hbm_bytes=HBM_GIB_PER_CHIP[topology.split(":", 1)[0]] * GIB)


def _lower_and_compile(step, abstract_args, mesh):
    """(compiled step or None when it cannot fit, XLA's out-of-memory message or None, lower s, compile s)."""
    out_of_memory = None
    # jax.set_mesh, not `with mesh:`, or flax's logical activation constraints silently do nothing. Traced for the
    # TPU, so that model.attention=auto/pallas compiles the Pallas splash kernel as the TPU run itself would.
    with jax.set_mesh(mesh), model_lib.compiling_for("tpu"):
        start = time.perf_counter()
        lowered = step.trace(*abstract_args).lower()
        lowered_at = time.perf_counter()
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as error:
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            compiled, out_of_memory = None, str(error).split("\n", 1)[0]
        compiled_at = time.perf_counter()
    return compiled, out_of_memory, lowered_at - start, compiled_at - lowered_at


def _compiled_report(compiled, common: dict, num_slices: int) -> AotReport:
    """The report of a step that compiled: `common`'s fields plus XLA's memory and cost analyses and the HLO's
    loops and collectives."""
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return AotReport(
        **common, argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
        generated_code_bytes=memory.generated_code_size_in_bytes,
        xla_peak_bytes=int(getattr(memory, "peak_memory_in_bytes", 0)), flops_per_device=float(cost["flops"]),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        optimal_seconds=float(cost.get("optimal_seconds", 0.0)),
        while_loops=hlo.while_loops(hlo_text := compiled.as_text()),
        dcn_bytes=hlo.dcn_transfers(hlo_text) if num_slices > 1 else {},
        collective_bytes=hlo.collective_bytes(hlo_text))


