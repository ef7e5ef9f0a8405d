"""The plan: what a plan searches for (PlanSpec), its candidates and rows, the fastest row, and its printing."""

import dataclasses
import time
from typing import Any

from bert_jax import chips as chips_lib
from bert_jax.aot import estimate
from bert_jax.aot.report import GIB, AotReport, fits_verdict

REMAT_CANDIDATES = ("none", "matmuls", "full")  # in order of recomputation
# Stop searching once a batch that fits and one that does not are within this fraction of the one that fits.
RESOLUTION = 1 / 8
# The fraction of a configuration's throughput ceiling (its rows per second at an unbounded batch) at which a
# larger batch is not worth its memory and its effect on the optimisation.
SATURATION = 0.98


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """What one plan searches: `config` on `num_slices` x `topology`, and the search's settings (the --plan_*
    flags). Built once; the search reads it rather than a dozen arguments."""

    config: Any  # the run's resolved ml_collections config (None where tests give the compiler)
    topology: str
    num_slices: int = 1
    headroom: float = 0.1  # the fraction of HBM a configuration must leave free
    hbm_bytes: int = 0  # the memory per chip to fit; 0: the chip's
    remats: tuple[str, ...] = REMAT_CANDIDATES
    scans: tuple[bool, ...] = (False, True)
    meshes: tuple[tuple[int, int, int], ...] | None = None  # (data, fsdp, tensor) splits; None: candidate_meshes
    resolution: float = RESOLUTION
    saturation: float = SATURATION
    target_batch: int = 0  # the global batch per optimizer step to reach; 0: free

    def __post_init__(self):
        if not 0 <= self.headroom < 1:
            raise ValueError(f"--plan_headroom={self.headroom}: must be in [0, 1)")
        if not 0 < self.resolution < 1:
            raise ValueError(f"--plan_resolution={self.resolution}: must be in (0, 1)")
        if not 0 < self.saturation <= 1:
            raise ValueError(f"--plan_saturation={self.saturation}: must be in (0, 1]")
        if self.target_batch < 0:
            raise ValueError(f"--plan_batch={self.target_batch}: must be positive (0: the batch is free)")
        if self.hbm_bytes < 0:
            raise ValueError(f"--plan_hbm_gib={self.hbm_bytes / GIB}: must be positive (0: the chip's HBM)")

    @property
    def chip(self) -> chips_lib.Chip:
        return estimate.chip_of(self.topology)

    @property
    def budget(self) -> int:
        """The HBM per chip a configuration must fit (less the headroom)."""
        return self.hbm_bytes or self.chip.hbm_bytes

    @property
    def where(self) -> str:
        return self.topology if self.num_slices == 1 else f"{self.num_slices} x {self.topology}"


@dataclasses.dataclass(frozen=True)
class Candidate:
    data: int
    fsdp: int
    tensor: int
    remat: str
    scan_layers: bool

    @property
    def label(self) -> str:
        return f"{self.data},{self.fsdp},{self.tensor} remat={self.remat} scan={'on' if self.scan_layers else 'off'}"


@dataclasses.dataclass(frozen=True)
class PlanRow:
    candidate: Candidate
    rows_per_shard: int  # the micro-batch per data-parallel shard chosen; 0: none fits (or skipped)
    report: AotReport | None  # at that batch (one row per shard when none fits); None: skipped
    not_fitting: AotReport | None  # the smallest batch searched that does not fit (None: none did)
    compiles: int  # configurations compiled for this row (the cache's included)
    accum_steps: int = 1
    limit: str = ""  # what stopped the batch: memory, throughput, target, cap; or why the candidate was skipped
    seconds: float = 0.0  # predicted seconds per optimizer step
    bound: str = ""
    ceiling_rows_per_s: float = 0.0  # rows per second per shard at an unbounded batch, by the step-time line
    confirmed: bool = True  # compiled as it is (else extrapolated from compiles at other batches or depths)
    fixed_bytes: float = 0.0  # bytes accessed that do not grow with the batch (fixed_traffic)
    bytes_per_row: float = 0.0  # memory per row per shard, by the line through the two smallest batches
    target_rows: int = 0  # rows per shard per optimizer step asked for (--plan_batch); 0: free

    @property
    def fits(self) -> bool:
        return self.rows_per_shard > 0

    @property
    def global_batch(self) -> int:
        return self.report.batch_size * self.accum_steps if self.report else 0

    @property
    def sequences_per_s_per_chip(self) -> float:
        return self.global_batch / self.seconds / self.report.num_chips if self.fits and self.seconds else 0.0

    def mfu(self, chip: chips_lib.Chip) -> float:
        if not (self.fits and self.seconds):
            return 0.0
        return self.report.model_flops_per_device * self.accum_steps / self.seconds / chip.peak_flops


def best(rows: list[PlanRow]) -> PlanRow | None:
    """The row with the most predicted sequences per second per chip; among equals, the larger batch."""
    fitting = [row for row in rows if row.fits]
    if not fitting:
        return None
    return max(fitting, key=lambda row: (round(row.sequences_per_s_per_chip, 6), row.global_batch))


def flag_line(row: PlanRow, num_slices: int) -> str:
    """The driver flags that run `row`."""
    candidate = row.candidate
    return (f"--config.mesh.dcn_data={num_slices} --config.mesh.data={candidate.data} "
            f"--config.mesh.fsdp={candidate.fsdp} --config.mesh.tensor={candidate.tensor} "
            f"--config.model.remat={candidate.remat} --config.model.scan_layers={candidate.scan_layers} "
            f"--config.train.batch_size={row.global_batch} --config.optim.grad_accum_steps={row.accum_steps}")


def _size(value: float) -> str:
    return f"{value / GIB:.3g}"


_HEADER = ["mesh d,f,t  remat  scan", "rows/shard", "accum", "global batch", "total / HBM", "TFLOP/chip",
           "collectives/chip", "to other slices/chip", "step s", "seq/s/chip", "MFU", "bound", "XLA s",
           "limit (next size up)"]


def format_plan(rows: list[PlanRow], headroom: float, hbm_bytes: int = 0, chip: chips_lib.Chip | None = None) -> str:
    """One line per candidate, fastest first: the batch found, its memory (GiB per chip), the compiler's FLOPs and
    collective bytes, and the predicted step time, throughput and MFU; '*' marks figures from a program with while
    loops (XLA counts their bodies once; the prediction scales them up)."""
    order = sorted(rows, key=lambda row: (not row.fits, -row.sequences_per_s_per_chip))
    # Skipped rows (no report) are listed below the table, by reason.
    cells = [_HEADER] + [_cells(row, hbm_bytes, chip) for row in order if row.report is not None]
    widths = [max(len(line[column]) for line in cells) for column in range(len(_HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    lines.extend(_skipped_lines(rows))
    lines.append(_legend(headroom))
    return "\n".join(lines)


def _cells(row: PlanRow, hbm_bytes: int, chip: chips_lib.Chip | None) -> list[str]:
    """The table's line for a searched row."""
    report = row.report
    label = (f"{row.candidate.data},{row.candidate.fsdp},{row.candidate.tensor}  {row.candidate.remat}  "
             f"{'on' if row.candidate.scan_layers else 'off'}")
    loops = " *" if report.while_loops else ""
    budget = hbm_bytes or report.hbm_bytes
    if not row.fits:
        return [label, "0", "-", "-", f"NO at global batch {report.batch_size}: {fits_verdict(report)}",
                "-", "-", "-", "-", "-", "-", "-", "-", "memory"]
    next_up = ""
    if row.not_fitting is not None:
        above = row.not_fitting
        next_up = f" ({above.batch_size}: " + (
            "XLA out of memory)" if above.out_of_memory else f"{_size(above.needed_bytes)} GiB)")
    return [
        label, str(row.rows_per_shard), str(row.accum_steps), str(row.global_batch),
        f"{_size(report.needed_bytes)} / {_size(budget)} ({report.needed_bytes / budget:.0%})",
        f"{report.flops_per_device / 1e12:.4g}{loops}",
        f"{sum(report.collective_bytes.values()) / 2**20:.4g} MiB{loops}",
        f"{sum(report.dcn_bytes.values()) / 2**20:.4g} MiB" if report.dcn_bytes else "-",
        f"{row.seconds:.4g}{'' if row.confirmed else ' ~'}", f"{row.sequences_per_s_per_chip:.4g}",
        f"{row.mfu(chip):.0%}" if chip else "-", row.bound,
        f"{report.optimal_seconds * row.accum_steps:.3g}" if report.optimal_seconds else "-",
        row.limit + next_up]


def _skipped_lines(rows: list[PlanRow]) -> list[str]:
    skipped: dict[str, list[str]] = {}
    for row in rows:
        if row.report is None:
            skipped.setdefault(row.limit.removeprefix("skipped: "), []).append(
                f"{row.candidate.data},{row.candidate.fsdp},{row.candidate.tensor} {row.candidate.remat} "
                f"{'on' if row.candidate.scan_layers else 'off'}")
    return [f"not searched, {reason}: {'; '.join(labels)}" for reason, labels in skipped.items()]


def _legend(headroom: float) -> str:
    return (
        f"Memory in GiB per chip, leaving {headroom:.0%} of HBM free. step s: predicted seconds per optimizer step "
        "from XLA's figures for the compiled step (bert_jax.chips): the traffic that does not grow with the batch at "
        "HBM bandwidth, then the larger of the rest's FLOPs / peak and bytes / HBM bandwidth, then collectives / ICI "
        "and transfers / DCN bandwidth. XLA s: XLA's own cost_analysis optimal_seconds, beside it (negative where "
        "XLA could not cost an instruction). * while loops: XLA counts their bodies once (the prediction scales "
        f"them up). ~ extrapolated from the probe compiles (at {estimate.PROBE_ROWS[0]} and "
        f"{estimate.PROBE_ROWS[1]} rows per shard; at {estimate.PROBE_DEPTHS[0]} and {estimate.PROBE_DEPTHS[1]} "
        "layers for a deeper model): the fastest are compiled at their answer until the first is.")


def print_plan(spec: PlanSpec, rows: list[PlanRow], cache_hits: int, cache_dir: str, start: float,
               print_fn) -> None:
    """The --plan command's output: the heading, the table, the compile count and the flags of the best row
    (`start`: the time.perf_counter() at which the command began)."""
    config, chip = spec.config, spec.chip
    dtype = next((row.report.dtype for row in rows if row.report is not None), config.model.dtype)
    print_fn(f"\nplan for {spec.where} ({chip.name}: {chip.peak_flops / 1e12:.0f} TFLOP/s, "
             f"{chip.hbm_bytes_per_s / 1e9:.0f} GB/s HBM, {chip.ici_bytes_per_s / 1e9:.0f} GB/s all-reduce per chip), "
             f"{config.model.num_layers} layers x {config.model.hidden_size}, seq {config.data.max_seq_length}, "
             f"{dtype}" + (f", global batch {spec.target_batch}" if spec.target_batch else "") + ":")
    print_fn(format_plan(rows, spec.headroom, spec.hbm_bytes, chip))
    chosen = best(rows)
    compiles = sum(row.compiles for row in rows)
    print_fn(f"{compiles} configurations ({compiles - cache_hits} compiled, {cache_hits} from the cache "
             f"{cache_dir or '(off)'}) in {time.perf_counter() - start:.0f} s")
    if chosen is None:
        print_fn(f"nothing fits {spec.where} with {spec.headroom:.0%} headroom, even at one row per shard: more "
                 "chips, a smaller model or a shorter sequence")
    else:
        print_fn(f"fastest predicted: {chosen.candidate.label}, global batch {chosen.global_batch}"
                 + (f" ({chosen.accum_steps} accumulated micro-batches)" if chosen.accum_steps > 1 else "")
                 + f", {chosen.sequences_per_s_per_chip:.4g} sequences/s per chip\n"
                 f"{flag_line(chosen, spec.num_slices)}")
