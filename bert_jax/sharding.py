"""Device mesh, logical-to-mesh sharding rules, state and batch shardings, and multi-process start-up.

The mesh has four axes: `dcn_data` (data parallelism across pod slices, size 1 on one slice), and within a slice
`data` (pure data parallelism), `fsdp` (data parallelism with parameters and optimizer state sharded) and `tensor`
(heads, MLP and vocab split, Megatron style). Parameters name their dimensions
logically (see bert_jax.model); `config.mesh.rules` maps those names onto mesh axes.
"""

import math
import os
from typing import Any, Sequence

from absl import logging
import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# "dcn_data" runs across pod slices (joined by the data-centre network): data parallelism only, so that the one
# collective crossing slices is the gradient all-reduce. The others run inside a slice, over its ICI links.
MESH_AXES = ("dcn_data", "data", "fsdp", "tensor")
SLICE_AXIS = MESH_AXES[0]


def initialize_distributed(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
                           heartbeat_timeout_s: int = 30) -> None:
    """Starts jax.distributed when the run spans several processes; a no-op for a single process.

    Explicit flags win. Otherwise JAX's own cluster detection is used where a multi-process cluster is visible:
    Cloud TPU pod slices (several TPU worker hostnames) and multi-slice jobs (MEGASCALE_NUM_SLICES > 1), SLURM
    jobs with more than one task, and Open MPI / torchrun-style launches. A single-host TPU VM, a laptop or a
    one-task SLURM job starts no coordinator.
    A process that sends no heartbeat for `heartbeat_timeout_s` seconds counts as dead: JAX then ends every other
    process ("Terminating process because the JAX distributed service detected fatal errors ... another task
    died"), rather than leaving them waiting in a collective; restarting all of them resumes.
    """
    if heartbeat_timeout_s < 1:
        raise ValueError(f"--heartbeat_timeout_s={heartbeat_timeout_s}: must be a positive number of seconds")
    if coordinator_address or num_processes > 1:
        if not (coordinator_address and num_processes > 0 and process_id >= 0):
            raise ValueError("--coordinator_address, --num_processes and --process_id must be given together "
                             f"(got {coordinator_address!r}, {num_processes}, {process_id})")
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id, heartbeat_timeout_seconds=heartbeat_timeout_s)
        _without_a_cpu_compilation_cache()
        return
    tpu_hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    # Several slices (launch/tpu.sh --num-slices sets it): one job even when each slice has a single host.
    tpu_slices = int(os.environ.get("MEGASCALE_NUM_SLICES", "1") or 1)
    slurm_tasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    mpi_tasks = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1)
    if len(tpu_hosts) > 1 or tpu_slices > 1 or slurm_tasks > 1 or mpi_tasks > 1:
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s)
        _without_a_cpu_compilation_cache()


def _without_a_cpu_compilation_cache() -> None:
    """Several CPU processes compile afresh: with jaxlib 0.10.2 a pair whose programs came from JAX's persistent
    compilation cache failed at its first step ("Gloo context initialization failed ... GetKeyValue() timed out")."""
    if jax.config.jax_compilation_cache_dir and jax.process_count() > 1 and jax.default_backend() == "cpu":
        logging.warning("JAX_COMPILATION_CACHE_DIR=%s is not used: several CPU processes compile their own programs "
                        "(a cached program failed their collectives with jaxlib 0.10.2)",
                        jax.config.jax_compilation_cache_dir)
        jax.config.update("jax_enable_compilation_cache", False)


def all_processes_agree(ok: bool) -> bool:
    """True only if `ok` is True on every process (a host-side collective; free with one process)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int, int]:
    """Resolves the (dcn_data, data, fsdp, tensor) sizes, filling one -1 among the slice's axes with the devices
    left over; errors name the field."""
    slices = int(mesh_config.get("dcn_data", 1))
    if slices < 1:
        raise ValueError(f"--config.mesh.dcn_data={slices}: must be the number of slices, 1 or more")
    if num_devices % slices:
        raise ValueError(f"--config.mesh.dcn_data={slices} does not divide the {num_devices} devices: set it to "
                         "the number of slices the job runs on")
    per_slice = num_devices // slices
    axes = MESH_AXES[1:]
    sizes = [int(mesh_config[axis]) for axis in axes]
    fill = [axis for axis, size in zip(axes, sizes) if size == -1]
    if len(fill) > 1:
        raise ValueError(f"--config.mesh: only one axis may be -1, got {dict(zip(axes, sizes))}")
    for axis, size in zip(axes, sizes):
        if size == 0 or size < -1:
            raise ValueError(f"--config.mesh.{axis}={size}: must be a positive size or -1")
    known = math.prod(size for size in sizes if size != -1)
    if fill:
        if per_slice % known:
            raise ValueError(f"--config.mesh: the fixed axes multiply to {known}, which does not divide the "
                             f"{per_slice} devices of a slice, so mesh.{fill[0]}=-1 cannot be filled")
        sizes[axes.index(fill[0])] = per_slice // known
    if math.prod(sizes) != per_slice:
        where = f"{per_slice} devices per slice ({num_devices} over {slices} slices)" if slices > 1 else (
            f"{num_devices} devices")
        raise ValueError(f"--config.mesh: data*fsdp*tensor = {'*'.join(map(str, sizes))} = {math.prod(sizes)} "
                         f"but there are {where}; make the product equal that count (or set one axis to -1)")
    return (slices, *sizes)


def create_mesh(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (dcn_data, data, fsdp, tensor) mesh over `devices` (default: all devices of all processes).

    Over several slices, each slice's devices form the (data, fsdp, tensor) part and the slices line up along
    dcn_data. TPU devices know their slice (`slice_index`); devices that do not (CPU, GPU) are taken as
    consecutive groups of equal size.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_config, len(devices))
    axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    if shape[0] == 1:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    if all(hasattr(device, "slice_index") for device in devices):
        found = len({device.slice_index for device in devices})
        if found != shape[0]:
            raise ValueError(f"--config.mesh.dcn_data={shape[0]} but the devices span {found} slice(s): set it to "
                             f"{found}")
        from jax.experimental import mesh_utils  # pylint: disable=import-outside-toplevel
        grid = mesh_utils.create_hybrid_device_mesh((1, *shape[1:]), (shape[0], 1, 1, 1), devices=devices)
    else:
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)


def logical_rules(mesh_config) -> tuple[tuple[str, Any], ...]:
    """The logical-axis -> mesh-axes rules from the config, as the tuple flax expects."""
    rules = []
    for logical, mesh_axes in mesh_config.rules:
        if isinstance(mesh_axes, list):
            mesh_axes = tuple(mesh_axes)
        rules.append((logical, mesh_axes))
    return tuple(rules)


def within_slice_rules(rules) -> tuple[tuple[str, Any], ...]:
    """`rules` without the slice axis, for code that runs per slice (in a shard_map manual over dcn_data)."""
    def drop(mesh_axes):
        if mesh_axes == SLICE_AXIS:
            return None
        if isinstance(mesh_axes, tuple):
            kept = tuple(axis for axis in mesh_axes if axis != SLICE_AXIS)
            return kept[0] if len(kept) == 1 else (kept or None)
        return mesh_axes
    return tuple((logical, drop(mesh_axes)) for logical, mesh_axes in rules)


def _axes_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return math.prod(mesh.shape[axis] for axis in axes)


def mesh_spec(logical_names, shape, mesh: Mesh, rules) -> PartitionSpec:
    """Maps logical names to a PartitionSpec, leaving a dimension unsharded where the mesh does not divide it.

    An uneven dimension (a vocab of 30522 over a tensor axis of 4, say) is replicated rather than refused, so any
    vocab works on any mesh; padding the vocab to a multiple of 128 keeps it sharded.
    """
    spec = list(nn.logical_to_mesh_axes(logical_names, rules))
    spec += [None] * (len(shape) - len(spec))
    for dim, axes in enumerate(spec):
        if axes is not None and shape[dim] % _axes_size(mesh, axes):
            logging.log_first_n(logging.INFO, "dimension %d of size %d (%s) is not divisible by mesh axes %s; "
                                "replicating it", 20, dim, shape[dim], logical_names, axes)
            spec[dim] = None
    return PartitionSpec(*spec)


def _is_box(x) -> bool:
    return isinstance(x, nn.LogicallyPartitioned)


def tree_shardings(abstract_boxed_tree, mesh: Mesh, rules):
    """NamedShardings for a tree whose leaves may be `nn.LogicallyPartitioned` boxes (e.g. from jax.eval_shape).

    The result has the structure of the unboxed tree: boxed leaves get their logical sharding, plain leaves (step
    counters, optimizer counts) are replicated.
    """
    def leaf_sharding(leaf):
        if _is_box(leaf):
            return NamedSharding(mesh, mesh_spec(leaf.names, leaf.value.shape, mesh, rules))
        return NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(leaf_sharding, abstract_boxed_tree, is_leaf=_is_box)


def unbox(tree):
    """Strips the logical-partitioning boxes, leaving plain arrays."""
    return nn.meta.unbox(tree)


def batch_spec(mesh: Mesh, rules) -> PartitionSpec:
    """PartitionSpec of a [batch, ...] array: the batch dimension over the mesh axes the `batch` rule names."""
    return PartitionSpec(*nn.logical_to_mesh_axes(("batch",), rules))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(mesh, rules))


def process_rows(sharding: NamedSharding, global_batch_size: int) -> np.ndarray:
    """The global batch rows this process's devices hold, ascending: the order in which
    `make_global_batch` places this process's local rows."""
    indices = sharding.addressable_devices_indices_map((global_batch_size,))
    rows = set()
    for index in indices.values():
        rows.update(range(global_batch_size)[index[0]])
    return np.asarray(sorted(rows))


def make_global_batch(local_batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Turns this process's slice of the batch into one global jax.Array per feature, sharded over the batch axes."""
    return {name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
            for name, value in local_batch.items()}
