"""Training-step benchmark: `python -m bert_jax.benchmarks.step --size=base --seq_length=128 --batch_size=8`.

For each preset it measures, in one run on the current platform: the device's matmul ceiling, the compile time and
median wall time of the real sharded train step, sequences/s, tokens/s, model FLOPs per step, model-FLOPs
utilisation against the measured ceiling (and against the nominal peak where the device kind is known), and memory.
The ceiling is measured before the steps and again after them, and MFU is taken against the higher of the two, so a
moment's slowdown of a shared host during one measurement cannot overstate the MFU.
Batches are synthetic and already on device, so the figure is the step alone.

On CPU and GPU it also times HuggingFace transformers' `BertForPreTraining` (PyTorch,
bert_jax.benchmarks.torch_reference) on the same platform (torch's "cuda" device on a GPU) in two forms: stock (MLM
logits for every position, loss on the masked ones) and with the head applied to the gathered masked positions only,
as bert_jax does. TensorFlow is never imported; torch is optional. On a GPU, torch gets what JAX's allocator left of
the device's memory; bert_jax.benchmarks.gpu runs the two in separate processes.
Run as a program, it sets the driver's XLA:CPU options (bert_jax.runtime) before JAX starts.
"""

import functools
import os
import resource
import statistics
import sys
import time
from typing import Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from bert_jax import arch as arch_lib
from bert_jax import attention as attention_lib
from bert_jax import metrics as metrics_lib
from bert_jax import presets
from bert_jax import runtime
from bert_jax import sharding as sharding_lib
from bert_jax import train
from bert_jax.benchmarks import batches
from bert_jax.benchmarks import matmul_bound as matmul_bound_lib
from bert_jax.benchmarks import torch_reference


def _define_flags():
    """The program's flags, defined only when it runs: importing this module (bert_jax.benchmarks.gpu and the
    tests do) defines none, so they never collide with another benchmark's."""
    flags.DEFINE_list("size", ["base"], "Presets to measure (tiny, mini, small, medium, base, large).")
    flags.DEFINE_enum("arch", "bert", list(arch_lib.names()), "The architecture: bert (BertForPreTraining "
                      "against transformers' own), or modern (bert_jax.modern against ModernBertForMaskedLM).")
    flags.DEFINE_integer("seq_length", 128, "Sequence length.")
    flags.DEFINE_integer("batch_size", 8, "Global batch size (a multiple of the device count).")
    flags.DEFINE_integer("max_predictions", 0, "Masked positions per sequence; 0 means 15% of seq_length.")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype (parameters stay float32).")
    flags.DEFINE_integer("steps", 10, "Timed steps; the median is reported.")
    flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation (plus one untimed first execution).")
    flags.DEFINE_integer("matmul_size", 0, "Square matmul size for the ceiling; 0 picks 2048 on CPU, 8192 elsewhere.")
    flags.DEFINE_boolean("compare_torch", None, "Also time HuggingFace BertForPreTraining (PyTorch) on the same "
                         "platform. Default: on when the platform is CPU or GPU and torch + transformers are "
                         "installed.")
    flags.DEFINE_integer("threads", 0, "CPU threads for both JAX and torch; 0 means every core this process may use. "
                         "Fewer pins the process to that many cores before JAX starts, so XLA's pool shrinks too.")
    flags.DEFINE_enum("matmuls", "total", ["total", "shapes", "off"], "After the steps, time each distinct matmul of "
                      "the step alone (one device only) and print their total as a bound on the step ('shapes': also "
                      "one line per distinct matmul).")
    define_dropout_rng_flag("threefry")


def define_dropout_rng_flag(default: str) -> None:
    """--dropout_rng, as the benchmark programs take it (train.dropout_rng's choices)."""
    flags.DEFINE_enum("dropout_rng", default, ["threefry", "rbg", "unsafe_rbg", "auto"], "The dropout key's PRNG "
                      "(configs/pretrain.py train.dropout_rng; auto: bert_jax.runtime.AUTO_DROPOUT_RNG for this "
                      "platform: threefry on CPUs and GPUs).")


FLAGS = flags.FLAGS

# The columns of the two tables, in order (the test checks the header against these).
STEP_COLUMNS = ("preset", "seq", "batch", "dtype", "compile s", "step s", "seq/s", "tok/s", "GFLOP/step",
                "TFLOP/s", "MFU ceil", "MFU peak", "XLA GiB", "peak GiB")
TORCH_COLUMNS = ("preset", "threads", "jax s", "torch stock s", "torch gathered s", "x stock", "x gathered",
                 "jax loss", "torch loss")


def schedulable_cores() -> int:
    """Cores this process may run on: XLA:CPU sizes its intra-op thread pool by the same affinity mask."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pin_to_cores(threads: int) -> int:
    """Restricts the process to its first `threads` allowed cores; call before JAX starts its backend.

    XLA:CPU sizes its thread pool from the affinity mask when the backend starts, so this is how JAX is made to use
    the same number of cores as torch.set_num_threads(threads). Returns the number of cores now allowed.
    """
    if threads and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if threads > len(cores):
            raise ValueError(f"--threads={threads} exceeds the {len(cores)} cores this process may use")
        os.sched_setaffinity(0, cores[:threads])
    return schedulable_cores()


def peak_rss_bytes() -> int:
    """Peak resident set size of this whole process so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def matmul_ceiling(size: int, dtype, repeats: int = 10) -> float:
    """Measured FLOP/s of one square matmul (XLA's dot) on the first device: the practical ceiling for this dtype.

    Timed as bert_jax.benchmarks.matmul_bound times the step's own matmuls (operands on the device, compiled once,
    the median of `repeats` calls)."""
    name = jnp.dtype(dtype).name
    square = matmul_bound_lib.Matmul((size, size), name, (size, size), name, ((((1,), (0,)), ((), ())), None))
    return square.flops / matmul_bound_lib.median_seconds(matmul_bound_lib.alone(square), repeats)


def preset_config(size: str, seq_length: int, max_predictions: int, dtype: str, batch_size: int, num_steps: int,
                  attention: str = "auto", arch: str = "bert"):
    """The pretraining config the benchmarks measure: preset `size` of `arch` at these shapes, dtype and attention.
    The fused kernels (xla, cudnn, pallas) have no attention dropout, so with one of them it is off."""
    config = presets.pretraining_config(size, arch=arch)
    config.model.dtype = dtype
    config.model.attention = attention
    if attention in attention_lib.FUSED_IMPLEMENTATIONS:
        config.model.attention_dropout_rate = 0.0
    config.model.max_position_embeddings = max(config.model.max_position_embeddings, seq_length)
    config.data.max_seq_length = seq_length
    config.data.max_predictions_per_seq = max_predictions
    config.train.batch_size = batch_size
    config.train.num_steps = max(num_steps, config.optim.warmup_steps)
    return config


def xla_bytes(compiled) -> int:
    """XLA's own account of a compiled step's buffers per device: parameters + optimizer state + batch in, new state
    out (donated, so aliased), and temporaries; 0 where the backend gives none."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return 0
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes)


def _memory_stats(compiled, device) -> dict[str, float]:
    """XLA's own account of the step's buffers, and the measured peak (device allocator, else process RSS)."""
    buffers = xla_bytes(compiled)
    stats = device.memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return {"xla_bytes": buffers, "peak_bytes": stats["peak_bytes_in_use"],
                "peak_kind": "device allocator peak_bytes_in_use since process start (so it includes the "
                              "ceiling's matmul operands and earlier presets)"}
    return {"xla_bytes": buffers, "peak_bytes": peak_rss_bytes(),
            "peak_kind": "process peak RSS (whole process so far)"}


def benchmark_step(size: str, seq_length: int, batch_size: int, max_predictions: int, dtype: str, steps: int,
                   warmup: int, devices=None, matmuls: bool = False,
                   matmul_flops_per_s: float = matmul_bound_lib.DEFAULT_FLOPS_PER_S,
                   dropout_rng: str = "threefry", arch: str = "bert") -> dict:
    """Compile time and median wall time of the real sharded train step (data parallel over `devices`, default all).

    Returns the timings, throughput, model FLOPs per step (model_flops_per_sequence * batch_size) and the matmul
    FLOPs the step executes (step_matmul_flops_per_sequence * batch_size: fewer, the last layer runs at the rows
    the heads read), the first and last step's loss, the memory figures, and the synthetic batch (for feeding
    another framework the same inputs).
    matmuls: also, after the steps, bert_jax.benchmarks.matmul_bound's account of the step's matmuls each timed alone
    ("matmuls"; None, with "matmuls_skipped" saying why, on more than one device); matmul_flops_per_s, the rate
    expected of one device (its measured ceiling), sizes the loops that time them.
    """
    devices = list(jax.devices() if devices is None else devices)
    if batch_size % len(devices):
        raise ValueError(f"--batch_size={batch_size} must be a multiple of the {len(devices)} devices "
                         "(the benchmark shards the batch over all of them)")
    config = preset_config(size, seq_length, max_predictions, dtype, batch_size, steps + warmup + 1, arch=arch)
    setup = train.pretraining_setup(config, devices)
    model_config = setup.model.config
    batch = batches.synthetic_batch(batch_size, seq_length, max_predictions, model_config.vocab_size)

    with jax.set_mesh(setup.mesh):
        state = setup.create_state(jax.random.key(0))
        step = setup.pretraining_step()
        device_batch = sharding_lib.make_global_batch(batch, setup.batch_sharding)
        step_rng = train.dropout_key(1, dropout_rng, devices[0].platform)
        start = time.perf_counter()
        compiled = step.lower(state, device_batch, step_rng).compile()
        compile_seconds = time.perf_counter() - start
        state, times, first_loss, last_loss = time_steps(compiled, state, device_batch, step_rng, steps, warmup)
        # Memory first: the peak is the step's, not that of the matmuls timed alone below.
        memory = _memory_stats(compiled, devices[0])
        bound, skipped = None, ""
        if matmuls and len(devices) > 1:
            skipped = f"the step runs on {len(devices)} devices; the matmuls are timed alone on one"
        elif matmuls:
            timer = functools.partial(matmul_bound_lib.time_alone, device=devices[0],
                                      flops_per_s=matmul_flops_per_s)
            bound = matmul_bound_lib.matmul_bound(step, state, device_batch, step_rng, timer=timer)
    del state
    median = statistics.median(times)
    flops = metrics_lib.model_flops_per_sequence(model_config, seq_length, max_predictions) * batch_size
    executed = metrics_lib.step_matmul_flops_per_sequence(model_config, seq_length, max_predictions) * batch_size
    return {"size": size, "seq_length": seq_length, "batch_size": batch_size, "max_predictions": max_predictions,
            "dtype": dtype, "num_devices": len(devices), "compile_s": compile_seconds, "step_s": median,
            "step_times": times, "seq_per_s": batch_size / median, "tokens_per_s": batch_size * seq_length / median,
            "flops_per_step": flops, "model_flops_per_s": flops / median, "executed_flops_per_step": executed,
            "loss": first_loss,
            "last_loss": last_loss,
            "batch": batch, "model_config": model_config, "matmuls": bound, "matmuls_skipped": skipped,
            "cost": _cost_analysis(compiled), **memory}


def time_steps(compiled, state, batch, rng, steps: int, warmup: int):
    """Runs a compiled train step 1 + warmup times untimed, then `steps` times, each timed to its result.

    Returns (state, the timed steps' seconds, the first step's loss, the last one's). The first loss is that of the
    fresh initialisation, as torch's first step: comparable losses."""
    state, metrics = compiled(state, batch, rng)
    first_loss = float(metrics["loss"])
    for _ in range(warmup):
        state, metrics = compiled(state, batch, rng)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch, rng)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return state, times, first_loss, float(metrics["loss"])


def _cost_analysis(compiled) -> dict[str, float]:
    """XLA's FLOPs and bytes accessed for the compiled step (per device), as bert_jax.aot reads them for a TPU."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {name: float(cost.get(name, 0.0)) for name in ("flops", "bytes accessed", "optimal_seconds")}


def spread(name: str, times) -> str:
    """One line with the fastest, median and slowest of a run's timed steps: how noisy the host was."""
    return (f"{name}: step s min {min(times):.4f} / median {statistics.median(times):.4f} / max {max(times):.4f} "
            f"over {len(times)} steps")


def _row(values, widths) -> str:
    return " ".join(f"{value:>{width}}" if index else f"{value:<{width}}"
                    for index, (value, width) in enumerate(zip(values, widths)))


def _widths(columns) -> list[int]:
    return [max(len(column), 7) for column in columns]


def step_table_row(result: dict, ceiling: float, peak: float) -> str:
    mfu_peak = f"{result['model_flops_per_s'] / peak:.1%}" if peak else "n/a"
    values = (result["size"], result["seq_length"], result["batch_size"], result["dtype"],
              f"{result['compile_s']:.1f}", f"{result['step_s']:.4f}", f"{result['seq_per_s']:.1f}",
              f"{result['tokens_per_s']:.0f}", f"{result['flops_per_step'] / 1e9:.1f}",
              f"{result['model_flops_per_s'] / 1e12:.3f}", f"{result['model_flops_per_s'] / ceiling:.1%}", mfu_peak,
              f"{result['xla_bytes'] / 2**30:.2f}", f"{result['peak_bytes'] / 2**30:.2f}")
    return _row(values, _widths(STEP_COLUMNS))


def add_matmul_bound_fields(result: dict, ceiling: float) -> None:
    """result["matmul_s"]: the step's matmuls alone (s); result["mfu_matmul_bound"]: model FLOPs / that / ceiling.
    Both None where the bound was not measured."""
    bound = result.get("matmuls")
    result["matmul_s"] = bound["seconds"] if bound else None
    result["mfu_matmul_bound"] = result["flops_per_step"] / bound["seconds"] / ceiling if bound else None


def matmul_bound_lines(results, ceiling: float, shapes: bool = False) -> list[str]:
    """The step's matmuls each timed alone (bert_jax.benchmarks.matmul_bound), per preset: their total time, its
    share of the measured step, and the MFU the step would have if it took only that long (the most these kernels
    allow).

    Reads result["matmul_s"] and result["mfu_matmul_bound"] (see `add_matmul_bound_fields`)."""
    lines = ["matmuls alone: every distinct matmul of the step compiled and timed on its own (short ones many times in "
             "one compiled loop), the fastest of 3 rounds' medians; bound = the sum over the step's matmuls; "
             "MFU bound = model FLOPs / bound / ceiling (it can pass 100%: the step executes fewer matmul FLOPs "
             "than the model FLOPs count)"]
    for result in results:
        bound = result.get("matmuls")
        if bound is None:
            lines.append(f"{result['size']}: matmuls alone not measured: {result.get('matmuls_skipped') or 'off'}")
            continue
        executed_rate = bound["flops"] / result["step_s"] / ceiling
        lines.append(
            f"{result['size']}: {bound['calls']} matmuls ({len(bound['groups'])} distinct), "
            f"{bound['flops'] / 1e9:.1f} GFLOP executed ({bound['flops'] / result['flops_per_step']:.1%} of the "
            f"model FLOPs; executed FLOP/s {executed_rate:.1%} of the ceiling), alone {bound['seconds']:.4f} s "
            f"({bound['flops'] / bound['seconds'] / 1e12:.3f} TFLOP/s), {bound['seconds'] / result['step_s']:.1%} of "
            f"the {result['step_s']:.4f} s step; "
            + (f"the other {result['step_s'] - bound['seconds']:.4f} s is work outside the matmuls and matmuls "
               "running slower than alone" if bound["seconds"] <= result["step_s"] else
               "longer than the step: the host was slower while they were timed than during the steps")
            + f"; MFU bound {result['mfu_matmul_bound']:.1%}"
            + "".join(f"; note: {note}" for note in bound["notes"]))
        if shapes:
            lines.extend(f"  {matmul_bound_lib.group_line(group, ceiling)}" for group in bound["groups"])
    return lines


def torch_table_row(result: dict) -> str:
    values = (result["size"], result["torch_threads"], f"{result['step_s']:.4f}",
              f"{result['torch_stock_s']:.4f}", f"{result['torch_gathered_s']:.4f}",
              f"{result['speedup_vs_stock']:.2f}", f"{result['speedup_vs_gathered']:.2f}",
              f"{result['loss']:.3f}", f"{result['torch_loss']:.3f}")
    return _row(values, _widths(TORCH_COLUMNS))


def run(sizes, seq_length: int, batch_size: int, max_predictions: int = 0, dtype: str = "float32", steps: int = 10,
        warmup: int = 2, matmul_size: int = 0, compare_torch: bool | None = None, threads: int = 0, devices=None,
        print_fn: Callable[[str], None] = print, matmuls: str = "total", dropout_rng: str = "threefry",
        arch: str = "bert") -> list[dict]:
    """Measures every preset in `sizes` and prints the tables; returns one result dict per preset.

    compare_torch=None means: on when the platform is CPU or GPU and torch + transformers are installed; torch runs on
    the same platform (torch_reference.torch_device). threads (0: every core this process may use) sets torch's
    thread count; JAX's pool was sized when its backend started (see pin_to_cores).
    matmuls: "total" times the step's matmuls alone and prints the bound they set (see `matmul_bound_lines`),
    "shapes" also prints one line per distinct matmul, "off" skips them.
    """
    if matmuls not in ("total", "shapes", "off"):
        raise ValueError(f"matmuls={matmuls!r}: choose total, shapes or off")
    devices = list(jax.devices() if devices is None else devices)
    device = devices[0]
    dtype_name = jnp.dtype(dtype).name
    max_predictions = max_predictions or batches.default_max_predictions(seq_length)
    cores = schedulable_cores()
    threads = threads or cores
    compare_torch, missing_torch = _torch_comparison(compare_torch, device.platform)

    matmul_size = matmul_size or (2048 if device.platform == "cpu" else 8192)
    # Fake CPU devices share the host's cores (and one thread pool), so the host's ceiling is not multiplied.
    parallel = 1 if device.platform == "cpu" else len(devices)

    # Measured before and again after the steps; MFU is taken against the higher of the two. On a shared host a
    # moment's slowdown during one measurement would otherwise lower the ceiling and overstate the MFU.
    before = matmul_ceiling(matmul_size, jnp.dtype(dtype)) * parallel
    peak = metrics_lib.peak_flops_per_device(device) * len(devices)
    _print_setup(print_fn, devices, dropout_rng, cores, threads, compare_torch)
    results = []
    for size in sizes:
        results.append(benchmark_step(size, seq_length, batch_size, max_predictions, dtype_name, steps, warmup,
                                      devices, matmuls != "off", before / parallel, dropout_rng, arch))
        # Printed as each preset finishes: the table waits for the second ceiling measurement, and a later preset
        # that fails (out of memory, say) must not take this one's figures with it.
        print_fn(spread(f"{size} (jax)", results[-1]["step_times"]))
    after = matmul_ceiling(matmul_size, jnp.dtype(dtype)) * parallel
    _print_ceiling(print_fn, results, dtype_name, matmul_size, parallel, before, after, peak, max_predictions)
    _step_table(print_fn, results, before, after, peak, matmuls)

    if not compare_torch:
        if missing_torch:
            print_fn(f"torch comparison skipped: {missing_torch}")
        return results
    # After every JAX measurement, so torch's threads never compete with XLA's.
    _time_torch(results, steps, warmup, threads, torch_reference.torch_device(device.platform))
    _print_torch_tables(print_fn, results, dtype_name)
    return results


def _torch_comparison(compare_torch: bool | None, platform: str) -> tuple[bool, str]:
    """(whether to time torch too, why torch cannot run: "" where it can or was not looked for)."""
    runs_here = platform in ("cpu", "gpu")
    if compare_torch and not runs_here:
        raise RuntimeError(f"--compare_torch times torch on the CPU or a CUDA GPU; this run's platform is {platform}")
    # Only looked for where it could run: a JAX-only TPU image need not have torch at all.
    missing_torch = torch_reference.unavailable_reason() if runs_here and compare_torch is not False else ""
    if compare_torch is None:
        compare_torch = runs_here and not missing_torch
    elif compare_torch and missing_torch:
        raise RuntimeError(f"--compare_torch needs torch and transformers: {missing_torch}")
    return compare_torch, missing_torch


def _print_setup(print_fn, devices, dropout_rng: str, cores: int, threads: int, compare_torch: bool) -> None:
    device = devices[0]
    print_fn(f"devices: {len(devices)} x {device.device_kind} ({device.platform}), jax {jax.__version__}; dropout "
             f"RNG {runtime.dropout_rng_name(dropout_rng, device.platform)}")
    if device.platform == "cpu":
        print_fn(f"CPU threads: JAX/XLA {cores} (its pool is sized by the cores this process may run on)"
                 + (f", torch {threads} (torch.set_num_threads)" if compare_torch else ""))
        print_fn(f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')}")
        print_fn(f"the step's dots: {runtime.cpu_dots()} ({runtime.CPU_DOTS_VARIABLE}="
                 f"{os.environ.get(runtime.CPU_DOTS_VARIABLE, 'auto')})")
        # The driver's CPU runs re-execute themselves with its allocator settings (bert_jax.runtime.CPU_GLIBC_TUNABLES);
        # this process has what it was started with.
        print_fn(f"GLIBC_TUNABLES: {os.environ.get('GLIBC_TUNABLES', '(unset: glibc defaults)')}")


def _architecture(results):
    model_config = results[0].get("model_config")  # a result built elsewhere may lack it: BERT's, as the default
    return arch_lib.get(arch_lib.DEFAULT) if model_config is None else arch_lib.of(model_config)


def _print_ceiling(print_fn, results, dtype_name: str, matmul_size: int, parallel: int, before: float, after: float,
                   peak: float, max_predictions: int) -> None:
    ceiling = max(before, after)
    print_fn(f"measured {dtype_name} matmul ceiling ({matmul_size}^3{f', x{parallel} devices' if parallel > 1 else ''}"
             f"): {ceiling / 1e12:.3f} TFLOP/s, the higher of a measurement before the steps, {before / 1e12:.3f}, "
             f"and one after them, {after / 1e12:.3f}; nominal bf16 peak: "
             + (f"{peak / 1e12:.0f} TFLOP/s" if peak else "unknown for this device (MFU peak: n/a)"))
    architecture = _architecture(results)
    print_fn(f"model FLOPs: 6*N*T + 12*L*d*T^2 + MLM head at {max_predictions} masked positions"
             + (" (+ pooler/NSP)" if architecture.has_nsp else "") + ", N = encoder matmul parameters, every token "
             "through every layer; MFU ceil = model FLOP/s / measured ceiling. "
             + (f"The {architecture.name} encoder's step computes every row of every layer (local layers' scores in "
                "full on the reference path): " if not architecture.gathers_head_rows
                else "The step executes fewer matmul FLOPs, the last layer computing "
                "only the [CLS] and masked rows the heads read: ")
             + ", ".join(f"{result['size']} {result['executed_flops_per_step'] / 1e9:.1f} GFLOP" for result in results))


def _step_table(print_fn, results, before: float, after: float, peak: float, matmuls: str) -> None:
    """Adds the ceiling and MFU fields to every result and prints the step table and the matmul bounds."""
    ceiling = max(before, after)
    print_fn(_row(STEP_COLUMNS, _widths(STEP_COLUMNS)))
    for result in results:
        result["ceiling_flops_per_s"] = ceiling
        result["ceiling_before_flops_per_s"] = before
        result["ceiling_after_flops_per_s"] = after
        result["mfu_ceiling"] = result["model_flops_per_s"] / ceiling
        result["mfu_peak"] = result["model_flops_per_s"] / peak if peak else None
        add_matmul_bound_fields(result, ceiling)
        print_fn(step_table_row(result, ceiling, peak))
    print_fn(f"XLA GiB: the compiled step's arguments + outputs - donated + temporaries, per device; "
             f"peak GiB: {results[0]['peak_kind'] if results else ''}")
    if matmuls != "off":
        for line in matmul_bound_lines(results, ceiling, shapes=matmuls == "shapes"):
            print_fn(line)


def _time_torch(results, steps: int, warmup: int, threads: int, device: str = "cpu") -> None:
    """Times HuggingFace's model on `device`, stock and with the head gathered, on each result's batch; adds the
    figures."""
    for result in results:
        stock = torch_reference.benchmark_step(result["model_config"], result["batch"], steps, warmup, threads, False,
                                               device=device)
        gathered = torch_reference.benchmark_step(result["model_config"], result["batch"], steps, warmup, threads,
                                                  True, device=device)
        result.update(torch_stock_s=stock["step_s"], torch_gathered_s=gathered["step_s"],
                      torch_stock_step_times=stock["step_times"], torch_gathered_step_times=gathered["step_times"],
                      torch_loss=gathered["loss"], torch_threads=stock["threads"],
                      speedup_vs_stock=stock["step_s"] / result["step_s"],
                      speedup_vs_gathered=gathered["step_s"] / result["step_s"],
                      torch_attention=stock["attention"], torch_version=stock["torch_version"],
                      torch_device=stock["device"],
                      transformers_version=stock["transformers_version"])


def _print_torch_tables(print_fn, results, dtype_name: str) -> None:
    first, architecture = results[0], _architecture(results)
    print_fn(f"HuggingFace {architecture.transformers_pretraining_class} on {first['torch_device']}, "
             f"torch {first['torch_version']}, transformers "
             f"{first['transformers_version']}, attention {first['torch_attention']}, "
             f"threads {first['torch_threads']}, {'bf16 autocast' if dtype_name == 'bfloat16' else 'fp32'}, "
             f"dropout on, same batch; step = forward + {'MLM/NSP' if architecture.has_nsp else 'MLM'} loss + "
             "backward + clip + AdamW")
    print_fn("stock: MLM logits at all positions, loss on masked ones; gathered: head on masked positions only; "
             "x = torch time / jax time; losses: first step, fresh initialisation")
    print_fn(_row(TORCH_COLUMNS, _widths(TORCH_COLUMNS)))
    for result in results:
        print_fn(torch_table_row(result))
    for result in results:
        print_fn(spread(f"{result['size']} (torch stock)", result["torch_stock_step_times"]))
        print_fn(spread(f"{result['size']} (torch gathered)", result["torch_gathered_step_times"]))
    print_fn(f"process peak RSS after torch: {peak_rss_bytes() / 2**30:.2f} GiB")


def main(argv):
    del argv
    # Before anything starts JAX's backend: it reads XLA_FLAGS, and sizes its CPU thread pool by the affinity mask.
    runtime.set_up_jax()
    try:
        pin_to_cores(FLAGS.threads)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    run(FLAGS.size, FLAGS.seq_length, FLAGS.batch_size, FLAGS.max_predictions, FLAGS.dtype, FLAGS.steps,
        FLAGS.warmup, FLAGS.matmul_size, FLAGS.compare_torch, FLAGS.threads, print_fn=lambda line: print(
            line, flush=True), matmuls=FLAGS.matmuls, dropout_rng=FLAGS.dropout_rng, arch=FLAGS.arch)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
