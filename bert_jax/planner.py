"""The planner behind `python -m bert_jax.aot --plan`: which mesh, remat policy, layer scan and batch fit a TPU
slice (or several), found by compiling candidates ahead of time on any host.

For every candidate (a split of each slice's chips over data, fsdp and tensor; a remat policy; scan_layers on or
off) it searches the largest batch per data-parallel shard whose compiled step leaves at least `headroom` of the
chip's HBM free: doubling from 8 rows per shard until a step does not fit, then bisecting between the last that
fit (or 0) and the first that did not, down to an eighth of the batch found (or one row). Every figure is the compiler's
(bert_jax.aot.compile_train_step's AotReport): memory, FLOPs and collective bytes per chip, no throughput model.

Each compiled configuration's report is kept as JSON under `cache_dir`, keyed by the whole config, the topology,
the slice count, the jax/jaxlib/libtpu versions and CACHE_VERSION, so that a second plan (another sequence
length, a topology compared with the first) compiles only what it has not seen.
"""

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import time
from typing import Callable, Iterable

from bert_jax import aot

REMAT_CANDIDATES = ("none", "matmuls", "full")
# Stop bisecting once the interval between a batch that fits and one that does not is within this fraction of the
# one that fits: another compile would move the answer by less than that.
RESOLUTION = 1 / 8
FIRST_ROWS = 8
MAX_ROWS_PER_SHARD = 4096
# Part of every cache key: raise it when AotReport or what fills it changes, so that old reports are not reused.
CACHE_VERSION = 3


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
    rows_per_shard: int  # the largest batch per data-parallel shard that fits with headroom; 0: none does
    report: aot.AotReport  # at that batch, or at one row per shard when none fits
    not_fitting: aot.AotReport | None  # the smallest batch searched that does not fit (None: reached the cap)
    compiles: int  # configurations compiled for this row (the cache's included)

    @property
    def fits(self) -> bool:
        return self.rows_per_shard > 0


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
    return [Candidate(*mesh, remat, scan) for mesh in meshes for remat in remats for scan in scans]


def configure(config, candidate: Candidate, rows_per_shard: int, num_slices: int):
    """A copy of `config` running `candidate` with `rows_per_shard` rows per data-parallel shard."""
    config = config.copy_and_resolve_references()
    config.mesh.dcn_data = num_slices
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = candidate.data, candidate.fsdp, candidate.tensor
    config.model.remat, config.model.scan_layers = candidate.remat, candidate.scan_layers
    config.train.batch_size = rows_per_shard * num_slices * candidate.data * candidate.fsdp
    config.optim.grad_accum_steps = 1
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


def compile_report(config, topology: str, num_slices: int, cache: ReportCache) -> aot.AotReport:
    key = cache.key(config, topology, num_slices)
    report = cache.get(key)
    if report is None:
        report = aot.compile_train_step(config, topology, num_slices)[1]
        cache.put(key, report)
    return report


def fits_with_headroom(report: aot.AotReport, headroom: float, hbm_bytes: int = 0) -> bool:
    """XLA compiled it, and it leaves `headroom` of the HBM free (`hbm_bytes`, default the chip's)."""
    return report.fits and report.needed_bytes <= (1 - headroom) * (hbm_bytes or report.hbm_bytes)


def search(config, candidate: Candidate, topology: str, num_slices: int, cache: ReportCache, headroom: float,
           hbm_bytes: int = 0, log: Callable[[str], None] = lambda line: None,
           resolution: float = RESOLUTION) -> PlanRow:
    """The largest batch per data-parallel shard of `candidate` that fits with `headroom`: doubling, then
    bisection until the answer is known to within `resolution` of itself (see the module docstring)."""
    compiled = 0

    def attempt(rows):
        nonlocal compiled
        compiled += 1
        report = compile_report(configure(config, candidate, rows, num_slices), topology, num_slices, cache)
        ok = fits_with_headroom(report, headroom, hbm_bytes)
        log(f"  {candidate.label} rows/shard={rows}: {report.needed_bytes / aot.GIB:.2f} GiB, compiled in "
            f"{report.compile_seconds:.0f} s -> {'fits' if ok else 'does not fit'}")
        return ok, report

    # Doubling from FIRST_ROWS, then bisection between the last fit (0: none yet) and the first misfit.
    low, low_report, high, high_report = 0, None, None, None
    rows = FIRST_ROWS
    while high is None and rows <= MAX_ROWS_PER_SHARD:
        ok, report = attempt(rows)
        if ok:
            low, low_report, rows = rows, report, rows * 2
        else:
            high, high_report = rows, report
    while high is not None and high - low > max(1, math.floor(low * resolution)):
        middle = (low + high) // 2
        ok, report = attempt(middle)
        if ok:
            low, low_report = middle, report
        else:
            high, high_report = middle, report
    if low == 0:
        return PlanRow(candidate, 0, high_report, high_report, compiled)
    return PlanRow(candidate, low, low_report, high_report, compiled)


def plan(config, topology: str, num_slices: int = 1, cache: ReportCache | None = None, headroom: float = 0.1,
         remats: Iterable[str] = REMAT_CANDIDATES, scans: Iterable[bool] = (False, True), hbm_bytes: int = 0,
         log: Callable[[str], None] = lambda line: None, meshes=None, resolution: float = RESOLUTION
         ) -> list[PlanRow]:
    """Searches every candidate for `config` on `num_slices` x `topology`; one PlanRow per candidate.
    `hbm_bytes` (default: the chip's) is the memory a configuration must fit, less `headroom`."""
    if not 0 <= headroom < 1:
        raise ValueError(f"--plan_headroom={headroom}: must be in [0, 1)")
    if not 0 < resolution < 1:
        raise ValueError(f"--plan_resolution={resolution}: must be in (0, 1)")
    if hbm_bytes < 0:
        raise ValueError(f"--plan_hbm_gib={hbm_bytes / aot.GIB}: must be positive (0: the chip's HBM)")
    chips = len(aot.topology_devices(topology, 1))
    cache = cache or ReportCache("")
    rows = []
    for candidate in candidates(chips, config.model.num_heads, remats, scans, meshes):
        rows.append(search(config, candidate, topology, num_slices, cache, headroom, hbm_bytes, log, resolution))
    return rows


def best(rows: list[PlanRow]) -> PlanRow | None:
    """The row with the largest batch that fits; among equals, the fewest compiled FLOPs per chip (less
    recomputation), then the fewest collective bytes."""
    fitting = [row for row in rows if row.fits]
    if not fitting:
        return None
    return max(fitting, key=lambda row: (row.report.batch_size, -row.report.flops_per_device,
                                         -sum(row.report.collective_bytes.values())))


def flags(row: PlanRow, num_slices: int) -> str:
    candidate, report = row.candidate, row.report
    return (f"--config.mesh.dcn_data={num_slices} --config.mesh.data={candidate.data} "
            f"--config.mesh.fsdp={candidate.fsdp} --config.mesh.tensor={candidate.tensor} "
            f"--config.model.remat={candidate.remat} --config.model.scan_layers={candidate.scan_layers} "
            f"--config.train.batch_size={report.batch_size}")


def _size(value: float) -> str:
    return f"{value / aot.GIB:.3g}"


def format_plan(rows: list[PlanRow], headroom: float, hbm_bytes: int = 0) -> str:
    """One line per candidate: the batch found, the memory at it (GiB per chip) and the compiler's FLOPs and
    collective bytes; '*' marks figures from a program with while loops (bodies counted once)."""
    header = ["mesh d,f,t  remat  scan", "rows/shard", "global batch", "args", "temps", "total / HBM",
              "TFLOP/chip", "collectives/chip", "to other slices/chip", "next size up"]
    cells = [header]
    for row in rows:
        report = row.report
        loops = " *" if report.while_loops else ""
        budget = hbm_bytes or report.hbm_bytes
        if row.fits:
            memory = [_size(report.argument_bytes), _size(report.temp_bytes),
                      f"{_size(report.needed_bytes)} / {_size(budget)} ({report.needed_bytes / budget:.0%})"]
            work = [f"{report.flops_per_device / 1e12:.4g}{loops}",
                    f"{sum(report.collective_bytes.values()) / 2**20:.4g} MiB{loops}",
                    f"{sum(report.dcn_bytes.values()) / 2**20:.4g} MiB" if report.dcn_bytes else "-"]
        else:
            memory = ["-", "-", f"NO at 1 row/shard: {aot.fits_verdict(report)}"]
            work = ["-", "-", "-"]
        above, next_up = row.not_fitting, "-"
        if row.fits and above is not None:
            next_up = f"{above.batch_size}: " + (
                "XLA out of memory" if above.out_of_memory else f"{_size(above.needed_bytes)} GiB")
        label = (f"{row.candidate.data},{row.candidate.fsdp},{row.candidate.tensor}  {row.candidate.remat}  "
                 f"{'on' if row.candidate.scan_layers else 'off'}")
        cells.append([label, str(row.rows_per_shard) if row.fits else "0", str(report.batch_size) if row.fits
                      else "-", *memory, *work, next_up])
    widths = [max(len(line[column]) for line in cells) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"Memory in GiB per chip, at the largest batch that leaves {headroom:.0%} of HBM free; all figures "
                 "are XLA's for the compiled step (no throughput is modelled). * while loops: FLOPs and collectives "
                 "count their bodies once.")
    return "\n".join(lines)


def run(config, topology: str, num_slices: int, cache_dir: str, headroom: float, remats, scans, hbm_bytes: int = 0,
        meshes=None, resolution: float = RESOLUTION, print_fn=print) -> PlanRow | None:
    """The --plan command: searches, prints the table and the flags of the best row; returns that row."""
    start = time.perf_counter()
    print_fn = functools.partial(print_fn, flush=True) if print_fn is print else print_fn
    cache = ReportCache(cache_dir)
    rows = plan(config, topology, num_slices, cache, headroom, remats, scans, hbm_bytes, print_fn, meshes, resolution)
    where = topology if num_slices == 1 else f"{num_slices} x {topology}"
    print_fn(f"\nplan for {where}, {config.model.num_layers} layers x {config.model.hidden_size}, seq "
             f"{config.data.max_seq_length}, {rows[0].report.dtype}:")
    print_fn(format_plan(rows, headroom, hbm_bytes))
    chosen = best(rows)
    compiles = sum(row.compiles for row in rows)
    print_fn(f"{compiles} configurations ({compiles - cache.hits} compiled, {cache.hits} from the cache "
             f"{cache_dir or '(off)'}) in {time.perf_counter() - start:.0f} s")
    if chosen is None:
        print_fn(f"nothing fits {where} with {headroom:.0%} headroom, even at one row per shard: more chips, a "
                 "smaller model or a shorter sequence")
    else:
        print_fn(f"largest batch with {headroom:.0%} headroom: {chosen.candidate.label}, global batch "
                 f"{chosen.report.batch_size}\n{flags(chosen, num_slices)}")
    return chosen

