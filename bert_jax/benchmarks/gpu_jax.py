"""The GPU check's JAX side (bert_jax.benchmarks.gpu): every JAX row of a spec, measured in this process.

For each pretraining shape, the largest batch of the spec's candidates whose step fits the device's memory, then the
step at that batch with each attention; the packing comparison's unpacked and packed steps; the fine-tuning tasks'
steps; and the matmul ceiling before and after them. Batches come from bert_jax.benchmarks.batches, as the step
benchmark's and the torch side's do.
"""

import functools
import gc
import time

import numpy as np

from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax.benchmarks import batches
from bert_jax.benchmarks import step as step_lib


def pretraining_config(preset: str, seq_length: int, attention: str, dtype: str, predictions: int = 1,
                       batch_size: int = 1):
    """The config of a row: bert_jax.benchmarks.step's, for as many steps as the schedule needs never to matter."""
    return step_lib.preset_config(preset, seq_length, predictions, dtype, batch_size, 1000, attention)


def model_config(preset: str, seq_length: int, attention: str = "auto", dtype: str = "bfloat16"
                 ) -> model_lib.BertConfig:
    """The BertConfig of a row (see `pretraining_config`)."""
    return model_lib.BertConfig.from_config(pretraining_config(preset, seq_length, attention, dtype).model)


def _is_out_of_memory(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def short_error(error: Exception) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{type(error).__name__}: {first[:200]}"


def _attention_taken(requested: str, config: model_lib.BertConfig, batch_size: int, seq_length: int,
                     packed: bool) -> str:
    """What `requested` resolves to in a training step of these shapes (bert_jax.attention's own choice, which reads
    only shapes and dtypes: nothing is allocated)."""
    import jax  # pylint: disable=import-outside-toplevel
    from bert_jax import attention as attention_lib  # pylint: disable=import-outside-toplevel

    head_dim = config.hidden_size // config.num_heads
    query = jax.ShapeDtypeStruct((batch_size, seq_length, config.num_heads, head_dim), config.dtype)
    ids = jax.ShapeDtypeStruct((batch_size, seq_length), "int32")
    mask = attention_lib.SegmentMask(ids) if packed else ids
    return attention_lib.attention_implementation(requested, query, query, mask, True, config.attention_dropout_rate)


class _JaxSide:
    """Measures the rows of one spec in this process, appending each result (or why it has none) to `rows`."""

    def __init__(self, spec: dict, devices, deadline: float, matmul_size: int, on_row=None):
        """`spec`'s dtype resolved (not auto)."""
        self.spec, self.devices, self.deadline, self.matmul_size, self.on_row = (spec, devices, deadline, matmul_size,
                                                                                 on_row)
        self.device = devices[0]
        self.started = time.monotonic()
        self.ceilings = (0.0, 0.0)
        stats = self.device.memory_stats() or {}
        limit = spec["memory_limit_gib"] * 2**30 or stats.get("bytes_limit", 0)
        self.memory_limit = int(limit)
        self.rows: list[dict] = []
        self._measured = None  # (batch, argument bytes, total bytes) of the last step that did not fit

    def _learn_memory(self, batch_size: int, result: dict) -> None:
        """Keeps a step's memory that did not fit, for `_estimated_bytes` (the fixed part: its arguments)."""
        if result.get("xla_bytes") and result.get("argument_bytes") is not None:
            self._measured = (batch_size, result["argument_bytes"], result["xla_bytes"])

    def _estimated_bytes(self, batch_size: int) -> float:
        """The memory of the shape's step at `batch_size`, from the last one that did not fit: its arguments (the
        state, mostly) plus the rest in proportion to the batch; 0 with nothing measured."""
        if self._measured is None:
            return 0.0
        measured_batch, fixed, total = self._measured
        return fixed + (total - fixed) * batch_size / measured_batch

    def _out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def _timed_step(self, setup, step, batch: dict, extra_batches: dict | None = None) -> dict:
        """Compiles `step` (jitted over `setup`'s state) for `batch`, times it, and times `extra_batches` (same
        shapes) with the same executable."""
        import jax  # pylint: disable=import-outside-toplevel
        from bert_jax import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
        from bert_jax import train  # pylint: disable=import-outside-toplevel

        steps, warmup = self.spec["steps"], self.spec["warmup"]
        with jax.set_mesh(setup.mesh):
            state = setup.create_state(jax.random.key(0))
            device_batch = sharding_lib.make_global_batch(batch, setup.batch_sharding)
            rng = train.dropout_key(1, self.spec["dropout_rng"], self.device.platform)
            start = time.perf_counter()
            compiled = step.lower(state, device_batch, rng).compile()
            compile_s = time.perf_counter() - start
            memory = step_lib.xla_bytes(compiled)
            analysis = compiled.memory_analysis()  # XLA keeps it: asked again, not recomputed
            result = {"compile_s": compile_s, "xla_bytes": memory,
                      "argument_bytes": analysis.argument_size_in_bytes if analysis is not None else None}
            if self.memory_limit and memory > self.memory_limit:
                result["error"] = (f"does not fit: XLA needs {memory / 2**30:.3g} GiB, the device allows "
                                   f"{self.memory_limit / 2**30:.3g}")
                result["out_of_memory"] = True
                return result
            state, times, first, last = step_lib.time_steps(compiled, state, device_batch, rng, steps, warmup)
            result.update(step_times=times, step_s=float(np.median(times)), loss=first, last_loss=last)
            for name, extra in (extra_batches or {}).items():
                placed = sharding_lib.make_global_batch(extra, setup.batch_sharding)
                state, times, _, _ = step_lib.time_steps(compiled, state, placed, rng, steps, warmup)
                result[f"{name}_step_s"] = float(np.median(times))
            stats = self.device.memory_stats() or {}
            result["allocator_peak_bytes"] = stats.get("peak_bytes_in_use")
        del state, compiled
        gc.collect()
        return result

    def _pretraining_step(self, preset: str, seq_length: int, batch_size: int, attention: str, predictions: int,
                          batch: dict, extra_batches: dict | None = None) -> dict:
        """`_timed_step` of the pretraining step of a row."""
        from bert_jax import train  # pylint: disable=import-outside-toplevel

        config = pretraining_config(preset, seq_length, attention, self.spec["dtype"], predictions, batch_size)
        setup = train.pretraining_setup(config, self.devices)
        return self._timed_step(setup, setup.pretraining_step(), batch, extra_batches)

    def _row(self, section: str, preset: str, seq_length: int, batch_size: int, attention: str, **fields) -> dict:
        row = {"section": section, "preset": preset, "seq_length": seq_length, "batch_size": batch_size,
               "attention": attention, **fields}
        self.rows.append(row)
        # A line as each row ends, and the result so far on disk: a side stopped at its limit keeps its rows.
        figures = (f"compile {row['compile_s']:.1f} s, step {row['step_s']:.4f} s" if row.get("step_s") is not None
                   else row.get("skipped") or row.get("error") or "no result")
        print(f"[{time.monotonic() - self.started:.0f} s] {section} {preset} seq {seq_length} batch {batch_size} "
              f"{attention}{' packed' if fields.get('packed') else ''}: {figures}", flush=True)
        if self.on_row is not None:
            self.on_row(self)
        return row

    def pretraining(self, preset: str, seq_length: int, attentions, pack: dict | None = None,
                    fitted: int | None = None) -> int | None:
        """The rows of one shape, one per attention; returns the batch measured (None if none fitted).

        Without `fitted`, the first attention that runs picks the batch: the largest candidate whose step XLA says
        fits the memory limit and that runs (a candidate that XLA's estimate at a larger one says cannot fit is not
        compiled); the others are measured at that batch. With `pack`, the row that picks the batch also times the
        packing comparison's unpacked batch on the same executable and fills `pack` in."""
        predictions = batches.default_max_predictions(seq_length)
        candidates = sorted({int(size) for size in self.spec["batch_sizes"]}, reverse=True)
        candidates = [size for size in candidates if size % len(self.devices) == 0]
        if not fitted:
            self._measured = None  # another shape's memory says nothing of this one's
        for attention in attentions:
            config = model_config(preset, seq_length, attention, self.spec["dtype"])
            vocab = config.vocab_size
            if self._out_of_time():
                self._row("pretrain", preset, seq_length, fitted, attention, skipped="time budget (--budget_s)")
                continue
            larger, result, batch_size, batch = [], None, None, None
            for batch_size in [fitted] if fitted else candidates:
                if not fitted and self._estimated_bytes(batch_size) > self.memory_limit > 0:
                    estimate = self._estimated_bytes(batch_size) / 2**30
                    larger.append(f"{batch_size}: not compiled, estimated {estimate:.0f} GiB")
                    continue
                batch = batches.synthetic_batch(batch_size, seq_length, predictions, vocab)
                extra = {}
                if pack is not None and not fitted:
                    extra["unpacked"] = batches.unpacked_batch(
                        batches.pack_instance_lengths(batch_size, seq_length, 0), seq_length, predictions, vocab, 1)
                try:
                    result = self._pretraining_step(preset, seq_length, batch_size, attention, predictions, batch,
                                                    extra)
                except Exception as error:  # pylint: disable=broad-except  # a row's failure is its result
                    result = {"error": short_error(error), "out_of_memory": _is_out_of_memory(error)}
                if result.get("out_of_memory") and not fitted:
                    larger.append(f"{batch_size}: {result['error']}")
                    self._learn_memory(batch_size, result)
                    continue
                break
            if result is None or (result.get("out_of_memory") and not fitted):
                self._row("pretrain", preset, seq_length, None, attention,
                          error="no batch of --batch_sizes fits: " + "; ".join(larger))
                continue
            flops = metrics_lib.model_flops_per_sequence(config, seq_length, predictions) * batch_size
            row = self._row("pretrain", preset, seq_length, batch_size, attention, **result, flops_per_step=flops,
                            taken=_attention_taken(attention, config, batch_size, seq_length, False),
                            real_tokens=int(batch["input_mask"].sum()), sequences=batch_size, larger_batches=larger)
            if "step_s" in row and not fitted:
                fitted = batch_size
                if pack is not None:
                    pack.update(batch_size=batch_size, unpacked_step_s=row["unpacked_step_s"], attention=attention,
                                unpacked_compile_s=row["compile_s"], unpacked_xla_bytes=row["xla_bytes"])
        return fitted

    def packing(self, preset: str, seq_length: int, pack: dict) -> None:
        """Unpacked (timed with the shape's first pretraining row) against packed rows of the same instances."""
        predictions = batches.default_max_predictions(seq_length)
        attention = pack.get("attention", self.spec["attention"][0])
        batch_size = pack.get("batch_size")
        if batch_size is None:
            self._row("pack", preset, seq_length, None, attention, error="no pretraining row of this shape ran")
            return
        lengths = batches.pack_instance_lengths(batch_size * self.spec["pack_instances"], seq_length, 0)
        unpacked_lengths = lengths[:batch_size]
        config = model_config(preset, seq_length, attention, self.spec["dtype"])
        unpacked_flops = metrics_lib.model_flops_per_sequence(config, seq_length, predictions) * batch_size
        self._row("pack", preset, seq_length, batch_size, attention, packed=False, step_s=pack["unpacked_step_s"],
                  compile_s=pack["unpacked_compile_s"], xla_bytes=pack["unpacked_xla_bytes"],
                  flops_per_step=unpacked_flops,
                  sequences=batch_size, real_tokens=int(unpacked_lengths.sum()),
                  taken=_attention_taken(attention, config, batch_size, seq_length, False))
        if self._out_of_time():
            self._row("pack", preset, seq_length, batch_size, attention, packed=True,
                      skipped="time budget (--budget_s)")
            return
        instances = self.spec["pack_instances"]
        # Packed as a run of this preset packs: its data.pack_window instances at a time.
        window = pretraining_config(preset, seq_length, attention, self.spec["dtype"]).data.pack_window
        batch, placed = batches.packed_batch(lengths, batch_size, seq_length, instances, config.vocab_size, 1,
                                             window=window)
        slots = batches.packed_predictions(seq_length, instances)
        try:
            result = self._pretraining_step(preset, seq_length, batch_size, attention, slots, batch)
        except Exception as error:  # pylint: disable=broad-except
            result = {"error": short_error(error)}
        flops = metrics_lib.model_flops_per_sequence(config, seq_length, slots) * batch_size
        # Instances as a steady stream trains them (batches.packed_batch): the batch's real tokens over the mean
        # length.
        self._row("pack", preset, seq_length, batch_size, attention, packed=True, **result, flops_per_step=flops,
                  sequences=float(batch["input_mask"].sum()) / float(lengths.mean()), instances_in_batch=placed,
                  real_tokens=int(batch["input_mask"].sum()),
                  taken=_attention_taken(attention, config, batch_size, seq_length, True))

    def finetuning(self, preset: str, seq_length: int) -> None:
        from bert_jax import optim  # pylint: disable=import-outside-toplevel
        from bert_jax import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
        from bert_jax import steps  # pylint: disable=import-outside-toplevel
        from bert_jax import tasks  # pylint: disable=import-outside-toplevel
        from bert_jax import train  # pylint: disable=import-outside-toplevel

        batch_size, attention = self.spec["finetune_batch"], self.spec["finetune_attention"]
        for task in self.spec["finetune_tasks"]:
            if self._out_of_time():
                self._row(task, preset, seq_length, batch_size, attention, skipped="time budget (--budget_s)")
                continue
            base = pretraining_config(preset, seq_length, attention, self.spec["dtype"])
            config = model_lib.BertConfig.from_config(base.model)
            try:
                model = tasks.head_model(task, config, batches.TASK_LABELS[task])
                tx, schedule = optim.create_optimizer(base.optim, base.train.num_steps)
                mesh = sharding_lib.create_mesh(base.mesh, self.devices)
                rules = sharding_lib.logical_rules(base.mesh)
                setup = train.Setup.build(model, tx, schedule, mesh, rules, train.init_inputs(seq_length))
                batch = batches.finetune_batch(task, batch_size, seq_length, config.vocab_size, 2)
                result = self._timed_step(setup, setup.jit_train_step(steps.make_classification_train_step(
                    model, tx, schedule, rules)), batch)
                result["real_tokens"] = int(batch["input_mask"].sum())
            except Exception as error:  # pylint: disable=broad-except
                result = {"error": short_error(error)}
            flops = metrics_lib.model_flops_per_sequence(config, seq_length, 0) * batch_size
            self._row(task, preset, seq_length, batch_size, attention, **result, flops_per_step=flops,
                      sequences=batch_size, taken=_attention_taken(attention, config, batch_size, seq_length, False))


def row_order(spec: dict, row: dict) -> tuple:
    """The table's order: pretraining by shape then attention as the flags list them, packing, fine-tuning."""
    if row["section"] != "pretrain":
        return (1 if row["section"] == "pack" else 2, 0, 0)
    shapes = [tuple(shape) for shape in spec["shapes"]]
    shape = (row["preset"], row["seq_length"])
    attention = spec["attention"].index(row["attention"]) if row["attention"] in spec["attention"] else 0
    return (0, shapes.index(shape) if shape in shapes else len(shapes), attention)


def run_jax_side(spec: dict, deadline: float, write=None) -> dict:
    """Every JAX row of `spec`, the device and the matmul ceilings; stops starting rows after `deadline`.
    write(result), if given, gets the result so far after every row."""
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    devices = jax.devices()
    cpu = devices[0].platform == "cpu"
    if spec["dtype"] == "auto":
        spec = dict(spec, dtype="float32" if cpu else "bfloat16")
    matmul_size = spec["matmul_size"] or (1024 if cpu else 8192)
    side = _JaxSide(spec, devices, deadline, matmul_size,
                    on_row=(lambda side: write(_jax_result(side))) if write else None)
    before = step_lib.matmul_ceiling(matmul_size, jnp.dtype(spec["dtype"]))
    side.ceilings = (before, before)
    # Every shape's first attention (which picks the batch), packing and fine-tuning come before the other
    # attentions, so a budget that runs out costs the least telling rows.
    first, others = spec["attention"][:1], spec["attention"][1:]
    pack = {} if spec["pack_shape"] else None
    fitted = {}
    for preset, seq_length in spec["shapes"]:
        shape_pack = pack if spec["pack_shape"] == (preset, seq_length) else None
        fitted[preset, seq_length] = side.pretraining(preset, seq_length, first, shape_pack)
    if pack is not None:
        if "batch_size" not in pack and spec["pack_shape"] not in fitted:  # not among --shapes: measured here
            side.pretraining(*spec["pack_shape"], first, pack)
        side.packing(*spec["pack_shape"], pack)
    if spec["finetune_shape"]:
        side.finetuning(*spec["finetune_shape"])
    for (preset, seq_length), batch_size in fitted.items():
        if batch_size:
            side.pretraining(preset, seq_length, others, fitted=batch_size)
    side.ceilings = (before, step_lib.matmul_ceiling(matmul_size, jnp.dtype(spec["dtype"])))
    return _jax_result(side)


def _jax_result(side: _JaxSide) -> dict:
    import flax  # pylint: disable=import-outside-toplevel
    import jax  # pylint: disable=import-outside-toplevel

    before, after = side.ceilings
    return {"rows": sorted(side.rows, key=functools.partial(row_order, side.spec)),
            "device_kind": side.device.device_kind, "platform": side.device.platform,
            "num_devices": len(side.devices), "jax_version": jax.__version__, "flax_version": flax.__version__,
            "dtype": side.spec["dtype"],
            "peak_flops_per_s": metrics_lib.peak_flops_per_device(side.device) * len(side.devices),
            # Fake CPU devices share the host's cores: its ceiling is not multiplied (as bert_jax.benchmarks.step).
            "ceiling_flops_per_s": max(before, after) * (1 if side.device.platform == "cpu" else len(side.devices)),
            "ceiling_before_flops_per_s": before,
            "ceiling_after_flops_per_s": after, "matmul_size": side.matmul_size,
            "memory_limit_bytes": side.memory_limit}
