"""What compiling the train step for one topology found (AotReport), and the table that prints it."""

import dataclasses
import re

from bert_jax import chips as chips_lib

GIB = 1 << 30
# Nominal HBM per chip (GiB), for the "fits" verdict. The runtime keeps a little for itself, so treat a step within
# a few percent of the limit as not fitting.
HBM_GIB_PER_CHIP = {name: chip.hbm_gib for name, chip in chips_lib.CHIPS.items()}


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


# The table's rows (label, cell of a report); those of _COMPILED_ROWS and _FLOPS_ROWS need a compiled step.
_COMPILED_ROWS = [
    ("per chip: arguments", lambda r: _gib(r.argument_bytes)),
    ("per chip: outputs", lambda r: _gib(r.output_bytes)),
    ("per chip: donated (aliased)", lambda r: _gib(r.alias_bytes)),
    ("per chip: temporaries", lambda r: _gib(r.temp_bytes)),
    ("per chip: generated code", lambda r: _gib(r.generated_code_bytes)),
    ("per chip: total", lambda r: _gib(r.total_bytes)),
    ("per chip: XLA peak", lambda r: _gib(r.xla_peak_bytes)),
]
_FLOPS_ROWS = [
    ("compiled TFLOP/step per chip", lambda r: f"{r.flops_per_device / 1e12:.4g}"),
    ("compiled TFLOP/step total", lambda r: f"{r.flops_total / 1e12:.4g}"),
]
_ROWS = [
    ("topology", lambda r: r.topology),
    ("device kind", lambda r: r.device_kind),
    ("chips (hosts)", lambda r: f"{r.num_chips} ({r.num_hosts})"),
    ("mesh dcn_data,data,fsdp,tensor", lambda r: ",".join(str(size) for size in r.mesh.values())),
    ("global batch x seq", lambda r: f"{r.batch_size} x {r.seq_length}"),
    ("dtype, parameters", lambda r: f"{r.dtype}, {r.num_params / 1e6:.1f}M"),
    *_COMPILED_ROWS,
    ("to other slices per chip", lambda r: ", ".join(f"{kind.lower()} {size / 2**20:.3g} MiB"
                                                      for kind, size in sorted(r.dcn_bytes.items())) or "-"),
    ("HBM per chip", lambda r: _gib(r.hbm_bytes)),
    ("fits", fits_verdict),
    *_FLOPS_ROWS,
    ("model TFLOP/step per chip", lambda r: f"{r.model_flops_per_device / 1e12:.4g}"),
    ("executed matmul TFLOP/step per chip", lambda r: f"{r.executed_flops_per_device / 1e12:.4g}"),
    ("compiled / executed matmul FLOPs", lambda r: f"{r.flops_ratio:.3f}" + (" *" if r.while_loops else "")),
    ("lower / compile time", lambda r: f"{r.lower_seconds:.1f} s / {r.compile_seconds:.1f} s"),
]
_NEEDS_COMPILED = {label for label, _ in _COMPILED_ROWS + _FLOPS_ROWS} | {"compiled / executed matmul FLOPs"}


def format_reports(reports: list[AotReport]) -> str:
    """A table with one column per compiled topology ("-" where XLA refused a step too large for the chip)."""
    cells = [[label] + ["-" if report.out_of_memory and label in _NEEDS_COMPILED else value(report)
                        for report in reports] for label, value in _ROWS]
    widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
