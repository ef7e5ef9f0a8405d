"""The matmuls of a traced function, each timed alone: how fast a step could run if it were nothing but its matmuls.

MFU against a measured matmul ceiling mixes two losses: the matmuls of the step running slower than the square
ceiling matmul (their shapes are smaller, thinner, or transposed), and time spent outside matmuls (elementwise work,
reductions, the optimizer). This module separates them. It walks the jaxpr of a function (into jit, scan with its
trip count, remat, custom-derivative calls and cond branches), collects every `dot_general`, groups identical
ones, and times each group's product alone on one device, as its own jitted function (a short one many times in one
compiled loop), on random operands of the same shapes and dtypes:

    bound = sum over groups of (count x time alone, the fastest of three rounds' medians)

`bound` is the step time with everything but the matmuls removed and the matmuls running as fast as they do alone;
model FLOPs / bound / ceiling is the most MFU those kernels allow. The shapes are the global (unsharded) ones, so the
figure is for a step on one device.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jax_core
import numpy as np

# Each timed call runs a matmul `inner` times in one compiled loop, enough for about _CALL_SECONDS at the expected
# rate (the measured ceiling where the caller knows it), so that dispatch from Python is a small part of the time
# even for a matmul of microseconds; each round times about _ROUND_SECONDS of calls and keeps their median.
_CALL_SECONDS = 2e-3
_ROUND_SECONDS = 0.1
DEFAULT_FLOPS_PER_S = 2e11  # the rate assumed when the caller has not measured one
_MAX_INNER = 1000
_MIN_CALLS, _MAX_CALLS = 5, 50
# Every function `alone` compiles, kept until the process exits. XLA:CPU (jaxlib 0.10.2) with oneDNN dots aborted
# (object_pool.h "Check failed: available_.size() == num_created_") when an executable was freed just after it ran.
_KEEP_COMPILED = []


@dataclasses.dataclass(frozen=True)
class Matmul:
    """One distinct `dot_general` product: its operands' shapes and dtypes, and its parameters."""

    lhs_shape: tuple
    lhs_dtype: str
    rhs_shape: tuple
    rhs_dtype: str
    # (dimension_numbers, preferred_element_type name or None)
    params: tuple

    @property
    def flops(self) -> int:
        """2 x output elements x contraction size."""
        ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch)), _ = self.params
        batch = math.prod(self.lhs_shape[axis] for axis in lhs_batch)
        contract = math.prod(self.lhs_shape[axis] for axis in lhs_contract)
        lhs_free = math.prod(size for axis, size in enumerate(self.lhs_shape)
                             if axis not in lhs_contract and axis not in lhs_batch)
        rhs_free = math.prod(size for axis, size in enumerate(self.rhs_shape)
                             if axis not in rhs_contract and axis not in rhs_batch)
        return 2 * batch * lhs_free * rhs_free * contract

    def describe(self) -> str:
        ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch)), _ = self.params
        batch = f", batch {list(lhs_batch)}/{list(rhs_batch)}" if lhs_batch else ""
        return (f"dot {self.lhs_dtype}{list(self.lhs_shape)} x {self.rhs_dtype}{list(self.rhs_shape)}, "
                f"contracting {list(lhs_contract)}/{list(rhs_contract)}{batch}")

    def function(self):
        """The product alone, as a jittable function of (lhs, rhs)."""
        dimension_numbers, preferred = self.params
        preferred = None if preferred is None else jnp.dtype(preferred)
        return lambda lhs, rhs: lax.dot_general(lhs, rhs, dimension_numbers, preferred_element_type=preferred)


def _matmul_of(eqn) -> Matmul | None:
    if eqn.primitive.name != "dot_general":
        return None
    lhs, rhs = (var.aval for var in eqn.invars)
    preferred = eqn.params.get("preferred_element_type")
    return Matmul(tuple(lhs.shape), jnp.dtype(lhs.dtype).name, tuple(rhs.shape), jnp.dtype(rhs.dtype).name,
                  (eqn.params["dimension_numbers"], None if preferred is None else jnp.dtype(preferred).name))


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(item, jax_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax_core.Jaxpr):
                yield item


def _count(jaxpr, multiplier: int, counts: dict, notes: set) -> None:
    for eqn in jaxpr.eqns:
        matmul = _matmul_of(eqn)
        if matmul is not None:
            counts[matmul] = counts.get(matmul, 0) + multiplier
            continue
        name = eqn.primitive.name
        inner = multiplier * int(eqn.params["length"]) if name == "scan" else multiplier
        if name == "while":
            notes.add("a while loop's body is counted once (its trip count is not known when tracing)")
        if name == "cond":
            # One branch runs: count the most expensive one (exact when they cost the same).
            branches = []
            for branch in _sub_jaxprs(eqn):
                branch_counts: dict = {}
                _count(branch, inner, branch_counts, notes)
                branches.append((sum(matmul.flops * count for matmul, count in branch_counts.items()), branch_counts))
            if len({flops for flops, _ in branches}) > 1:
                notes.add("a cond's most expensive branch is counted every time it runs, an upper bound")
            for matmul, count in (max(branches, key=lambda b: b[0])[1] if branches else {}).items():
                counts[matmul] = counts.get(matmul, 0) + count
            continue
        for sub in _sub_jaxprs(eqn):
            _count(sub, inner, counts, notes)


def collect_matmuls(fn, *args, **kwargs) -> tuple[dict, list[str]]:
    """{Matmul: how many times one call of fn(*args, **kwargs) runs it}, and notes on what could not be counted."""
    closed = jax.make_jaxpr(fn)(*args, **kwargs)
    counts: dict = {}
    notes: set = set()
    _count(closed.jaxpr, 1, counts, notes)
    return counts, sorted(notes)


def _operand(rng: np.random.Generator, shape, dtype, device):
    # Drawn on the host: jax.random compiled a program per operand shape, which took longer than timing the product.
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.device_put(rng.standard_normal(shape, dtype=np.float32).astype(dtype), device)
    return jax.device_put(np.ones(shape, dtype), device)


def _plan(matmul: Matmul, flops_per_s: float) -> tuple[int, int]:
    """(products per call, calls per round) for a matmul expected to run at `flops_per_s`."""
    seconds = max(matmul.flops, 1) / flops_per_s
    inner = min(max(round(_CALL_SECONDS / seconds), 1), _MAX_INNER)
    calls = min(max(int(_ROUND_SECONDS / (inner * seconds)), _MIN_CALLS), _MAX_CALLS)
    return inner, calls


def alone(matmul: Matmul, inner: int = 1, device=None):
    """A function of no arguments that runs `matmul` `inner` times, alone, in one compiled call (operands already on
    the device; compiled and run once here), and waits for it."""
    device = device or jax.devices()[0]
    rng = np.random.default_rng(0)
    lhs = _operand(rng, matmul.lhs_shape, matmul.lhs_dtype, device)
    rhs = _operand(rng, matmul.rhs_shape, matmul.rhs_dtype, device)
    run = jax.jit(looped(matmul, inner))
    _KEEP_COMPILED.append(run)
    run(lhs, rhs).block_until_ready()
    return lambda: run(lhs, rhs).block_until_ready()


def looped(matmul: Matmul, inner: int):
    """f(lhs, rhs): the product computed `inner` times in a loop (the last one is returned); the plain product for 1.

    The loop carries the left operand through an optimization barrier, so XLA can neither hoist the product out of
    the loop nor drop all but the last one."""
    product = matmul.function()
    if inner == 1:
        return product

    def run(lhs, rhs):
        def body(_, carry):
            lhs = lax.optimization_barrier(carry[0])
            return lhs, product(lhs, rhs)
        out = jax.eval_shape(product, lhs, rhs)
        return lax.fori_loop(0, inner, body, (lhs, jnp.zeros(out.shape, out.dtype)))[1]

    return run


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_alone(matmuls, rounds: int = 3, device=None, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> list[float]:
    """Seconds of one product of each matmul alone: the fastest of `rounds` medians (each call runs the product
    several times in a compiled loop, see _plan), the rounds going over every matmul in turn, so that a moment's
    slowdown of a shared host lands on one round and not on one matmul. `flops_per_s`: the rate expected (the
    measured ceiling), which only sizes the loops."""
    plans = [_plan(matmul, flops_per_s) for matmul in matmuls]
    runs = [alone(matmul, inner, device) for matmul, (inner, _) in zip(matmuls, plans)]
    best = [float("inf")] * len(runs)
    for _ in range(rounds):
        for index, (run, (inner, calls)) in enumerate(zip(runs, plans)):
            best[index] = min(best[index], median_seconds(run, calls) / inner)
    return best


def matmul_bound(fn, *args, timer=time_alone, **kwargs) -> dict:
    """Collects fn's matmuls and times each distinct one alone (`timer([matmul, ...]) -> [seconds, ...]`).

    Returns {"seconds": the sum of count x time alone, "flops": their FLOPs, "calls": how many products,
    "groups": [{"matmul", "count", "seconds" (one call), "flops" (one call)}, ...] slowest total first, "notes"}.
    """
    counts, notes = collect_matmuls(fn, *args, **kwargs)
    matmuls = list(counts)
    groups = [{"matmul": matmul, "count": counts[matmul], "seconds": seconds, "flops": matmul.flops}
              for matmul, seconds in zip(matmuls, timer(matmuls))]
    groups.sort(key=lambda group: -group["count"] * group["seconds"])
    return {"seconds": sum(group["count"] * group["seconds"] for group in groups),
            "flops": sum(group["count"] * group["flops"] for group in groups),
            "calls": sum(group["count"] for group in groups), "groups": groups, "notes": notes}


def group_line(group: dict, ceiling: float) -> str:
    """One group: count, time alone, rate and the share of the ceiling it reaches."""
    rate = group["flops"] / group["seconds"] if group["seconds"] else float("nan")
    return (f"{group['count']:5d} x {group['seconds'] * 1e3:9.3f} ms = {group['count'] * group['seconds']:7.3f} s  "
            f"{rate / 1e9:8.1f} GFLOP/s {rate / ceiling:6.1%}  {group['matmul'].describe()}")

