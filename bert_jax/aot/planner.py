"""The planner behind `python -m bert_jax.aot --plan`: which mesh, remat policy, layer scan, batch and gradient
accumulation run fastest on a TPU slice (or several), found by compiling candidates ahead of time on any host.

For every candidate (a split of each slice's chips over data, fsdp and tensor; a remat policy; scan_layers) it
compiles the real step at two small batches per data-parallel shard (PROBE_ROWS), a model deeper than
PROBE_DEPTHS at those depths too. Memory, FLOPs and bytes are close to linear in the batch and in the depth, so
every other size is extrapolated from these compiles (`extrapolate`): the memory line gives the largest batch that
leaves `headroom` of the HBM free, the step-time line (bert_jax.chips.estimate on XLA's figures) the batch past
which the chip's throughput cannot grow by more than a few percent (`saturation`), and the smaller of the two is
the candidate's answer. Then the candidates are compiled at their answers in order of predicted throughput until
the fastest is one that was (`confirm`: one that does not fit steps down to what does).

With `target_batch` (--plan_batch) the global batch is fixed: per candidate, the largest micro-batch that fits and
divides it, the rest by gradient accumulation; the step time is the accumulation steps times the micro-step's.

Candidates that cannot win are not compiled: a remat policy that recomputes more than one already found, where that
one is not limited by memory (the same batch with more FLOPs) or is within a percent of what any batch could give
it; scan_layers on where the unrolled step fits at that mesh (the same work in a loop: it saves compile time, not
step time).

Every figure but the prediction is the compiler's (bert_jax.aot.compile_train_step's AotReport), extrapolated where
the row is not `confirmed`. Each compiled configuration's report is kept as JSON under `cache_dir`, keyed by the
whole config, the topology, the slice count, the jax/jaxlib/libtpu versions and CACHE_VERSION, so that a second plan
compiles only what it has not seen.
"""

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import multiprocessing
import os
import pickle
import time
from typing import Callable, Iterable

from bert_jax import aot
from bert_jax import chips as chips_lib

REMAT_CANDIDATES = ("none", "matmuls", "full")  # in order of recomputation
# Stop searching once a batch that fits and one that does not are within this fraction of the one that fits.
RESOLUTION = 1 / 8
# The fraction of a configuration's throughput ceiling (its rows per second at an unbounded batch) at which a
# larger batch is not worth its memory and its effect on the optimisation.
SATURATION = 0.98
PROBE_ROWS = (8, 32)  # the two small batches per shard every candidate is compiled at
# A deeper model is compiled at these depths and extrapolated (compile time grows with the depth). Not from one
# layer: the last computes only the rows the heads read, and BERT-base's memory extrapolated from 1 and 2 layers
# came out 13% under the full compile's (from 2 and 3: 4% over).
PROBE_DEPTHS = (2, 3)
MAX_ROWS_PER_SHARD = 4096
# A recomputing candidate is skipped when the one before it already reaches this fraction of its own ceiling.
PRUNE_MARGIN = 0.01
# Part of every cache key: raise it when AotReport or what fills it changes, so that old reports are not reused.
CACHE_VERSION = 4


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
    report: aot.AotReport | None  # at that batch (one row per shard when none fits); None: skipped
    not_fitting: aot.AotReport | None  # the smallest batch searched that does not fit (None: none did)
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


def candidate_meshes(chips_per_slice: int, num_heads: int) -> list[tuple[int, int, int]]:
    """(data, fsdp, tensor) splits of one slice worth comparing: pure data parallelism, full FSDP, FSDP over
    groups of 8 chips with data parallelism across them, and FSDP with 2- and 4-way tensor parallelism (where the
    heads divide)."""
    meshes = [(chips_per_slice, 1, 1), (1, chips_per_slice, 1)]
    if chips_per_slice > 8 and chips_per_slice % 8 == 0:
        meshes.append((chips_per_slice // 8, 8, 1))
    for tensor in (2, 4):
        if chips_per_slice % tensor == 0 and num_heads % tensor == 0 and chips_per_slice > tensor:
            meshes.append((1, chips_per_slice // tensor, tensor))
    return list(dict.fromkeys(meshes))


def candidates(chips_per_slice: int, num_heads: int, remats: Iterable[str] = REMAT_CANDIDATES,
               scans: Iterable[bool] = (False, True), meshes=None) -> list[Candidate]:
    """Every (mesh, remat, scan) combination; `meshes` (data, fsdp, tensor) default to candidate_meshes."""
    meshes = meshes or candidate_meshes(chips_per_slice, num_heads)
    for mesh in meshes:
        if math.prod(mesh) != chips_per_slice:
            raise ValueError(f"--plan_meshes: {'x'.join(map(str, mesh))} is {math.prod(mesh)} chips, but a slice "
                             f"has {chips_per_slice}")
    remats = sorted(remats, key=REMAT_CANDIDATES.index)
    return [Candidate(*mesh, remat, scan) for mesh in meshes for scan in sorted(scans) for remat in remats]


def configure(config, candidate: Candidate, rows_per_shard: int, num_slices: int, accum_steps: int = 1):
    """A copy of `config` running `candidate` with `rows_per_shard` rows per data-parallel shard in each of
    `accum_steps` micro-batches."""
    config = config.copy_and_resolve_references()
    config.mesh.dcn_data = num_slices
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = candidate.data, candidate.fsdp, candidate.tensor
    config.model.remat, config.model.scan_layers = candidate.remat, candidate.scan_layers
    config.train.batch_size = rows_per_shard * accum_steps * num_slices * candidate.data * candidate.fsdp
    config.optim.grad_accum_steps = accum_steps
    return config


class ReportCache:
    """AotReports on disk, one JSON file per compiled configuration; `directory` "" keeps nothing."""

    def __init__(self, directory: str):
        self.directory = directory
        self.hits = 0
        self._versions = {name: _version(name) for name in ("jax", "jaxlib", "libtpu")}

    def key(self, config, topology: str, num_slices: int) -> str:
        text = json.dumps([CACHE_VERSION, config.to_json(sort_keys=True), topology, num_slices, self._versions],
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get(self, key: str) -> aot.AotReport | None:
        path = os.path.join(self.directory, key + ".json")
        if not self.directory or not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as file:
                report = aot.AotReport(**json.load(file))
        except (OSError, ValueError, TypeError):  # a torn or older file: compile again
            return None
        self.hits += 1
        return report

    def put(self, key: str, report: aot.AotReport) -> None:
        if not self.directory:
            return
        os.makedirs(self.directory, exist_ok=True)
        temporary = os.path.join(self.directory, f".{key}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(dataclasses.asdict(report), file)
        os.replace(temporary, os.path.join(self.directory, key + ".json"))


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


class CompilerCrashedError(RuntimeError):
    """XLA's compiler ended the process that compiled a configuration: a crash, not a verdict on the configuration."""


def compile_report(config, topology: str, num_slices: int, cache: ReportCache) -> aot.AotReport:
    """The configuration's AotReport, from the cache or compiled in a process of its own: libtpu 0.0.42.1 (with jax
    0.10.2) crashed (SIGSEGV) compiling BERT-base's step for v5e:16x16 on an fsdp mesh in a process that had
    compiled a data-parallel one, and compiled it in a fresh one; a crash then costs one candidate, not the plan."""
    key = cache.key(config, topology, num_slices)
    report = cache.get(key)
    if report is None:
        report = _compile_in_a_fresh_process(config, topology, num_slices)
        cache.put(key, report)
    return report


# The next compiling process, started while the current one compiles, so that its interpreter start and imports
# (about 2 s of each compile) overlap the compile: (process, connection), or empty.
_SPARE: list = []


def _compile_in_a_fresh_process(config, topology: str, num_slices: int) -> aot.AotReport:
    process, connection = _SPARE.pop() if _SPARE else _start_compiler()
    if not process.is_alive():  # a spare that died waiting
        connection.close()
        process, connection = _start_compiler()
    _SPARE.append(_start_compiler())
    try:
        connection.send((config, topology, num_slices))
        succeeded, result = connection.recv()
    except (EOFError, ConnectionError):
        raise CompilerCrashedError("XLA's compiler crashed (the compiling process died)") from None
    finally:
        connection.close()
        process.join()
    if not succeeded:
        raise result
    return result


def _start_compiler():
    context = multiprocessing.get_context("spawn")  # never fork a process with JAX's threads running
    connection, child_end = context.Pipe()
    process = context.Process(target=_compile_when_asked, args=(child_end,), daemon=True)
    process.start()
    child_end.close()
    return process, connection


def release_spare() -> None:
    """Stops the waiting spare process (plan() calls it when done)."""
    while _SPARE:
        process, connection = _SPARE.pop()
        connection.close()  # the spare reads end-of-file and exits
        process.join()


def _compile_when_asked(connection) -> None:
    """A compiling process: one configuration from `connection`, its report (or the error) sent back."""
    try:
        config, topology, num_slices = connection.recv()
    except EOFError:  # released unused
        return
    try:
        result = True, aot.compile_train_step(config, topology, num_slices)[1]
    except Exception as error:  # pylint: disable=broad-except  # re-raised in the planner's process
        result = False, error
    try:
        connection.send(result)
    except (pickle.PicklingError, TypeError, AttributeError):  # an error that does not pickle: its text
        connection.send((False, RuntimeError(f"{type(result[1]).__name__}: {result[1]}")))


def fits_with_headroom(report: aot.AotReport, headroom: float, hbm_bytes: int = 0) -> bool:
    """XLA compiled it, and it leaves `headroom` of the HBM free (`hbm_bytes`, default the chip's)."""
    return report.fits and report.needed_bytes <= (1 - headroom) * (hbm_bytes or report.hbm_bytes)


def chip_of(topology: str) -> chips_lib.Chip:
    return chips_lib.CHIPS[topology.split(":", 1)[0]]


def _work(report: aot.AotReport) -> tuple[float, float, float]:
    """FLOPs, bytes accessed and collective bytes of one chip's step. XLA counts a while loop's body once
    (scan_layers, accumulation, its own collective-matmul loops): where the program has loops and its FLOPs fall
    short of the matmuls the step executes, all three are scaled up by that shortfall."""
    scale = 1.0
    if report.while_loops and report.flops_per_device:
        scale = max(1.0, report.executed_flops_per_device / report.flops_per_device)
    return (report.flops_per_device * scale, report.bytes_accessed * scale,
            sum(report.collective_bytes.values()) * scale)


def predict(report: aot.AotReport, chip: chips_lib.Chip, fixed_bytes: float = 0.0) -> chips_lib.Estimate:
    """The step time of one compiled micro-step on `chip` (bert_jax.chips.estimate); `fixed_bytes`: the traffic
    that does not grow with the batch (fixed_traffic)."""
    flops, traffic, collectives = _work(report)
    return chips_lib.estimate(chip, flops, traffic, collectives, sum(report.dcn_bytes.values()), fixed_bytes)


def fixed_traffic(rows_a: int, report_a: aot.AotReport, rows_b: int, report_b: aot.AotReport) -> float:
    """The bytes accessed at zero batch, by the line through two compiles of one candidate: the state the optimizer
    reads and writes, and the weights."""
    intercept, _ = _line(rows_a, _work(report_a)[1], rows_b, _work(report_b)[1])
    return min(max(intercept, 0.0), _work(report_a)[1])


def _line(x1: float, y1: float, x2: float, y2: float) -> tuple[float, float]:
    """(intercept, slope) of the line through two points."""
    slope = (y2 - y1) / (x2 - x1)
    return y1 - slope * x1, slope


def saturation_rows(intercept: float, slope: float, saturation: float) -> float:
    """The batch at which rows / (intercept + slope * rows) reaches `saturation` of its limit 1 / slope."""
    if slope <= 0 or saturation >= 1:
        return math.inf
    return max(1.0, saturation * intercept / (slope * (1 - saturation)))


def search(config, candidate: Candidate, topology: str, num_slices: int, cache: ReportCache, headroom: float,
           hbm_bytes: int = 0, log: Callable[[str], None] = lambda line: None, resolution: float = RESOLUTION,
           saturation: float = SATURATION, target_rows: int = 0,
           compile_at: Callable[[int, int, int], aot.AotReport] | None = None, num_layers: int = 0) -> PlanRow:
    """The micro-batch per data-parallel shard for `candidate` (see the module docstring) and its predicted step
    time. `target_rows`: the rows per shard of each optimizer step (--plan_batch), reached by accumulation;
    0 leaves the batch free. A model deeper than PROBE_DEPTHS is compiled only at those depths, and its figures
    extrapolated to its own (the row is then not `confirmed`: see `confirm`). `compile_at(rows, accum_steps,
    depth)` replaces compiling (tests; depth 0 is the model's own), `num_layers` the config's depth."""
    searcher = _BatchSearch(config, candidate, topology, num_slices, cache, headroom, hbm_bytes, log, resolution,
                            saturation, target_rows, compile_at, num_layers)
    searcher.probe()
    searcher.climb()
    searcher.check_smallest()
    return searcher.plan_row()


class _BatchSearch:
    """search's state, threaded through its steps: every report measured so far, by batch, and the bracket
    [low fits, high does not] the search narrows."""

    def __init__(self, config, candidate: Candidate, topology: str, num_slices: int, cache: ReportCache,
                 headroom: float, hbm_bytes: int, log: Callable[[str], None], resolution: float, saturation: float,
                 target_rows: int, compile_at: Callable[[int, int, int], aot.AotReport] | None, num_layers: int):
        self.config, self.candidate, self.topology, self.num_slices = config, candidate, topology, num_slices
        self.cache, self.headroom, self.log, self.compile_at = cache, headroom, log, compile_at
        self.resolution, self.saturation, self.target_rows = resolution, saturation, target_rows
        self.chip = chip_of(topology)
        self.budget = hbm_bytes or self.chip.hbm_bytes
        self.num_layers = num_layers or config.model.num_layers
        self.compiled: dict[tuple[int, int, int], aot.AotReport] = {}

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

    def compile_once(self, rows: int, accum: int = 1, depth: int = 0) -> aot.AotReport:
        if (rows, accum, depth) not in self.compiled:
            self.compiled[rows, accum, depth] = _compile(self.config, self.candidate, self.topology, self.num_slices,
                                                         self.cache, rows, accum, depth, self.compile_at)
            _log_compile(self.log, self.candidate, rows, accum, depth, self.compiled[rows, accum, depth],
                         self.headroom, self.budget)
        return self.compiled[rows, accum, depth]

    def at_most(self, rows: float) -> int:
        return _at_most(rows, self.target_rows)

    def above(self, rows: int) -> int | None:
        limit = self.target_rows or MAX_ROWS_PER_SHARD
        return next((d for d in range(rows + 1, limit + 1) if not self.target_rows or self.target_rows % d == 0),
                    None)

    def fits(self, report: aot.AotReport) -> bool:
        return fits_with_headroom(report, self.headroom, self.budget)

    def measure(self, rows: int) -> tuple[bool, aot.AotReport]:
        if self.shallow is None or (self.depths == (0,) and rows in self.probes):
            report = self.compile_once(rows)
            self.real.add(rows)
        else:
            report = extrapolate(self.shallow, self.probes, self.depths, rows, self.num_layers)
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
            self.fixed = fixed_traffic(probes[0], reports[probes[0]], probes[1], reports[probes[1]])
            seconds = [predict(reports[rows], self.chip, self.fixed).seconds for rows in probes]
            intercept_s, self.slope_s = _line(probes[0], seconds[0], probes[1], seconds[1])
            if not self.target_rows:
                enough = saturation_rows(intercept_s, self.slope_s, self.saturation)
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
            bytes_per_row = _line(probes[0], reports[probes[0]].needed_bytes,
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
        estimate = predict(report, self.chip, self.fixed)
        return PlanRow(candidate, low, report, not_fitting, len(compiled), accum_steps=accum, limit=self.limit,
                       seconds=estimate.seconds * accum, bound=estimate.bound,
                       ceiling_rows_per_s=1 / self.slope_s if self.slope_s > 0 else 0.0, confirmed=confirmed,
                       fixed_bytes=self.fixed, bytes_per_row=bytes_per_row, target_rows=target_rows)


def _at_most(rows: float, target_rows: int = 0) -> int:
    """The largest batch per shard allowed at or below `rows` (at least 1): any up to MAX_ROWS_PER_SHARD, or with a
    target, a divisor of it (the rest is accumulated)."""
    rows = max(1, int(min(rows, target_rows or MAX_ROWS_PER_SHARD)))
    if not target_rows:
        return rows
    return max(d for d in range(1, rows + 1) if target_rows % d == 0)


def _compile(config, candidate: Candidate, topology: str, num_slices: int, cache: ReportCache, rows: int, accum: int,
             depth: int, compile_at) -> aot.AotReport:
    if compile_at is not None:
        return compile_at(rows, accum, depth)
    configured = configure(config, candidate, rows, num_slices, accum)
    if depth:
        configured.model.num_layers = depth
    return compile_report(configured, topology, num_slices, cache)


def _log_compile(log, candidate: Candidate, rows: int, accum: int, depth: int, report: aot.AotReport,
                 headroom: float, budget: int) -> None:
    verdict = "fits" if fits_with_headroom(report, headroom, budget) else "does not fit"
    log(f"  {candidate.label} rows/shard={rows}{f' x {accum} accumulated' if accum > 1 else ''}"
        f"{f' ({depth} layers)' if depth else ''}: {report.needed_bytes / aot.GIB:.2f} GiB, compiled in "
        f"{report.compile_seconds:.0f} s -> {verdict}")


# Fields of an AotReport that grow linearly with the batch and with the depth (so bilinearly with both).
_EXTRAPOLATED = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes",
                 "xla_peak_bytes", "flops_per_device", "model_flops_per_device", "executed_flops_per_device",
                 "bytes_accessed", "optimal_seconds", "num_params")


def extrapolate(shallow: dict[tuple[int, int], aot.AotReport], rows_probed: list[int], depths: tuple[int, ...],
                rows: int, num_layers: int) -> aot.AotReport:
    """The report of a `num_layers`-deep step at `rows` per shard, from compiles of the same step at two batches
    (`rows_probed`) and one depth (`depths` (0,): the model's own) or two: each figure on the line through the
    batches at each depth, then on the line through the depths. Compile time fields are 0: nothing was compiled
    at this size."""
    r1, r2 = rows_probed

    def value(get) -> float:
        at_depth = [_line(r1, get(shallow[r1, depth]), r2, get(shallow[r2, depth])) for depth in depths]
        values = [intercept + slope * rows for intercept, slope in at_depth]
        if len(depths) == 2:
            intercept, slope = _line(depths[0], values[0], depths[1], values[1])
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


def confirm(config, row: PlanRow, topology: str, num_slices: int, cache: ReportCache, headroom: float,
            hbm_bytes: int = 0, log: Callable[[str], None] = lambda line: None,
            compile_at: Callable[[int, int, int], aot.AotReport] | None = None, attempts: int = 4,
            resolution: float = RESOLUTION) -> PlanRow:
    """`row`, searched on extrapolated figures, compiled as it is. Where it does not fit: smaller, first by the
    memory line shifted to what the compile found, then between the compiled fit and misfit, at most `attempts`
    compiles in all. Its step time becomes the compiled step's (with accumulation: the extrapolated micro-step's,
    the compile giving the memory)."""
    chip = chip_of(topology)
    budget = hbm_bytes or chip.hbm_bytes
    target = row.target_rows
    rows, low, high = row.rows_per_shard, None, None  # (rows, report) of the largest compiled fit, smallest misfit
    for done in range(1, attempts + 1):
        accum = target // rows if target else 1
        report = _compile(config, row.candidate, topology, num_slices, cache, rows, accum, 0, compile_at)
        _log_compile(log, row.candidate, rows, accum, 0, report, headroom, budget)
        if fits_with_headroom(report, headroom, budget):
            low = (rows, report)
        else:
            high = (rows, report)
        if low is not None and (high is None or high[0] - low[0] <= max(1, math.floor(low[0] * resolution))):
            break
        if low is not None:
            guess = _memory_guess(low[0], low[1], high[0], high[1], budget * (1 - headroom))
            guess = guess if low[0] < guess < high[0] else (low[0] + high[0]) // 2
        else:
            excess = (report.needed_bytes - budget * (1 - headroom) if not report.out_of_memory
                      else rows * row.bytes_per_row / 2)
            shrink = math.ceil(excess / row.bytes_per_row) if row.bytes_per_row > 0 else rows // 2
            guess = rows - max(1, shrink)
        following = _at_most(guess, target) if guess >= 1 else 0
        if not following or (low is not None and following <= low[0]) or (high is not None and following >= high[0]):
            break
        rows = following
    count = done
    if low is None:
        return dataclasses.replace(row, rows_per_shard=0, report=high[1], not_fitting=high[1], limit="memory",
                                   compiles=row.compiles + count, confirmed=True)
    rows, report = low
    limit = row.limit if high is None else "memory"
    not_fitting = high[1] if high is not None else row.not_fitting
    accum = target // rows if target else 1
    if accum > 1:  # the time of accumulated micro-steps hardly depends on their size: the row's stands
        return dataclasses.replace(
            row, rows_per_shard=rows, accum_steps=accum, compiles=row.compiles + count, limit=limit,
            report=dataclasses.replace(row.report, batch_size=report.batch_size // accum), not_fitting=not_fitting,
            confirmed=True)
    estimate = predict(report, chip, row.fixed_bytes)
    return dataclasses.replace(row, rows_per_shard=rows, report=report, compiles=row.compiles + count, limit=limit,
                               not_fitting=not_fitting, seconds=estimate.seconds, bound=estimate.bound, confirmed=True)


def _memory_guess(rows_a: int, report_a: aot.AotReport, rows_b: int, report_b: aot.AotReport, budget: float) -> int:
    """Where the memory line through two compiled batches reaches `budget` (an XLA refusal counts as over it:
    then the guess is halfway)."""
    if report_b.out_of_memory or report_a.out_of_memory or report_b.needed_bytes == report_a.needed_bytes:
        return (rows_a + rows_b) // 2
    intercept, slope = _line(rows_a, report_a.needed_bytes, rows_b, report_b.needed_bytes)
    if slope <= 0:
        return 2 * max(rows_a, rows_b)
    return math.floor((budget - intercept) / slope)


def plan(config, topology: str, num_slices: int = 1, cache: ReportCache | None = None, headroom: float = 0.1,
         remats: Iterable[str] = REMAT_CANDIDATES, scans: Iterable[bool] = (False, True), hbm_bytes: int = 0,
         log: Callable[[str], None] = lambda line: None, meshes=None, resolution: float = RESOLUTION,
         saturation: float = SATURATION, target_batch: int = 0) -> list[PlanRow]:
    """Searches the candidates for `config` on `num_slices` x `topology` that can win; one PlanRow per candidate
    (a skipped one with rows_per_shard 0, no report and the reason as its limit). `hbm_bytes` (default: the
    chip's) is the memory a configuration must fit, less `headroom`; `target_batch` a global batch to reach."""
    if not 0 <= headroom < 1:
        raise ValueError(f"--plan_headroom={headroom}: must be in [0, 1)")
    if not 0 < resolution < 1:
        raise ValueError(f"--plan_resolution={resolution}: must be in (0, 1)")
    if not 0 < saturation <= 1:
        raise ValueError(f"--plan_saturation={saturation}: must be in (0, 1]")
    if target_batch < 0:
        raise ValueError(f"--plan_batch={target_batch}: must be positive (0: the batch is free)")
    if hbm_bytes < 0:
        raise ValueError(f"--plan_hbm_gib={hbm_bytes / aot.GIB}: must be positive (0: the chip's HBM)")
    try:
        return _plan(config, topology, num_slices, cache or ReportCache(""), headroom, remats, scans, hbm_bytes, log,
                     meshes, resolution, saturation, target_batch)
    finally:
        release_spare()


def _plan(config, topology, num_slices, cache, headroom, remats, scans, hbm_bytes, log, meshes, resolution,
          saturation, target_batch) -> list[PlanRow]:
    chips = len(aot.topology_devices(topology, 1))
    rows: list[PlanRow] = []
    for candidate in candidates(chips, config.model.num_heads, remats, scans, meshes):
        shards = num_slices * candidate.data * candidate.fsdp
        if target_batch and target_batch % shards:
            rows.append(PlanRow(candidate, 0, None, None, 0, limit=f"skipped: --plan_batch={target_batch} is not a "
                                                                   f"multiple of its {shards} data shards"))
            continue
        reason = _cannot_win(candidate, rows)
        if reason:
            rows.append(PlanRow(candidate, 0, None, None, 0, limit=f"skipped: {reason}"))
            continue
        try:
            rows.append(search(config, candidate, topology, num_slices, cache, headroom, hbm_bytes, log, resolution,
                               saturation, target_batch // shards if target_batch else 0))
        except CompilerCrashedError as error:
            log(f"  {candidate.label}: {error}")
            rows.append(PlanRow(candidate, 0, None, None, 0, limit=f"skipped: {error}"))
    # Extrapolated rows are compiled at the model's own depth in the order of their promise, until the fastest is
    # one that was.
    for _ in range(len(rows)):
        leader = best(rows)
        if leader is None or leader.confirmed:
            break
        try:
            confirmed = confirm(config, leader, topology, num_slices, cache, headroom, hbm_bytes, log,
                                resolution=resolution)
        except CompilerCrashedError as error:
            log(f"  {leader.candidate.label}: {error}")
            confirmed = PlanRow(leader.candidate, 0, None, None, leader.compiles, limit=f"skipped: {error}")
        rows[rows.index(leader)] = confirmed
    return rows


def _cannot_win(candidate: Candidate, done: list[PlanRow]) -> str:
    """Why `candidate` cannot be faster than a row already searched at the same mesh ("" if it may be)."""
    same_mesh = [row for row in done if (row.candidate.data, row.candidate.fsdp, row.candidate.tensor)
                 == (candidate.data, candidate.fsdp, candidate.tensor) and row.report is not None]
    if candidate.scan_layers and any(row.fits and not row.candidate.scan_layers for row in same_mesh):
        return "scan=off fits (a loop saves compile time, not step time)"
    for row in same_mesh:
        if not row.fits or row.candidate.scan_layers != candidate.scan_layers:
            continue
        if REMAT_CANDIDATES.index(row.candidate.remat) >= REMAT_CANDIDATES.index(candidate.remat):
            continue
        if row.limit != "memory":
            return f"remat={row.candidate.remat} already reaches the batch it needs ({row.limit})"
        per_shard = row.rows_per_shard * row.accum_steps / row.seconds
        if row.ceiling_rows_per_s and per_shard >= (1 - PRUNE_MARGIN) * row.ceiling_rows_per_s:
            return (f"remat={row.candidate.remat} is within {PRUNE_MARGIN:.0%} of its throughput at any batch, "
                    "which recomputation cannot raise")
    return ""


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
    return f"{value / aot.GIB:.3g}"


def format_plan(rows: list[PlanRow], headroom: float, hbm_bytes: int = 0, chip: chips_lib.Chip | None = None) -> str:
    """One line per candidate, fastest first: the batch found, its memory (GiB per chip), the compiler's FLOPs and
    collective bytes, and the predicted step time, throughput and MFU; '*' marks figures from a program with while
    loops (XLA counts their bodies once; the prediction scales them up)."""
    header = ["mesh d,f,t  remat  scan", "rows/shard", "accum", "global batch", "total / HBM", "TFLOP/chip",
              "collectives/chip", "to other slices/chip", "step s", "seq/s/chip", "MFU", "bound", "XLA s",
              "limit (next size up)"]
    cells = [header]
    order = sorted(rows, key=lambda row: (not row.fits, -row.sequences_per_s_per_chip))
    for row in order:
        report = row.report
        label = (f"{row.candidate.data},{row.candidate.fsdp},{row.candidate.tensor}  {row.candidate.remat}  "
                 f"{'on' if row.candidate.scan_layers else 'off'}")
        if report is None:  # skipped: listed below the table, by reason
            continue
        loops = " *" if report.while_loops else ""
        budget = hbm_bytes or report.hbm_bytes
        if not row.fits:
            cells.append([label, "0", "-", "-", f"NO at global batch {report.batch_size}: {aot.fits_verdict(report)}",
                          "-", "-", "-", "-", "-", "-", "-", "-", "memory"])
            continue
        next_up = ""
        if row.not_fitting is not None:
            above = row.not_fitting
            next_up = f" ({above.batch_size}: " + (
                "XLA out of memory)" if above.out_of_memory else f"{_size(above.needed_bytes)} GiB)")
        cells.append([
            label, str(row.rows_per_shard), str(row.accum_steps), str(row.global_batch),
            f"{_size(report.needed_bytes)} / {_size(budget)} ({report.needed_bytes / budget:.0%})",
            f"{report.flops_per_device / 1e12:.4g}{loops}",
            f"{sum(report.collective_bytes.values()) / 2**20:.4g} MiB{loops}",
            f"{sum(report.dcn_bytes.values()) / 2**20:.4g} MiB" if report.dcn_bytes else "-",
            f"{row.seconds:.4g}{'' if row.confirmed else ' ~'}", f"{row.sequences_per_s_per_chip:.4g}",
            f"{row.mfu(chip):.0%}" if chip else "-", row.bound,
            f"{report.optimal_seconds * row.accum_steps:.3g}" if report.optimal_seconds else "-",
            row.limit + next_up])
    widths = [max(len(line[column]) for line in cells) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    skipped: dict[str, list[str]] = {}
    for row in rows:
        if row.report is None:
            skipped.setdefault(row.limit.removeprefix("skipped: "), []).append(
                f"{row.candidate.data},{row.candidate.fsdp},{row.candidate.tensor} {row.candidate.remat} "
                f"{'on' if row.candidate.scan_layers else 'off'}")
    lines.extend(f"not searched, {reason}: {'; '.join(labels)}" for reason, labels in skipped.items())
    lines.append(
        f"Memory in GiB per chip, leaving {headroom:.0%} of HBM free. step s: predicted seconds per optimizer step "
        "from XLA's figures for the compiled step (bert_jax.chips): the traffic that does not grow with the batch at "
        "HBM bandwidth, then the larger of the rest's FLOPs / peak and bytes / HBM bandwidth, then collectives / ICI "
        "and transfers / DCN bandwidth. XLA s: XLA's own cost_analysis optimal_seconds, beside it (negative where "
        "XLA could not cost an instruction). * while loops: XLA counts their bodies once (the prediction scales "
        f"them up). ~ extrapolated from the probe compiles (at {PROBE_ROWS[0]} and {PROBE_ROWS[1]} rows per "
        f"shard; at {PROBE_DEPTHS[0]} and {PROBE_DEPTHS[1]} layers for a deeper model): the fastest are compiled at "
        "their answer until the first is.")
    return "\n".join(lines)


def run(config, topology: str, num_slices: int, cache_dir: str, headroom: float, remats, scans, hbm_bytes: int = 0,
        meshes=None, resolution: float = RESOLUTION, print_fn=print, saturation: float = SATURATION,
        target_batch: int = 0) -> PlanRow | None:
    """The --plan command: searches, prints the table and the flags of the best row; returns that row."""
    start = time.perf_counter()
    print_fn = functools.partial(print_fn, flush=True) if print_fn is print else print_fn
    cache = ReportCache(cache_dir)
    rows = plan(config, topology, num_slices, cache, headroom, remats, scans, hbm_bytes, print_fn, meshes, resolution,
                saturation, target_batch)
    where = topology if num_slices == 1 else f"{num_slices} x {topology}"
    chip = chip_of(topology)
    dtype = next((row.report.dtype for row in rows if row.report is not None), config.model.dtype)
    print_fn(f"\nplan for {where} ({chip.name}: {chip.peak_flops / 1e12:.0f} TFLOP/s, {chip.hbm_bytes_per_s / 1e9:.0f} "
             f"GB/s HBM, {chip.ici_bytes_per_s / 1e9:.0f} GB/s all-reduce per chip), {config.model.num_layers} layers "
             f"x {config.model.hidden_size}, seq {config.data.max_seq_length}, {dtype}"
             + (f", global batch {target_batch}" if target_batch else "") + ":")
    print_fn(format_plan(rows, headroom, hbm_bytes, chip))
    chosen = best(rows)
    compiles = sum(row.compiles for row in rows)
    print_fn(f"{compiles} configurations ({compiles - cache.hits} compiled, {cache.hits} from the cache "
             f"{cache_dir or '(off)'}) in {time.perf_counter() - start:.0f} s")
    if chosen is None:
        print_fn(f"nothing fits {where} with {headroom:.0%} headroom, even at one row per shard: more chips, a "
                 "smaller model or a shorter sequence")
    else:
        print_fn(f"fastest predicted: {chosen.candidate.label}, global batch {chosen.global_batch}"
                 + (f" ({chosen.accum_steps} accumulated micro-batches)" if chosen.accum_steps > 1 else "")
                 + f", {chosen.sequences_per_s_per_chip:.4g} sequences/s per chip\n{flag_line(chosen, num_slices)}")
    return chosen
