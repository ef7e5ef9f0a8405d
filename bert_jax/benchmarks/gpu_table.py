"""The GPU check's table (bert_jax.benchmarks.gpu): the JAX side's rows with transformers' figures beside them, its
header lines, and the text and markdown forms printed and written to gpu_check.md.
"""

from bert_jax import runtime

COLUMNS = ("section", "model", "seq", "batch", "attention", "compile s", "step s", "seq/s", "real tok/s", "MFU peak",
           "MFU ceil", "XLA GiB", "torch s", "torch gath s", "torch GiB", "x torch", "note")
# Printed beside the result; from NVIDIA's published MLPerf Training BERT-large results on H100.
ANCHORS = ("anchor: NVIDIA MLPerf Training BERT-large (seq 512, packed) on H100: about 970 sequences/s per GPU",)


def _torch_for(row: dict, torch_result: dict | None) -> dict | None:
    if not torch_result:
        return None
    task = "pretraining" if row["section"] in ("pretrain", "pack") else row["section"]
    for job in torch_result["jobs"]:
        if (job["task"], job["preset"], job["seq_length"], job["batch_size"]) == (
                task, row["preset"], row["seq_length"], row["batch_size"]):
            return job
    return None


def table_rows(result: dict) -> list[tuple]:
    """The table: one tuple of COLUMNS' values (strings) per JAX row, with its transformers figures beside it.

    Packing rows compare with transformers' unpacked step (the only layout it has) over the instances trained."""
    jax_result, torch_result = result["jax"], result.get("torch")
    peak, ceiling = jax_result["peak_flops_per_s"], jax_result["ceiling_flops_per_s"]
    rows = []
    for row in jax_result["rows"]:
        attention = row["attention"] if row.get("taken", row["attention"]) == row["attention"] else (
            f"{row['attention']}>{row['taken']}")
        section = row["section"] + ({True: " on", False: " off"}.get(row.get("packed"), ""))
        head = (section, row["preset"], str(row["seq_length"]), str(row["batch_size"] or "-"), attention)
        if row.get("step_s") is None:
            note = row.get("skipped") or row.get("error") or "no result"
            rows.append(head + ("-",) * (len(COLUMNS) - len(head) - 1) + (note,))
            continue
        step_s = row["step_s"]
        flops_per_s = row["flops_per_step"] / step_s
        torch_job = _torch_for(row, torch_result)
        torch_s = torch_job.get("step_s") if torch_job else None
        # Per instance trained: a packed step trains more instances than transformers' unpacked one of equal rows.
        ratio = (torch_s / row["batch_size"]) / (step_s / row["sequences"]) if torch_s else None
        notes = []
        if row.get("larger_batches"):
            notes.append("larger: " + "; ".join(row["larger_batches"]))
        if torch_job and torch_job.get("error"):
            notes.append("torch: " + torch_job["error"])
        elif torch_job and torch_job.get("skipped"):
            notes.append("torch skipped: " + torch_job["skipped"])
        gathered = torch_job.get("gathered_step_s") if torch_job else None
        torch_peak = torch_job.get("peak_bytes") if torch_job else None
        rows.append(head + (
            f"{row['compile_s']:.1f}", f"{step_s:.4f}", f"{row['sequences'] / step_s:.1f}",
            f"{row['real_tokens'] / step_s:.0f}", f"{flops_per_s / peak:.1%}" if peak else "n/a",
            f"{flops_per_s / ceiling:.1%}", f"{row['xla_bytes'] / 2**30:.2f}",
            f"{torch_s:.4f}" if torch_s else "-", f"{gathered:.4f}" if gathered else "-",
            f"{torch_peak / 2**30:.2f}" if torch_peak else "-", f"{ratio:.2f}" if ratio else "-",
            "; ".join(notes)))
    return rows


def header_lines(result: dict) -> list[str]:
    jax_result, torch_result = result["jax"], result.get("torch")
    peak = jax_result["peak_flops_per_s"]
    lines = [f"device: {jax_result['num_devices']} x {jax_result['device_kind']} ({jax_result['platform']}); "
             f"jax {jax_result['jax_version']}, flax {jax_result['flax_version']}; dropout RNG "
             f"{runtime.dropout_rng_name(result['spec'].get('dropout_rng', 'auto'), jax_result['platform'])}"
             + (f"; torch {torch_result['torch_version']} (CUDA {torch_result['cuda']}), transformers "
                f"{torch_result['transformers_version']}" if torch_result else "; transformers not run"),
             f"nominal bf16 peak: {peak / 1e12:.0f} TFLOP/s" if peak else "nominal bf16 peak: unknown for this device",
             f"measured {jax_result['dtype']} matmul ceiling ({jax_result['matmul_size']}^3): "
             f"{jax_result['ceiling_flops_per_s'] / 1e12:.4g} TFLOP/s (the higher of before the steps, "
             f"{jax_result['ceiling_before_flops_per_s'] / 1e12:.4g}, and after them, "
             f"{jax_result['ceiling_after_flops_per_s'] / 1e12:.4g})",
             f"{jax_result['dtype']} compute, float32 parameters and optimizer; model FLOPs as bert_jax.metrics counts "
             "them; seq/s "
             "counts instances (several per packed row); x torch = transformers' time per instance / ours; "
             "cudnn and xla rows: attention dropout 0 (the fused kernels have none), reference and transformers: 0.1; "
             "A>B: attention A requested, B ran",
             *ANCHORS]
    if result.get("jax_error"):
        lines.append(f"JAX side failed: {result['jax_error']}")
    if result.get("torch_error"):
        lines.append(f"torch side failed: {result['torch_error']}")
    return lines


def format_table(rows: list[tuple]) -> list[str]:
    widths = [max(len(column), *(len(row[index]) for row in rows)) if rows else len(column)
              for index, column in enumerate(COLUMNS)]
    widths[-1] = 0  # the note runs on

    def line(values):
        return " ".join(f"{value:<{width}}" if index in (0, 1, 4, len(COLUMNS) - 1) else f"{value:>{width}}"
                        for index, (value, width) in enumerate(zip(values, widths))).rstrip()
    return [line(COLUMNS), *(line(row) for row in rows)]


def markdown(result: dict, rows: list[tuple]) -> str:
    escape = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = [f"- {escape(line)}" for line in header_lines(result)]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(escape(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
