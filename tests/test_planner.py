"""The planner's search (bert_jax.aot.planner, .search, .estimate) on made-up compilers, whose memory and work per
batch are known, and its step-time model (bert_jax.chips). The real compiles are in tests/test_aot.py."""

import dataclasses
import math

import pytest

from bert_jax import aot
from bert_jax import chips
from bert_jax.aot import compiling
from bert_jax.aot import estimate as estimate_lib
from bert_jax.aot import plan as plan_lib
from bert_jax.aot import planner
from bert_jax.aot import search as search_lib
from bert_jax.aot.pool import CompilerCrashedError

TOPOLOGY = "v5e:2x2"
V5E = chips.CHIPS["v5e"]
CANDIDATE = plan_lib.Candidate(data=4, fsdp=1, tensor=1, remat="none", scan_layers=False)
GIB = aot.GIB


LAYERS = 12


def _report(rows: int, accum: int = 1, depth: int = 0, *, fixed_bytes: float = 2 * GIB,
            bytes_per_row: float = 0.05 * GIB, curve: float = 0.0, flops_per_row: float = 1e11,
            fixed_traffic: float = 4e9, traffic_per_row: float = 1e7, shards: int = 4,
            deep_extra: float = 0.0) -> aot.AotReport:
    """A compiled step of a LAYERS-deep model whose memory is fixed_bytes + bytes_per_row * rows (+ curve * rows^2:
    not quite affine), with accumulation adding one more copy of the fixed part (the gradient sum). At `depth`
    layers (0: all), a quarter of the fixed memory is the embeddings' and everything else shrinks with the depth;
    `deep_extra` is memory only the full-depth compile shows."""
    share = depth / LAYERS if depth else 1.0
    fixed_bytes = fixed_bytes * (0.25 + 0.75 * share) + (0 if depth else deep_extra)
    bytes_per_row, flops_per_row, traffic_per_row = (bytes_per_row * share, flops_per_row * share,
                                                     traffic_per_row * share)
    needed = fixed_bytes + bytes_per_row * rows + curve * rows * rows + (fixed_bytes if accum > 1 else 0)
    return aot.AotReport(
        topology=TOPOLOGY, device_kind="TPU v5 lite", num_chips=4, num_hosts=1,
        mesh={"dcn_data": 1, "data": 4, "fsdp": 1, "tensor": 1}, batch_size=rows * accum * shards, seq_length=128,
        dtype="bfloat16", num_params=110_000_000, argument_bytes=int(needed), output_bytes=0, alias_bytes=0,
        temp_bytes=0, generated_code_bytes=0, xla_peak_bytes=int(needed), flops_per_device=flops_per_row * rows,
        while_loops=1 if accum > 1 else 0, model_flops_per_device=0.9 * flops_per_row * rows,
        executed_flops_per_device=0.85 * flops_per_row * rows, hbm_bytes=16 * GIB, lower_seconds=0.0,
        compile_seconds=1.0, bytes_accessed=fixed_traffic + traffic_per_row * rows)


class Compiler:
    """compile_at for search_lib.search, counting what it was asked."""

    def __init__(self, **shape):
        self.shape, self.calls = shape, []

    def __call__(self, rows, accum, depth):
        self.calls.append((rows, accum) if not depth else (rows, accum, depth))
        return _report(rows, accum, depth, **self.shape)


def _spec(**options) -> plan_lib.PlanSpec:
    """The spec of a plan on TOPOLOGY with 10% headroom; no config: the made-up compilers need none."""
    return plan_lib.PlanSpec(None, TOPOLOGY, 1, headroom=0.1, **options)


def _search(compiler, num_layers=2, target_rows=0, **options):
    """search_lib.search over `compiler` for a model of `num_layers` (2: no shallower compiles)."""
    return search_lib.search(_spec(**options), CANDIDATE, compiler, target_rows=target_rows, num_layers=num_layers)


def _plan_one(compiler, num_layers=2, **options):
    """_search, then the compile that confirms its row, as planner.plan does for the fastest."""
    row = _search(compiler, num_layers, **options)
    if row.fits and not row.confirmed:
        row = search_lib.confirm(_spec(resolution=options.get("resolution", plan_lib.RESOLUTION)), row, compiler)
    return row


def _largest_fitting(compiler: Compiler, headroom: float) -> int:
    rows = 1
    while estimate_lib.fits_with_headroom(_report(rows + 1, **compiler.shape), headroom, 0):
        rows += 1
    return rows


@pytest.mark.parametrize("curve", [0.0, 2e-5 * GIB])
def test_memory_limited_search_finds_the_largest_batch_in_a_few_compiles(curve):
    # Memory 2 GiB + 0.05 GiB per row: 14.4 GiB (90% of 16) holds 248 rows; with the curve, fewer.
    compiler = Compiler(curve=curve, flops_per_row=1e9, fixed_traffic=1e9)  # fast rows: never throughput-limited
    row = _plan_one(compiler)
    best = _largest_fitting(compiler, 0.1)
    assert row.limit == "memory" and row.fits and row.confirmed
    assert best * (1 - 1 / 8) <= row.rows_per_shard <= best
    assert row.report == _report(row.rows_per_shard, curve=curve, flops_per_row=1e9, fixed_traffic=1e9)
    # Doubling from 8 and bisecting to 1/8 takes 9 compiles here; the line needs the two probes and one compile at
    # its answer (where memory is affine), or that and one more (where the line undershoots, the curve).
    assert len(compiler.calls) == (3 if curve == 0 else 4), compiler.calls
    assert max(rows for rows, _ in compiler.calls) <= best * (1 + 1 / 8) + 1
    fine = Compiler(curve=curve, flops_per_row=1e9, fixed_traffic=1e9)
    row = _plan_one(fine, resolution=1 / 64)
    assert best * (1 - 1 / 64) <= row.rows_per_shard <= best and len(fine.calls) <= 6, fine.calls


def test_a_batch_past_saturation_is_not_searched():
    # Each row costs 1e11 FLOPs (0.51 ms at 197 TFLOP/s); the fixed 1 GB of traffic 1.2 ms: 98% of the ceiling is
    # reached at 0.98/0.02 * 1.2/0.51 = ~117 rows, before the memory limit (248).
    compiler = Compiler(fixed_traffic=1e9, traffic_per_row=0.0)
    row = _plan_one(compiler)
    intercept = 1e9 / V5E.hbm_bytes_per_s
    slope = 1e11 / V5E.peak_flops
    expected = math.floor(0.98 * intercept / (slope * 0.02))
    assert row.limit == "throughput" and row.rows_per_shard == expected and len(compiler.calls) == 3
    assert row.seconds == pytest.approx(intercept + slope * expected) and row.bound == "compute"
    assert row.ceiling_rows_per_s == pytest.approx(1 / slope)
    assert row.sequences_per_s_per_chip == pytest.approx(expected * 4 / row.seconds / 4)


def test_a_target_batch_is_reached_by_the_largest_micro_batch_that_fits_and_accumulation():
    compiler = Compiler(flops_per_row=1e9)  # memory-limited at 248 rows per shard (see above)
    row = _plan_one(compiler, target_rows=1024)
    # The micro-batch divides 1024; the largest such under 248 rows is 128; the accumulating step is compiled too.
    assert (row.rows_per_shard, row.accum_steps, row.global_batch) == (128, 8, 4096)
    assert (128, 8) in compiler.calls and estimate_lib.fits_with_headroom(_report(128, 8), 0.1)
    micro = chips.estimate(V5E, 1e9 * 128, 4e9 + 1e7 * 128, fixed_bytes=4e9)
    assert row.seconds == pytest.approx(8 * micro.seconds)
    assert plan_lib.flag_line(row, 1).endswith("--config.train.batch_size=4096 --config.optim.grad_accum_steps=8")
    # A target that fits whole needs no accumulation.
    small = _plan_one(Compiler(flops_per_row=1e9), target_rows=64)
    assert (small.rows_per_shard, small.accum_steps, small.limit) == (64, 1, "target")


def test_nothing_fits_is_a_row_without_a_batch():
    compiler = Compiler(fixed_bytes=15 * GIB)
    row = _search(compiler)
    # The lines say nothing fits; a compile at one row per shard says so for certain.
    assert not row.fits and row.report.batch_size == 4 and compiler.calls[-1] == (1, 1) and row.confirmed


def test_estimate_is_a_roofline_plus_transfers():
    compute_bound = chips.estimate(V5E, flops=197e12, bytes_accessed=819e9 / 2, collective_bytes=200e9 / 4,
                                   dcn_bytes=V5E.dcn_bytes_per_s / 10)
    assert compute_bound.seconds == pytest.approx(1 + 0.25 + 0.1) and compute_bound.bound == "compute"
    memory_bound = chips.estimate(V5E, flops=197e12 / 10, bytes_accessed=819e9)
    assert memory_bound.seconds == pytest.approx(1.0) and memory_bound.bound == "HBM"
    # The traffic that does not grow with the batch (the optimizer's) does not hide under the matmuls: 1 s of it,
    # then the larger of 1 s of compute and the other 0.5 s of traffic.
    two_phases = chips.estimate(V5E, flops=197e12, bytes_accessed=1.5 * 819e9, fixed_bytes=819e9)
    assert two_phases.seconds == pytest.approx(2.0) and two_phases.on_chip_s == pytest.approx(2.0)


def test_loops_scale_the_counted_work_up_to_the_executed_matmuls():
    report = dataclasses.replace(_report(64), while_loops=2, flops_per_device=1e12, executed_flops_per_device=4e12,
                                 bytes_accessed=1e9, collective_bytes={"all-gather": 1 << 20})
    estimate = estimate_lib.predict(report, V5E)
    assert estimate.compute_s == pytest.approx(4e12 / V5E.peak_flops)
    assert estimate.memory_s == pytest.approx(4e9 / V5E.hbm_bytes_per_s)
    assert estimate.ici_s == pytest.approx(4 * (1 << 20) / V5E.ici_bytes_per_s)
    loop_free = dataclasses.replace(report, while_loops=0)
    assert estimate_lib.predict(loop_free, V5E).compute_s == pytest.approx(1e12 / V5E.peak_flops)


def test_candidates_that_cannot_win_are_skipped():
    """Recomputation behind a step that is not memory-limited, and a scanned step where the unrolled one fits."""
    base = dict(data=4, fsdp=1, tensor=1)
    none = plan_lib.PlanRow(plan_lib.Candidate(**base, remat="none", scan_layers=False), 64, _report(64), None, 3,
                           limit="throughput", seconds=0.1, ceiling_rows_per_s=700.0)
    matmuls = plan_lib.Candidate(**base, remat="matmuls", scan_layers=False)
    assert "remat=none already reaches" in planner._cannot_win(matmuls, [none])
    scanned = plan_lib.Candidate(**base, remat="none", scan_layers=True)
    assert "scan=off fits" in planner._cannot_win(scanned, [none])
    # Also with more recomputation, which was itself skipped.
    assert "scan=off fits" in planner._cannot_win(plan_lib.Candidate(**base, remat="full", scan_layers=True), [none])
    # Memory-limited, far below its ceiling (640 rows/s of 700): recomputation may pay; within 1% it cannot.
    limited = dataclasses.replace(none, limit="memory")
    assert planner._cannot_win(matmuls, [limited]) == ""
    assert "within 1%" in planner._cannot_win(matmuls, [dataclasses.replace(limited, ceiling_rows_per_s=645.0)])
    other_mesh = plan_lib.Candidate(data=1, fsdp=4, tensor=1, remat="matmuls", scan_layers=False)
    assert planner._cannot_win(other_mesh, [none]) == ""


def test_a_deep_model_is_searched_on_shallow_compiles_and_confirmed_at_its_depth():
    compiler = Compiler(flops_per_row=1e9, fixed_traffic=1e9)  # memory-limited at 248 rows per shard
    row = _search(compiler, num_layers=LAYERS)
    # Only the four shallow compiles: 8 and 32 rows at 2 and 3 layers; the rest is their lines.
    assert sorted(compiler.calls) == [(8, 1, 2), (8, 1, 3), (32, 1, 2), (32, 1, 3)]
    assert not row.confirmed and row.limit == "memory"
    full = _report(row.rows_per_shard, flops_per_row=1e9, fixed_traffic=1e9)
    assert row.report.needed_bytes == pytest.approx(full.needed_bytes, rel=1e-6)
    assert row.report.flops_per_device == pytest.approx(full.flops_per_device)
    assert 248 * (1 - 1 / 8) <= row.rows_per_shard <= 248
    confirmed = search_lib.confirm(_spec(), row, compiler)
    assert confirmed.confirmed and confirmed.rows_per_shard == row.rows_per_shard
    assert compiler.calls[-1] == (row.rows_per_shard, 1) and confirmed.report == full
    # Where the full depth needs 1 GiB more than the lines say, the confirmation steps down to what fits.
    heavier = Compiler(flops_per_row=1e9, fixed_traffic=1e9, deep_extra=GIB)
    confirmed = search_lib.confirm(_spec(), row, heavier)
    assert confirmed.confirmed and confirmed.limit == "memory" and len(heavier.calls) == 2
    assert 0.9 * 228 <= confirmed.rows_per_shard <= 228  # (14.4 - 3 GiB) / 0.05 GiB per row
    assert estimate_lib.fits_with_headroom(confirmed.report, 0.1)
    assert not estimate_lib.fits_with_headroom(confirmed.not_fitting, 0.1)


def test_a_compiler_crash_costs_its_candidate_not_the_plan(monkeypatch):
    crashed = plan_lib.Candidate(data=1, fsdp=4, tensor=1, remat="none", scan_layers=False)
    searched = []

    def search(spec, candidate, *args, **kwargs):
        searched.append(candidate)
        if candidate == crashed:
            raise CompilerCrashedError("XLA's compiler crashed (the compiling process died)")
        return plan_lib.PlanRow(candidate, 64, _report(64), None, 2, limit="throughput", seconds=0.1)

    monkeypatch.setattr(search_lib, "search", search)
    monkeypatch.setattr(compiling, "topology_devices", lambda topology, num_slices: [None] * 4)
    config = type("Config", (), {"model": type("Model", (), {"num_heads": 2})})()
    rows = planner.plan(plan_lib.PlanSpec(config, TOPOLOGY, remats=("none",), scans=(False,)))
    assert [row.candidate for row in rows] == searched and crashed in searched and len(rows) == 3
    (skipped,) = [row for row in rows if row.candidate == crashed]
    assert not skipped.fits and skipped.limit == "skipped: XLA's compiler crashed (the compiling process died)"
    assert plan_lib.best(rows).fits
    assert "not searched, XLA's compiler crashed (the compiling process died): 1,4,1 none off" in \
        plan_lib.format_plan(rows, 0.1, 0, V5E)
