"""The search for one candidate's batch: the micro-batch per data-parallel shard that fits with headroom and
stops paying in throughput (or reaches --plan_batch by accumulation), in a few compiles, and the compile that
confirms an extrapolated answer. Compiling itself is the caller's `compile_at(rows, accum_steps, depth)`."""

import dataclasses
import math
from typing import Callable

from bert_jax.aot import estimate
from bert_jax.aot.estimate import PROBE_DEPTHS, PROBE_ROWS
from bert_jax.aot.plan import Candidate, PlanRow, PlanSpec
from bert_jax.aot.report import GIB, AotReport

MAX_ROWS_PER_SHARD = 4096

# compile_at(rows per shard, accumulation steps, depth (0: the model's own)) -> the compiled step's report
CompileAt = Callable[[int, int, int], AotReport]


def search(spec: PlanSpec, candidate: Candidate, compile_at: CompileAt, log: Callable[[str], None] = lambda line: None,
           target_rows: int = 0, num_layers: int = 0) -> PlanRow:
    """The micro-batch per data-parallel shard for `candidate` (see bert_jax.aot.planner) and its predicted step
    time. `target_rows`: the rows per shard of each optimizer step (--plan_batch), reached by accumulation;
    0 leaves the batch free. A model deeper than PROBE_DEPTHS is compiled only at those depths, and its figures
    extrapolated to its own (the row is then not `confirmed`: see `confirm`). `num_layers`: the model's depth
    (default spec.config's)."""
    searcher = _BatchSearch(spec, candidate, compile_at, log, target_rows, num_layers)
    searcher.probe()
    searcher.climb()
    searcher.check_smallest()
    return searcher.plan_row()


class _BatchSearch:
    """search's state, threaded through its steps: every report measured so far, by batch, and the bracket
    [low fits, high does not] the search narrows."""

    def __init__(self, spec: PlanSpec, candidate: Candidate, compile_at: CompileAt, log: Callable[[str], None],
                 target_rows: int, num_layers: int):
        self.candidate, self.compile_at, self.log = candidate, compile_at, log
        self.headroom, self.resolution, self.saturation = spec.headroom, spec.resolution, spec.saturation
        self.target_rows = target_rows
        self.chip = spec.chip
        self.budget = spec.budget
        self.num_layers = num_layers or spec.config.model.num_layers
        self.compiled: dict[tuple[int, int, int], AotReport] = {}

        self.probes = sorted({self.at_most(PROBE_ROWS[0]), self.at_most(PROBE_ROWS[1])})
        # The compiles every figure below is extrapolated from: two batches, at two shallow depths for a deep model.
        self.depths = PROBE_DEPTHS if self.num_layers > PROBE_DEPTHS[-1] else (0,)
        self.shallow = None
        if len(self.probes) == 2:
            self.shallow = {(rows, depth): self.compile_once(rows, 1, depth)
                            for depth in self.depths for rows in self.probes}
            if any(report.out_of_memory for report in self.shallow.values()):
                self.shallow = None  # XLA refused one: no line to follow; compile at the model's own depth instead

        self.real: set[int] = set()  # batches whose report is a compile of the step as it is (not extrapolated)
        self.low, self.high, self.reports, self.last = 0, None, {}, 0
        self.goal, self.limit = self.at_most(MAX_ROWS_PER_SHARD), "target" if target_rows else "cap"
        self.slope_s = self.fixed = 0.0

    def compile_once(self, rows: int, accum: int = 1, depth: int = 0) -> AotReport:
        if (rows, accum, depth) not in self.compiled:
            self.compiled[rows, accum, depth] = self.compile_at(rows, accum, depth)
            _log_compile(self.log, self.candidate, rows, accum, depth, self.compiled[rows, accum, depth],
                         self.headroom, self.budget)
        return self.compiled[rows, accum, depth]

    def at_most(self, rows: float) -> int:
        return _at_most(rows, self.target_rows)

    def above(self, rows: int) -> int | None:
        limit = self.target_rows or MAX_ROWS_PER_SHARD
        return next((d for d in range(rows + 1, limit + 1) if not self.target_rows or self.target_rows % d == 0),
                    None)

    def fits(self, report: AotReport) -> bool:
        return estimate.fits_with_headroom(report, self.headroom, self.budget)

    def measure(self, rows: int) -> tuple[bool, AotReport]:
        if self.shallow is None or (self.depths == (0,) and rows in self.probes):
            report = self.compile_once(rows)
            self.real.add(rows)
        else:
            report = estimate.extrapolate(self.shallow, self.probes, self.depths, rows, self.num_layers)
        return self.fits(report), report

    def compiled_at(self, rows: int) -> bool:
        return rows in self.real

    def probe(self) -> None:
        """Two small batches: the lines for memory and step time."""
        probes, reports = self.probes, self.reports
        for rows in probes:
            ok, report = self.measure(rows)
            reports[rows] = report
            if not ok:
                self.high = rows
                break
            self.low = rows
        if self.low and self.high is None and len(probes) == 2:
            self.fixed = estimate.fixed_traffic(probes[0], reports[probes[0]], probes[1], reports[probes[1]])
            seconds = [estimate.predict(reports[rows], self.chip, self.fixed).seconds for rows in probes]
            intercept_s, self.slope_s = estimate.line(probes[0], seconds[0], probes[1], seconds[1])
            if not self.target_rows:
                enough = estimate.saturation_rows(intercept_s, self.slope_s, self.saturation)
                if enough < self.goal:
                    self.goal, self.limit = self.at_most(max(enough, probes[1])), "throughput"

    def climb(self) -> None:
        """Towards the goal along the memory line; between a fit and a misfit, by the line through them, else
        halves."""
        while (rows := self._next_rows()) is not None:
            ok, report = self.measure(rows)
            self.reports[rows], self.last = report, rows
            if ok:
                self.low = rows
            else:
                self.high = rows

    def _next_rows(self) -> int | None:
        """The next batch to measure; None when the search is over (self.limit "memory" where memory ended it)."""
        low, high = self.low, self.high
        if high is None and low >= self.goal:
            return None
        if high is not None and (high - low <= max(1, math.floor(low * self.resolution))
                                 or self.above(low) in (None, high)):
            self.limit = "memory"
            return None
        rows = self.at_most(self._guess())
        if rows <= low:
            rows = self.above(low)
            if rows is None:
                return None
        if high is not None and rows >= high:
            rows = self.at_most((low + high) // 2)
            if rows <= low:
                self.limit = "memory"
                return None
        return rows

    def _guess(self) -> float:
        low, high, reports, goal = self.low, self.high, self.reports, self.goal
        usable = self.budget * (1 - self.headroom)
        fitting = sorted(rows for rows in reports if self.fits(reports[rows]))
        if high is not None and low:
            step = max(1, math.floor(low * self.resolution))
            if self.last == low and low + step < high:
                # A line through a fit and a misfit undershoots a convex memory curve: the next fit it predicts
                # creeps up one row at a time. One step of the resolution past a fit ends the search instead.
                return low + step
            guess = _memory_guess(low, reports[low], high, reports[high], usable)
            return guess if low < guess < high else (low + high) // 2
        if high is not None:
            return high // 2
        if len(fitting) >= 2:
            guess = _memory_guess(fitting[-2], reports[fitting[-2]], fitting[-1], reports[fitting[-1]], usable)
            # The line is a prediction: step past the last fit at least by the resolution, so that a line that
            # undershoots still ends the search; never beyond the goal.
            guess = max(guess, low + max(1, math.floor(low * self.resolution)))
            return min(guess, goal)
        return min(low * 2, goal)

    def check_smallest(self) -> None:
        if self.low == 0 and self.high is not None and not self.compiled_at(self.high):
            # Nothing fits by the lines: a compile at the smallest batch says so for certain (or finds that it fits).
            high = self.high
            self.reports[high] = self.compile_once(high)
            self.real.add(high)
            if self.fits(self.reports[high]):
                self.low, self.high = high, None

    def plan_row(self) -> PlanRow:
        candidate, compiled, probes, reports = self.candidate, self.compiled, self.probes, self.reports
        low, high, target_rows = self.low, self.high, self.target_rows
        not_fitting = reports.get(high) if high is not None else None
        bytes_per_row = 0.0
        if len(probes) == 2 and probes[-1] in reports:
            bytes_per_row = estimate.line(probes[0], reports[probes[0]].needed_bytes,
                                  probes[1], reports[probes[1]].needed_bytes)[1]
        if low == 0:
            return PlanRow(candidate, 0, not_fitting, not_fitting, len(compiled), limit="memory",
                           confirmed=high is None or self.compiled_at(high))
        accum = target_rows // low if target_rows else 1
        report = reports[low]
        confirmed = self.compiled_at(low) and accum == 1
        # The memory of the real accumulating step; its time is accum micro-steps'.
        if accum > 1 and self.shallow is None:
            accumulated = self.compile_once(low, accum)
            if not self.fits(accumulated):
                return PlanRow(candidate, 0, accumulated, accumulated, len(compiled), limit="memory")
            confirmed = True
        step_time = estimate.predict(report, self.chip, self.fixed)
        return PlanRow(candidate, low, report, not_fitting, len(compiled), accum_steps=accum, limit=self.limit,
                       seconds=step_time.seconds * accum, bound=step_time.bound,
                       ceiling_rows_per_s=1 / self.slope_s if self.slope_s > 0 else 0.0, confirmed=confirmed,
                       fixed_bytes=self.fixed, bytes_per_row=bytes_per_row, target_rows=target_rows)


def _at_most(rows: float, target_rows: int = 0) -> int:
    """The largest batch per shard allowed at or below `rows` (at least 1): any up to MAX_ROWS_PER_SHARD, or with a
    target, a divisor of it (the rest is accumulated)."""
    rows = max(1, int(min(rows, target_rows or MAX_ROWS_PER_SHARD)))
    if not target_rows:
        return rows
    return max(d for d in range(1, rows + 1) if target_rows % d == 0)


def _log_compile(log, candidate: Candidate, rows: int, accum: int, depth: int, report: AotReport,
                 headroom: float, budget: int) -> None:
    verdict = "fits" if estimate.fits_with_headroom(report, headroom, budget) else "does not fit"
    log(f"  {candidate.label} rows/shard={rows}{f' x {accum} accumulated' if accum > 1 else ''}"
        f"{f' ({depth} layers)' if depth else ''}: {report.needed_bytes / GIB:.2f} GiB, compiled in "
        f"{report.compile_seconds:.0f} s -> {verdict}")


def confirm(spec: PlanSpec, row: PlanRow, compile_at: CompileAt, log: Callable[[str], None] = lambda line: None,
            attempts: int = 4) -> PlanRow:
    """`row`, searched on extrapolated figures, compiled as it is. Where it does not fit: smaller, first by the
    memory line shifted to what the compile found, then between the compiled fit and misfit, at most `attempts`
    compiles in all. Its step time becomes the compiled step's (with accumulation: the extrapolated micro-step's,
    the compile giving the memory)."""
    headroom, budget, target = spec.headroom, spec.budget, row.target_rows
    rows, low, high = row.rows_per_shard, None, None  # (rows, report) of the largest compiled fit, smallest misfit
    for done in range(1, attempts + 1):
        accum = target // rows if target else 1
        report = compile_at(rows, accum, 0)
        _log_compile(log, row.candidate, rows, accum, 0, report, headroom, budget)
        if estimate.fits_with_headroom(report, headroom, budget):
            low = (rows, report)
        else:
            high = (rows, report)
        if low is not None and (high is None or high[0] - low[0] <= max(1, math.floor(low[0] * spec.resolution))):
            break
        rows = _smaller(row, rows, report, low, high, budget * (1 - headroom))
        if not rows:
            break
    return _confirmed_row(spec, row, low, high, done)


def _smaller(row: PlanRow, rows: int, report: AotReport, low, high, usable: float) -> int:
    """confirm's next batch below the last compiled one (`rows`, `report`) under `usable` bytes; 0: none left
    between the compiled fit `low` and misfit `high`."""
    if low is not None:
        guess = _memory_guess(low[0], low[1], high[0], high[1], usable)
        guess = guess if low[0] < guess < high[0] else (low[0] + high[0]) // 2
    else:
        excess = (report.needed_bytes - usable if not report.out_of_memory
                  else rows * row.bytes_per_row / 2)
        shrink = math.ceil(excess / row.bytes_per_row) if row.bytes_per_row > 0 else rows // 2
        guess = rows - max(1, shrink)
    following = _at_most(guess, row.target_rows) if guess >= 1 else 0
    if not following or (low is not None and following <= low[0]) or (high is not None and following >= high[0]):
        return 0
    return following


def _confirmed_row(spec: PlanSpec, row: PlanRow, low, high, count: int) -> PlanRow:
    """`row` after confirm's `count` compiles found the fit `low` and misfit `high` ((rows, report) or None)."""
    if low is None:
        return dataclasses.replace(row, rows_per_shard=0, report=high[1], not_fitting=high[1], limit="memory",
                                   compiles=row.compiles + count, confirmed=True)
    rows, report = low
    limit = row.limit if high is None else "memory"
    not_fitting = high[1] if high is not None else row.not_fitting
    accum = row.target_rows // rows if row.target_rows else 1
    if accum > 1:  # the time of accumulated micro-steps hardly depends on their size: the row's stands
        return dataclasses.replace(
            row, rows_per_shard=rows, accum_steps=accum, compiles=row.compiles + count, limit=limit,
            report=dataclasses.replace(row.report, batch_size=report.batch_size // accum), not_fitting=not_fitting,
            confirmed=True)
    step_time = estimate.predict(report, spec.chip, row.fixed_bytes)
    return dataclasses.replace(row, rows_per_shard=rows, report=report, compiles=row.compiles + count, limit=limit,
                               not_fitting=not_fitting, seconds=step_time.seconds, bound=step_time.bound,
                               confirmed=True)


def _memory_guess(rows_a: int, report_a: AotReport, rows_b: int, report_b: AotReport, budget: float) -> int:
    """Where the memory line through two compiled batches reaches `budget` (an XLA refusal counts as over it:
    then the guess is halfway)."""
    if report_b.out_of_memory or report_a.out_of_memory or report_b.needed_bytes == report_a.needed_bytes:
        return (rows_a + rows_b) // 2
    intercept, slope = estimate.line(rows_a, report_a.needed_bytes, rows_b, report_b.needed_bytes)
    if slope <= 0:
        return 2 * max(rows_a, rows_b)
    return math.floor((budget - intercept) / slope)
