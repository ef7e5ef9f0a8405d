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

The modules behind it: the plan's spec, rows and printing (plan), the batch search (search), the figures between
compiles (estimate), the report cache (cache) and the compiling processes (pool); this one searches the candidates.
"""

import functools
import math
import time
from typing import Callable, Iterable

from bert_jax.aot import compiling
from bert_jax.aot import search as search_lib
from bert_jax.aot.cache import ReportCache
from bert_jax.aot.plan import REMAT_CANDIDATES, Candidate, PlanRow, PlanSpec, best, print_plan
from bert_jax.aot.pool import CompilerCrashedError, CompilerPool
from bert_jax.aot.report import AotReport

# A recomputing candidate is skipped when the one before it already reaches this fraction of its own ceiling.
PRUNE_MARGIN = 0.01


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


def compile_report(config, topology: str, num_slices: int, cache: ReportCache, pool: CompilerPool) -> AotReport:
    """The configuration's AotReport, from the cache or compiled in a process of `pool`'s."""
    key = cache.key(config, topology, num_slices)
    report = cache.get(key)
    if report is None:
        report = pool.compile(config, topology, num_slices)
        cache.put(key, report)
    return report


def _compile(spec: PlanSpec, candidate: Candidate, cache: ReportCache, pool: CompilerPool, rows: int, accum: int,
             depth: int) -> AotReport:
    """search's compile_at for `candidate`: its step at `rows` per shard, `accum` steps, `depth` layers (0: all)."""
    configured = configure(spec.config, candidate, rows, spec.num_slices, accum)
    if depth:
        configured.model.num_layers = depth
    return compile_report(configured, spec.topology, spec.num_slices, cache, pool)


def plan(spec: PlanSpec, cache: ReportCache | None = None, log: Callable[[str], None] = lambda line: None
         ) -> list[PlanRow]:
    """Searches the candidates for `spec.config` on `spec.num_slices` x `spec.topology` that can win; one PlanRow
    per candidate (a skipped one with rows_per_shard 0, no report and the reason as its limit). `spec.hbm_bytes`
    (default: the chip's) is the memory a configuration must fit, less `spec.headroom`; `spec.target_batch` a global
    batch to reach."""
    cache = cache or ReportCache("")
    with CompilerPool() as pool:

        def compile_at(candidate: Candidate) -> search_lib.CompileAt:
            return functools.partial(_compile, spec, candidate, cache, pool)

        rows = _search_candidates(spec, compile_at, log)
        _confirm_leaders(spec, rows, compile_at, log)
    return rows


def _search_candidates(spec: PlanSpec, compile_at, log: Callable[[str], None]) -> list[PlanRow]:
    chips = len(compiling.topology_devices(spec.topology, 1))
    rows: list[PlanRow] = []
    for candidate in candidates(chips, spec.config.model.num_heads, spec.remats, spec.scans, spec.meshes):
        shards = spec.num_slices * candidate.data * candidate.fsdp
        target_batch = spec.target_batch
        if target_batch and target_batch % shards:
            rows.append(PlanRow(candidate, 0, None, None, 0, limit=f"skipped: --plan_batch={target_batch} is not a "
                                                                   f"multiple of its {shards} data shards"))
            continue
        reason = _cannot_win(candidate, rows)
        if reason:
            rows.append(PlanRow(candidate, 0, None, None, 0, limit=f"skipped: {reason}"))
            continue
        try:
            rows.append(search_lib.search(spec, candidate, compile_at(candidate), log,
                                          target_batch // shards if target_batch else 0))
        except CompilerCrashedError as error:
            log(f"  {candidate.label}: {error}")
            rows.append(PlanRow(candidate, 0, None, None, 0, limit=f"skipped: {error}"))
    return rows


def _confirm_leaders(spec: PlanSpec, rows: list[PlanRow], compile_at, log: Callable[[str], None]) -> None:
    """Extrapolated rows are compiled at the model's own depth in the order of their promise, until the fastest is
    one that was (in place)."""
    for _ in range(len(rows)):
        leader = best(rows)
        if leader is None or leader.confirmed:
            break
        try:
            confirmed = search_lib.confirm(spec, leader, compile_at(leader.candidate), log)
        except CompilerCrashedError as error:
            log(f"  {leader.candidate.label}: {error}")
            confirmed = PlanRow(leader.candidate, 0, None, None, leader.compiles, limit=f"skipped: {error}")
        rows[rows.index(leader)] = confirmed


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


def run(spec: PlanSpec, cache_dir: str, print_fn=print) -> PlanRow | None:
    """The --plan command: searches, prints the table and the flags of the best row; returns that row."""
    start = time.perf_counter()
    print_fn = functools.partial(print_fn, flush=True) if print_fn is print else print_fn
    cache = ReportCache(cache_dir)
    rows = plan(spec, cache, print_fn)
    print_plan(spec, rows, cache.hits, cache_dir, start, print_fn)
    return best(rows)
