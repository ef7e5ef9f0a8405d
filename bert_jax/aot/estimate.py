"""The planner's figures between compiles: a report's predicted step time (bert_jax.chips on XLA's figures), the
fit with headroom, and every other size extrapolated from compiles at two batches (PROBE_ROWS) and, for a deep model,
two depths (PROBE_DEPTHS): memory, FLOPs and bytes are close to linear in the batch and in the depth."""

import dataclasses
import math

from bert_jax import chips as chips_lib
from bert_jax.aot.report import AotReport

PROBE_ROWS = (8, 32)  # the two small batches per shard every candidate is compiled at
# A deeper model is compiled at these depths and extrapolated (compile time grows with the depth). Not from one
# layer: the last computes only the rows the heads read, and BERT-base's memory extrapolated from 1 and 2 layers
# came out 13% under the full compile's (from 2 and 3: 4% over).
PROBE_DEPTHS = (2, 3)


def fits_with_headroom(report: AotReport, headroom: float, hbm_bytes: int = 0) -> bool:
    """XLA compiled it, and it leaves `headroom` of the HBM free (`hbm_bytes`, default the chip's)."""
    return report.fits and report.needed_bytes <= (1 - headroom) * (hbm_bytes or report.hbm_bytes)


def chip_of(topology: str) -> chips_lib.Chip:
    return chips_lib.CHIPS[topology.split(":", 1)[0]]


def _work(report: AotReport) -> tuple[float, float, float]:
    """FLOPs, bytes accessed and collective bytes of one chip's step. XLA counts a while loop's body once
    (scan_layers, accumulation, its own collective-matmul loops): where the program has loops and its FLOPs fall
    short of the matmuls the step executes, all three are scaled up by that shortfall."""
    scale = 1.0
    if report.while_loops and report.flops_per_device:
        scale = max(1.0, report.executed_flops_per_device / report.flops_per_device)
    return (report.flops_per_device * scale, report.bytes_accessed * scale,
            sum(report.collective_bytes.values()) * scale)


def predict(report: AotReport, chip: chips_lib.Chip, fixed_bytes: float = 0.0) -> chips_lib.Estimate:
    """The step time of one compiled micro-step on `chip` (bert_jax.chips.estimate); `fixed_bytes`: the traffic
    that does not grow with the batch (fixed_traffic)."""
    flops, traffic, collectives = _work(report)
    return chips_lib.estimate(chip, flops, traffic, collectives, sum(report.dcn_bytes.values()), fixed_bytes)


def fixed_traffic(rows_a: int, report_a: AotReport, rows_b: int, report_b: AotReport) -> float:
    """The bytes accessed at zero batch, by the line through two compiles of one candidate: the state the optimizer
    reads and writes, and the weights."""
    intercept, _ = line(rows_a, _work(report_a)[1], rows_b, _work(report_b)[1])
    return min(max(intercept, 0.0), _work(report_a)[1])


def line(x1: float, y1: float, x2: float, y2: float) -> tuple[float, float]:
    """(intercept, slope) of the line through two points."""
    slope = (y2 - y1) / (x2 - x1)
    return y1 - slope * x1, slope


def saturation_rows(intercept: float, slope: float, saturation: float) -> float:
    """The batch at which rows / (intercept + slope * rows) reaches `saturation` of its limit 1 / slope."""
    if slope <= 0 or saturation >= 1:
        return math.inf
    return max(1.0, saturation * intercept / (slope * (1 - saturation)))


# Fields of an AotReport that grow linearly with the batch and with the depth (so bilinearly with both).
_EXTRAPOLATED = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes",
                 "xla_peak_bytes", "flops_per_device", "model_flops_per_device", "executed_flops_per_device",
                 "bytes_accessed", "optimal_seconds", "num_params")


def extrapolate(shallow: dict[tuple[int, int], AotReport], rows_probed: list[int], depths: tuple[int, ...],
                rows: int, num_layers: int) -> AotReport:
    """The report of a `num_layers`-deep step at `rows` per shard, from compiles of the same step at two batches
    (`rows_probed`) and one depth (`depths` (0,): the model's own) or two: each figure on the line through the
    batches at each depth, then on the line through the depths. Compile time fields are 0: nothing was compiled
    at this size."""
    r1, r2 = rows_probed

    def value(get) -> float:
        at_depth = [line(r1, get(shallow[r1, depth]), r2, get(shallow[r2, depth])) for depth in depths]
        values = [intercept + slope * rows for intercept, slope in at_depth]
        if len(depths) == 2:
            intercept, slope = line(depths[0], values[0], depths[1], values[1])
            values = [intercept + slope * num_layers]
        return max(0.0, values[0])

    base = shallow[r2, depths[-1]]
    fields = {name: value(lambda report, name=name: getattr(report, name)) for name in _EXTRAPOLATED}
    for name in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes",
                 "xla_peak_bytes", "num_params"):
        fields[name] = int(round(fields[name]))
    kinds = {kind for report in shallow.values() for kind in report.collective_bytes}
    slices = {kind for report in shallow.values() for kind in report.dcn_bytes}
    return dataclasses.replace(
        base, **fields, batch_size=base.batch_size // r2 * rows, lower_seconds=0.0, compile_seconds=0.0,
        while_loops=max(report.while_loops for report in shallow.values()),
        collective_bytes={kind: int(value(lambda report, kind=kind: report.collective_bytes.get(kind, 0)))
                          for kind in sorted(kinds)},
        dcn_bytes={kind: int(value(lambda report, kind=kind: report.dcn_bytes.get(kind, 0)))
                   for kind in sorted(slices)})
