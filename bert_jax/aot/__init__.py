"""Ahead-of-time compilation of the real train step for a Cloud TPU slice, on any machine (a laptop CPU included).

`python -m bert_jax.aot --config=configs/pretrain.py:size=large --topology=v5p:4x4x4,v5e:16x16` (add
`--config.mesh.data=1 --config.mesh.fsdp=-1` for FSDP, or any other --config override) needs only the `aot`
extra (`pip install -e '.[aot]'`: libtpu, whose compiler XLA runs here without a TPU). The step is
`bert_jax.train.make_train_step` with the config's model, optimizer, mesh, logical rules and batch, jitted with
the same shardings and donation as the training loop and compiled for the topology's devices. The table gives,
per chip, the memory XLA assigned (state and batch arguments, outputs, temporaries, code) against the chip's HBM,
and the compiled step's FLOPs next to the model's matmul FLOPs: whether a run fits, and how the compiled work
compares with the model's, before any TPU is booked. A step too large for the chip is refused by XLA:TPU itself
(RESOURCE_EXHAUSTED); the table then says NO with XLA's figures instead of failing. The model is traced for the
TPU (`model.compiling_for`), so `model.attention=auto`/`pallas` compiles the Pallas splash kernel, as the run on
the TPU itself would.

`--num_slices=N` compiles for N such slices joined by the data-centre network: data parallel across them
(`mesh.dcn_data`), the config's mesh inside each.

Topologies are `CHIP:AxB[xC]` chip grids as Cloud TPU names them (v4:2x2x4 is the v4-32 accelerator type, 16
chips; v5p:4x4x4 is v5p-128, 64 chips; v5e:16x16 is v5litepod-256). One JAX device per chip, as on the TPU VMs
(v4 and v5p run their two TensorCores as one megacore device).
"""

import dataclasses
import re
import time

import jax
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np

from bert_jax import chips as chips_lib
from bert_jax import job_config
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax import train

GIB = 1 << 30
# Nominal HBM per chip (GiB), for the "fits" verdict. The runtime keeps a little for itself, so treat a step within
# a few percent of the limit as not fitting.
HBM_GIB_PER_CHIP = {name: chip.hbm_gib for name, chip in chips_lib.CHIPS.items()}
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
        return {name: jax.ShapeDtypeStruct(value.shape, value.dtype)
                for name, value in train.dummy_batch(batch_size, seq_length, max_predictions).items()}
    from bert_jax.data import packing  # pylint: disable=import-outside-toplevel
    widths = packing.feature_widths(seq_length, packing.PackingOptions.from_config(data))
    return {name: jax.ShapeDtypeStruct((batch_size, width),
                                       np.float32 if name in packing.FLOAT_FEATURES else np.int32)
            for name, width in widths.items()}


@dataclasses.dataclass(frozen=True)
class AotReport:
    """What compiling the train step for one topology found. Byte counts are per chip (device)."""

    topology: str
    device_kind: str
    num_chips: int
    num_hosts: int
    mesh: dict[str, int]
    batch_size: int
    seq_length: int
    dtype: str
    num_params: int
    argument_bytes: int  # the state and batch shards the step takes
    output_bytes: int  # the new state shard and the metrics
    alias_bytes: int  # outputs written in place of donated arguments (counted in both of the above)
    temp_bytes: int  # activations, gradients and other buffers live only during the step
    generated_code_bytes: int
    xla_peak_bytes: int  # XLA's own peak figure (CompiledMemoryStats.peak_memory_in_bytes)
    flops_per_device: float  # compiled.cost_analysis()["flops"]: the per-device SPMD program
    while_loops: int  # while loops in the compiled program: each body's FLOPs are counted once, not per trip
    model_flops_per_device: float  # bert_jax.metrics.model_flops_per_sequence * batch / chips
    # bert_jax.metrics.step_matmul_flops_per_sequence * batch / chips: the matmul FLOPs the step executes (fewer than
    # the model FLOPs: the last layer computes the rows the heads read only)
    executed_flops_per_device: float
    hbm_bytes: int
    lower_seconds: float  # tracing and lowering to StableHLO
    compile_seconds: float  # XLA:TPU compilation
    # XLA:TPU's refusal when the step cannot fit a chip's HBM; then nothing was compiled, and the byte and
    # compiled-FLOP fields above are 0.
    out_of_memory: str = ""
    # Bytes one chip sends to other slices per step, by transfer type (dcn_transfers); empty for one slice.
    dcn_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    # The result sizes of the program's collectives on one chip, by kind (collective_bytes).
    collective_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    # compiled.cost_analysis()'s "bytes accessed" (HBM traffic of the per-device program) and "optimal_seconds"
    # (XLA:TPU's own time for it); loop bodies count once, as for the FLOPs.
    bytes_accessed: float = 0.0
    optimal_seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        """Memory the step needs on one chip: arguments + outputs (less donated ones) + temporaries + code."""
        return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
                + self.generated_code_bytes)

    @property
    def needed_bytes(self) -> int:
        """The larger of the two per-chip figures: the one the fits verdict uses."""
        return max(self.total_bytes, self.xla_peak_bytes)

    @property
    def fits(self) -> bool:
        return not self.out_of_memory and self.needed_bytes <= self.hbm_bytes

    @property
    def flops_total(self) -> float:
        return self.flops_per_device * self.num_chips

    @property
    def flops_ratio(self) -> float:
        """Compiled FLOPs over the matmul FLOPs the step executes: above 1 by the elementwise work (dropout bits,
        softmax, LayerNorm, optimizer) and any computation the sharding replicates; below 1 when loops hide work
        (XLA's cost analysis counts a while-loop body once: grad_accum_steps > 1, scan_layers, or loops XLA makes
        itself, such as collective matmuls over the fsdp axis)."""
        return self.flops_per_device / self.executed_flops_per_device


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8, "u64": 8}
# A transfer between slices in a multi-slice program: a host-transfer `send` handed to the MegaScale runtime, e.g.
#   %send = (f32[1,1,128]{...}, u32[], token[]) send(...), ..., _xla_megascale_transfer_type="ALL_REDUCE"}
_DCN_SEND = re.compile(r"= \((\w+)\[([\d,]*)\][^\n]*?\) send\([^\n]*?_xla_megascale_transfer_type=\"(\w+)\"")


def _shape_bytes(dtype: str, dims: str) -> int:
    """Bytes of an HLO array shape such as f32[8,128] (dtype "f32", dims "8,128")."""
    return int(np.prod([int(dim) for dim in dims.split(",") if dim])) * _DTYPE_BYTES[dtype]


def dcn_transfers(hlo_text: str) -> dict[str, int]:
    """Bytes one chip sends to other slices per step, by transfer type (ALL_REDUCE, ONE_TO_ONE, ...), read from
    the compiled multi-slice program; empty for one slice."""
    transfers: dict[str, int] = {}
    for dtype, dims, kind in _DCN_SEND.findall(hlo_text):
        transfers[kind] = transfers.get(kind, 0) + _shape_bytes(dtype, dims)
    return transfers


_COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%\S+ = (.*?) (all-gather|all-reduce|reduce-scatter|all-to-all|"
                         r"collective-permute)(-start)?\(([^\n]*)", re.MULTILINE)
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_SHAPE = re.compile(r"\b(\w+)\[([\d,]*)\]")


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """The result sizes of the collectives in a compiled program (one chip's), by kind: what the step moves over
    the chips' links, to within the algorithm's factor (an all-gather's result is the gathered array, an all-reduce
    sends about twice its size). XLA combines small collectives into one with a tuple result, whose elements all
    count; an asynchronous start's tuple holds its operands, then its results. XLA:TPU copies one collective into
    several fusions (its async and pipelined forms), so each channel counts once. A collective in a while-loop
    body counts once, like XLA's FLOPs."""
    totals: dict[str, int] = {}
    channels = set()
    for result, kind, start, rest in _COLLECTIVE.findall(hlo_text):
        channel = _CHANNEL.search(rest)
        if channel:
            if channel.group(1) in channels:
                continue
            channels.add(channel.group(1))
        shapes = [(dtype, dims) for dtype, dims in _SHAPE.findall(result) if dtype in _DTYPE_BYTES]
        if start and kind != "all-reduce" and len(shapes) > 1:
            shapes = shapes[len(shapes) // 2:]
        totals[kind] = totals.get(kind, 0) + sum(_shape_bytes(dtype, dims) for dtype, dims in shapes)
    return totals


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
    chip = topology.split(":", 1)[0]
    num_hosts = len({device.process_index for device in devices})
    job_config.validate(config, "train", len(devices), num_hosts)
    data = config.data
    model_config = model_lib.BertConfig.from_config(config.model)
    model = model_lib.BertForPreTraining(model_config)
    mesh = sharding_lib.create_mesh(config.mesh, devices)
    rules = sharding_lib.logical_rules(config.mesh)
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps)
    # Outside jax.set_mesh: under a mesh of compile-only devices any eager operation (abstract_train_state makes
    # its init key eagerly) fails, as there is nothing to run it on.
    abstract_state, state_shardings, _ = train.abstract_train_state(model, tx, mesh, rules, data.max_seq_length,
                                                                    data.max_predictions_per_seq)
    key = jax.eval_shape(lambda: train.dropout_key(0, config.train.dropout_rng, "tpu"))
    batch_sharding = sharding_lib.batch_sharding(mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    batch = _abstract_batch(config)
    step = train.jit_train_step(train.make_train_step(model, tx, schedule, rules, mesh,
                                                      config.optim.grad_accum_steps), state_shardings, mesh, rules)
    abstract_args = (_abstract(abstract_state, state_shardings),
                     {name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=batch_sharding)
                      for name, value in batch.items()},
                     jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated))
    compiled, out_of_memory, lower_seconds, compile_seconds = _lower_and_compile(step, abstract_args, mesh)
    rows, seq_length = batch["input_ids"].shape
    predictions = batch["masked_lm_positions"].shape[1]
    model_flops = metrics_lib.model_flops_per_sequence(model_config, seq_length, predictions) * rows
    executed_flops = metrics_lib.step_matmul_flops_per_sequence(
        model_config, seq_length, predictions, metrics_lib.head_cls_rows(batch.get("nsp_positions"))) * rows
    common = dict(
        topology=topology if num_slices == 1 else f"{num_slices} x {topology}", device_kind=devices[0].device_kind,
        num_chips=len(devices), num_hosts=num_hosts,
        mesh=dict(mesh.shape), batch_size=rows, seq_length=seq_length, dtype=model_config.dtype,
        num_params=sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(abstract_state.params)),
        model_flops_per_device=model_flops / len(devices),
        executed_flops_per_device=executed_flops / len(devices), hbm_bytes=HBM_GIB_PER_CHIP[chip] * GIB,
        lower_seconds=lower_seconds, compile_seconds=compile_seconds)
    if compiled is None:
        return None, AotReport(**common, argument_bytes=0, output_bytes=0, alias_bytes=0, temp_bytes=0,
                               generated_code_bytes=0, xla_peak_bytes=0, flops_per_device=0.0, while_loops=0,
                               out_of_memory=out_of_memory)
    return compiled, _compiled_report(compiled, common, num_slices)


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
        while_loops=len(re.findall(r"\bwhile\(", hlo_text := compiled.as_text())),
        dcn_bytes=dcn_transfers(hlo_text) if num_slices > 1 else {}, collective_bytes=collective_bytes(hlo_text))


def _gib(value: int) -> str:
    if value >= GIB:
        return f"{value / GIB:.2f} GiB"
    return f"{value / (1 << 20):.1f} MiB" if value >= 1 << 20 else f"{value / (1 << 10):.1f} KiB"


def fits_verdict(report: AotReport) -> str:
    if report.out_of_memory:
        # e.g. "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries
        # (45.40G) exceeds available HBM (15.75G)."
        needed = re.search(r"required for (.+?) \(([\d.]+\w?)\) exceeds available HBM \(([\d.]+\w?)\)",
                           report.out_of_memory)
        if needed:
            return f"NO: XLA needs {needed.group(2)} for {needed.group(1)}, {needed.group(3)} of HBM available"
        return f"NO: {report.out_of_memory}"
    share = f"({report.needed_bytes / report.hbm_bytes:.0%} of HBM)"
    return f"yes {share}" if report.fits else f"NO {share}"


def format_reports(reports: list[AotReport]) -> str:
    """A table with one column per compiled topology ("-" where XLA refused a step too large for the chip)."""
    compiled_rows = [
        ("per chip: arguments", lambda r: _gib(r.argument_bytes)),
        ("per chip: outputs", lambda r: _gib(r.output_bytes)),
        ("per chip: donated (aliased)", lambda r: _gib(r.alias_bytes)),
        ("per chip: temporaries", lambda r: _gib(r.temp_bytes)),
        ("per chip: generated code", lambda r: _gib(r.generated_code_bytes)),
        ("per chip: total", lambda r: _gib(r.total_bytes)),
        ("per chip: XLA peak", lambda r: _gib(r.xla_peak_bytes)),
    ]
    flops_rows = [
        ("compiled TFLOP/step per chip", lambda r: f"{r.flops_per_device / 1e12:.4g}"),
        ("compiled TFLOP/step total", lambda r: f"{r.flops_total / 1e12:.4g}"),
    ]
    rows = [
        ("topology", lambda r: r.topology),
        ("device kind", lambda r: r.device_kind),
        ("chips (hosts)", lambda r: f"{r.num_chips} ({r.num_hosts})"),
        ("mesh dcn_data,data,fsdp,tensor", lambda r: ",".join(str(size) for size in r.mesh.values())),
        ("global batch x seq", lambda r: f"{r.batch_size} x {r.seq_length}"),
        ("dtype, parameters", lambda r: f"{r.dtype}, {r.num_params / 1e6:.1f}M"),
        *compiled_rows,
        ("to other slices per chip", lambda r: ", ".join(f"{kind.lower()} {size / 2**20:.3g} MiB"
                                                          for kind, size in sorted(r.dcn_bytes.items())) or "-"),
        ("HBM per chip", lambda r: _gib(r.hbm_bytes)),
        ("fits", fits_verdict),
        *flops_rows,
        ("model TFLOP/step per chip", lambda r: f"{r.model_flops_per_device / 1e12:.4g}"),
        ("executed matmul TFLOP/step per chip", lambda r: f"{r.executed_flops_per_device / 1e12:.4g}"),
        ("compiled / executed matmul FLOPs", lambda r: f"{r.flops_ratio:.3f}" + (" *" if r.while_loops else "")),
        ("lower / compile time", lambda r: f"{r.lower_seconds:.1f} s / {r.compile_seconds:.1f} s"),
    ]
    needs_compiled = {label for label, _ in compiled_rows + flops_rows} | {"compiled / executed matmul FLOPs"}
    cells = [[label] + ["-" if report.out_of_memory and label in needs_compiled else value(report)
                        for report in reports] for label, value in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
