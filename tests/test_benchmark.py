"""Smoke test of the train-step benchmark (bert_jax.benchmarks.step): figures present and consistent, never timed."""

import json
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.benchmarks import batches
from bert_jax.benchmarks import step as benchmark
from bert_jax.benchmarks import matmul_bound
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import runtime
from tests.helpers import ROOT


def _shell_env() -> dict:
    """A user's shell for a benchmark program: no JAX_PLATFORMS, one CPU device, none of the suite's XLA flags but
    its choice of XLA:CPU's older emitters at -O0, with which the steps compile faster (tests/conftest.py)."""
    env = {name: value for name, value in os.environ.items() if name not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    emitters = [word for word in os.environ.get("XLA_FLAGS", "").split()
                if word.startswith("--xla_cpu_use_fusion_emitters=")]
    if emitters:
        env["XLA_FLAGS"] = " ".join(emitters)
    return env


def _finetune_env() -> dict:
    """`_shell_env` with one OpenMP thread for the fine-tuning benchmark's torch side: on a host whose cores are all
    busy, torch's spinning OpenMP threads slow its few tiny steps a hundredfold; the tests check figures, not speed."""
    return dict(_shell_env(), OMP_NUM_THREADS="1")


def test_run_reports_jax_and_torch_steps_with_consistent_flops():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    lines = []
    # Four of the eight fake devices: batch 4 is then one sequence per device, a really sharded step. One torch
    # thread: on a host whose cores are all busy, torch's spinning OpenMP threads slow its steps many times over.
    results = benchmark.run(["tiny"], seq_length=32, batch_size=4, steps=2, warmup=0, matmul_size=256,
                            compare_torch=True, threads=1, devices=jax.devices()[:4], print_fn=lines.append)
    (result,) = results
    assert result["max_predictions"] == 5  # 15% of 32
    assert len(result["step_times"]) == 2 and min(result["step_times"]) > 0 and result["step_s"] > 0
    assert result["compile_s"] > 0 and np.isfinite(result["loss"])
    expected_flops = metrics_lib.model_flops_per_sequence(result["model_config"], 32, 5) * 4
    assert result["flops_per_step"] == expected_flops
    assert result["tokens_per_s"] == pytest.approx(result["seq_per_s"] * 32)
    assert 0 < result["mfu_ceiling"] < 1.5
    # The ceiling is measured before and after the steps; MFU is against the higher of the two.
    ceiling = max(result["ceiling_before_flops_per_s"], result["ceiling_after_flops_per_s"])
    assert min(result["ceiling_before_flops_per_s"], result["ceiling_after_flops_per_s"]) > 0
    assert result["ceiling_flops_per_s"] == ceiling
    assert result["mfu_ceiling"] == pytest.approx(result["model_flops_per_s"] / ceiling)
    assert result["mfu_peak"] is None  # no nominal peak for a CPU
    assert result["xla_bytes"] > 0 and result["peak_bytes"] > 0
    assert result["torch_stock_s"] > 0 and result["torch_gathered_s"] > 0 and result["torch_threads"] >= 1
    assert result["speedup_vs_stock"] == pytest.approx(result["torch_stock_s"] / result["step_s"])
    # Same batch, same architecture, fresh initialisations: both losses sit near ln(vocab) + ln(2) = 11.0.
    assert abs(result["torch_loss"] - result["loss"]) < 1.0

    text = "\n".join(lines)
    step_header = next(line for line in lines if line.startswith("preset") and "compile s" in line)
    torch_header = next(line for line in lines if line.startswith("preset") and "torch stock s" in line)
    for column in benchmark.STEP_COLUMNS:
        assert column in step_header
    for column in benchmark.TORCH_COLUMNS:
        assert column in torch_header
    assert "peak GiB: process peak RSS" in text and "matmul ceiling" in text and "CPU threads" in text
    assert "XLA_FLAGS: " in text and "--xla_cpu_experimental_ynn_fusion_type=reduce" in text
    assert "the step's dots: eigen (BERT_JAX_CPU_DOTS=eigen)" in lines  # the suite's (tests/conftest.py)
    ceiling_line = next(line for line in lines if "matmul ceiling" in line)
    assert f"{ceiling / 1e12:.3f} TFLOP/s, the higher of a measurement before the steps" in ceiling_line
    assert "and one after them" in ceiling_line
    step_row = lines[lines.index(step_header) + 1]
    assert step_row.split()[:4] == ["tiny", "32", "4", "float32"]
    assert len(step_row.split()) == len(benchmark.STEP_COLUMNS)
    assert len(lines[lines.index(torch_header) + 1].split()) == len(benchmark.TORCH_COLUMNS)
    # The spread of each run's timed steps, so a reader can tell a noisy host from a slow step.
    times = sorted(result["step_times"])
    assert (f"tiny (jax): step s min {times[0]:.4f} / median {result['step_s']:.4f} / max {times[-1]:.4f} "
            "over 2 steps") in lines
    # The matmul bound times products on one device; this step ran on four.
    assert result["matmuls"] is None and result["matmul_s"] is None and result["mfu_matmul_bound"] is None
    assert ("tiny: matmuls alone not measured: the step runs on 4 devices; the matmuls are timed alone on one"
            in lines)
    for kind in ("stock", "gathered"):
        times = result[f"torch_{kind}_step_times"]
        assert len(times) == 2 and (f"tiny (torch {kind}): step s min {min(times):.4f} / median "
                                    f"{result[f'torch_{kind}_s']:.4f} / max {max(times):.4f} over 2 steps") in lines


def test_run_on_one_device_times_the_steps_matmuls_alone_and_prints_the_bound(monkeypatch):
    # The fewest calls per timing round (_MIN_CALLS): what is checked is how the times add up, not their precision.
    monkeypatch.setattr(matmul_bound, "_ROUND_SECONDS", 0.0)
    lines = []
    (result,) = benchmark.run(["tiny"], seq_length=32, batch_size=4, steps=1, warmup=0, matmul_size=256,
                              compare_torch=False, devices=jax.devices()[:1], print_fn=lines.append,
                              matmuls="shapes")
    bound = result["matmuls"]
    # Every product of the step, and nothing else: their FLOPs are exactly those the step executes, which the
    # model FLOPs exceed by the last layer's rows that the heads do not read.
    assert bound["flops"] == result["executed_flops_per_step"] < result["flops_per_step"]
    header = next(line for line in lines if line.startswith("model FLOPs: "))
    assert header.endswith(f"rows the heads read: tiny {result['executed_flops_per_step'] / 1e9:.1f} GFLOP")
    assert bound["calls"] == sum(group["count"] for group in bound["groups"])
    assert result["matmul_s"] == bound["seconds"] > 0
    assert result["matmul_s"] == pytest.approx(sum(group["count"] * group["seconds"] for group in bound["groups"]))
    assert result["mfu_matmul_bound"] == pytest.approx(
        result["flops_per_step"] / result["matmul_s"] / result["ceiling_flops_per_s"])
    line = next(line for line in lines if line.startswith("tiny: ") and "matmuls (" in line)
    assert f"{bound['calls']} matmuls ({len(bound['groups'])} distinct)" in line
    assert f"alone {result['matmul_s']:.4f} s" in line and f"MFU bound {result['mfu_matmul_bound']:.1%}" in line
    assert (f"{bound['flops'] / 1e9:.1f} GFLOP executed ({bound['flops'] / result['flops_per_step']:.1%} of the "
            f"model FLOPs; executed FLOP/s {bound['flops'] / result['step_s'] / result['ceiling_flops_per_s']:.1%} "
            "of the ceiling)") in line
    assert f"{result['matmul_s'] / result['step_s']:.1%} of the {result['step_s']:.4f} s step" in line
    # "shapes": one line per distinct matmul, right after the preset's line, slowest in total first.
    start = lines.index(line) + 1
    group_lines = lines[start:start + len(bound["groups"])]
    assert group_lines == [f"  {matmul_bound.group_line(group, result['ceiling_flops_per_s'])}"
                           for group in bound["groups"]]
    totals = [group["count"] * group["seconds"] for group in bound["groups"]]
    assert totals == sorted(totals, reverse=True)


def test_model_flops_count_encoder_matmuls_attention_and_masked_head_only():
    config = model_lib.BertConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256)
    params = jax.eval_shape(lambda: nn.unbox(model_lib.BertForPreTraining(config).init(
        jax.random.key(0), *(np.zeros((1, 16), np.int32),) * 3, np.zeros((1, 3), np.int32))["params"]))
    # N: every encoder-layer kernel (the real model's, counted from its parameter tree).
    encoder_kernels = sum(leaf.size for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                          if path[0].key.startswith("layer_") and path[-1].key == "kernel")
    seq, predictions, h, layers, vocab = 16, 3, 64, 2, 512
    expected = (6 * encoder_kernels * seq + 12 * layers * h * seq * seq
                + 6 * predictions * (h * h + h * vocab) + 6 * (h * h + 2 * h))
    assert metrics_lib.model_flops_per_sequence(config, seq, predictions) == expected


def test_synthetic_batch_masks_distinct_real_tokens():
    batch = batches.synthetic_batch(8, 32, 5, vocab_size=512, seed=1)
    lengths = batch["input_mask"].sum(1)
    for row, positions in enumerate(batch["masked_lm_positions"]):
        assert len(set(positions.tolist())) == 5
        assert positions.min() >= 1 and positions.max() < lengths[row] - 1
    assert (np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], 1) == batches.MASK_ID).all()
    assert (batch["input_ids"][batch["input_mask"] == 0] == 0).all()


@pytest.fixture(scope="module")
def benchmark_imports() -> dict:
    """What a fresh interpreter loads importing the step benchmark alone, then every benchmark after it: one start
    for the two tests below. Returns the top-level packages of interest loaded at each point."""
    code = ("import importlib, json, sys; from absl import flags\n"
            "absl_flags = set(flags.FLAGS)\n"
            "loaded = {}\n"
            "names = ('step', 'export', 'checkpoint', 'compile', 'finetune', 'calibrate', 'input', 'data', 'gpu',\n"
            "         'sentences')\n"
            "for name in names:\n"
            "    importlib.import_module(f'bert_jax.benchmarks.{name}')\n"
            "    for flag in set(flags.FLAGS) - absl_flags: delattr(flags.FLAGS, flag)  # each defines its own\n"
            "    if name == 'step':\n"
            "        loaded['step'] = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tensorflow', 'torch', 'transformers'})\n"
            "loaded['configs'] = sorted(m for m in sys.modules if m.split('.')[0] == 'configs')\n"
            "print(json.dumps(loaded))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_benchmark_imports_no_tensorflow_or_torch(benchmark_imports):
    # It must run on a JAX-only accelerator image: torch is imported only when the comparison runs.
    assert not benchmark_imports["step"], benchmark_imports["step"]


def test_the_benchmarks_take_their_presets_from_bert_jax_not_configs(benchmark_imports):
    # They run from an installed package, where no configs/ directory is at hand (DESIGN: presets from bert_jax).
    assert not benchmark_imports["configs"], benchmark_imports["configs"]


@pytest.mark.parametrize("before, after", [(1.0e11, 2.0e11), (2.0e11, 1.0e11)])
def test_mfu_is_against_the_higher_of_the_ceilings_measured_before_and_after_the_steps(monkeypatch, before, after):
    # A host that slows for a moment during one ceiling measurement must not lower the ceiling and inflate MFU.
    measured = iter([before, after])
    monkeypatch.setattr(benchmark, "matmul_ceiling", lambda *args, **kwargs: next(measured))
    fake = {"size": "tiny", "seq_length": 32, "batch_size": 4, "dtype": "float32", "compile_s": 1.0, "step_s": 0.5,
            "step_times": [0.7, 0.5, 0.4], "seq_per_s": 8.0, "tokens_per_s": 256.0, "flops_per_step": 5.0e10,
            "model_flops_per_s": 1.0e11, "executed_flops_per_step": 4.5e10, "xla_bytes": 2**30, "peak_bytes": 2**31,
            "peak_kind": "process peak RSS"}
    monkeypatch.setattr(benchmark, "benchmark_step", lambda *args, **kwargs: dict(fake))
    lines = []
    (result,) = benchmark.run(["tiny"], seq_length=32, batch_size=4, steps=2, warmup=0, matmul_size=256,
                              compare_torch=False, print_fn=lines.append)
    assert next(measured, None) is None  # exactly two measurements: before and after
    assert result["ceiling_before_flops_per_s"] == before and result["ceiling_after_flops_per_s"] == after
    assert result["ceiling_flops_per_s"] == 2.0e11 and result["mfu_ceiling"] == pytest.approx(0.5)
    ceiling_line = next(line for line in lines if "matmul ceiling" in line)
    assert (f"0.200 TFLOP/s, the higher of a measurement before the steps, {before / 1e12:.3f}, "
            f"and one after them, {after / 1e12:.3f}") in ceiling_line
    step_row = lines[lines.index(next(line for line in lines if line.startswith("preset"))) + 1]
    assert "50.0%" in step_row.split()
    assert "tiny (jax): step s min 0.4000 / median 0.5000 / max 0.7000 over 3 steps" in lines
    # The fake step timed no matmuls: the fields are there, empty, and the line says so.
    assert result["matmul_s"] is None and result["mfu_matmul_bound"] is None
    assert "tiny: matmuls alone not measured: off" in lines


def test_matmul_bound_line_says_when_the_matmuls_alone_took_longer_than_the_step():
    group = {"matmul": matmul_bound.Matmul((2, 3), "float32", (3, 4), "float32", ((((1,), (0,)), ((), ())), None)),
             "count": 4, "seconds": 0.5, "flops": 48}
    result = {"size": "tiny", "step_s": 1.5, "flops_per_step": 192,
              "matmuls": {"seconds": 2.0, "flops": 192, "calls": 4, "groups": [group], "notes": []}}
    benchmark.add_matmul_bound_fields(result, ceiling=100.0)
    header, line = benchmark.matmul_bound_lines([result], ceiling=100.0)
    assert header.startswith("matmuls alone:")
    assert "alone 2.0000 s" in line and "133.3% of the 1.5000 s step" in line
    assert "longer than the step: the host was slower while they were timed" in line
    assert result["matmul_s"] == 2.0 and result["mfu_matmul_bound"] == pytest.approx(192 / 2.0 / 100.0)
    result["step_s"] = 2.5
    line = benchmark.matmul_bound_lines([result], ceiling=100.0)[1]
    assert "the other 0.5000 s is work outside the matmuls" in line and "MFU bound 96.0%" in line


def test_the_program_runs_on_the_cpu_without_libtpus_start_up_noise():
    # JAX_PLATFORMS unset, as a user's shell leaves it: with libtpu installed (the test extra) and no TPU attached,
    # the program picks the CPU itself before JAX starts, instead of letting libtpu try and fail loudly.
    env = _shell_env()
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.benchmarks.step", "--size=tiny", "--seq_length=16", "--batch_size=2",
         "--steps=1", "--warmup=0", "--matmul_size=64", "--matmuls=off", "--compare_torch=false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "devices: 1 x cpu" in result.stdout, result.stdout
    # The driver's XLA:CPU options (bert_jax.runtime) added to the user's own, set by the program before JAX started.
    assert f"XLA_FLAGS: {runtime.with_cpu_xla_flags(env.get('XLA_FLAGS', ''))}\n" in result.stdout, result.stdout
    for noise in ("Failed to find host bounds for accelerator type", "Logging before InitGoogle()",
                  "TPU_ACCELERATOR_TYPE", "Unable to initialize backend 'tpu'"):
        assert noise not in result.stderr, result.stderr[-3000:]


def test_finetune_benchmark_times_our_job_and_transformers_on_the_same_task():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.benchmarks.finetune", "--steps=4", "--log_every=2", "--rounds=1",
         "--examples=64", "--layers=1", "--hidden=32", "--heads=2", "--intermediate=64", "--vocab_size=300",
         "--seq_length=16", "--batch_size=8"],
        cwd=ROOT, env=_finetune_env(), capture_output=True, text=True, timeout=280, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for side in ("jax", "torch"):
        [line] = [line for line in lines if line.startswith(f"round 1 {side}: steady ")]
        assert "examples/s (windows s: " in line and "peak RSS" in line
        windows = [float(value) for value in line.split("windows s: ")[1].split(")")[0].split(", ")]
        assert len(windows) == 2  # 4 steps in windows of 2
        loop = float(re.search(r"; loop ([\d.]+) s;", line).group(1))  # both sides' loops, compilation included
        assert loop == pytest.approx(sum(windows), abs=0.06), line
    assert any(line.startswith("jax / torch: ") for line in lines)
    assert "Failed to find host bounds" not in result.stderr


def test_finetune_benchmark_task_labels_follow_the_keyword(tmp_path):
    from bert_jax.benchmarks import finetune as finetune_benchmark  # pylint: disable=import-outside-toplevel
    vocab, table = finetune_benchmark.write_task(str(tmp_path), examples=50, vocab_size=100)
    words = open(vocab, encoding="utf-8").read().split()
    assert len(words) == 100 and words[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    rows = [line.rsplit(",", 1) for line in open(table, encoding="utf-8").read().splitlines()[1:]]
    assert len(rows) == 50 and {label for _, label in rows} == {"0", "1"}
    assert all(("keyword" in sentence.split()) == (label == "1") for sentence, label in rows)
    assert all(set(sentence.split()) <= set(words) for sentence, _ in rows)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tokens", "qa"])
def test_finetune_benchmark_times_token_classification_and_question_answering(task, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.benchmarks.finetune", f"--task={task}", "--steps=4", "--log_every=2",
         "--rounds=1", "--examples=32", "--layers=1", "--hidden=32", "--heads=2", "--intermediate=64",
         "--vocab_size=300", "--seq_length=32", "--batch_size=8", f"--json_out={out}"],
        cwd=ROOT, env=_finetune_env(), capture_output=True, text=True, timeout=280, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"task: {task}, 32 ")
    runs = json.loads(out.read_text())
    assert [(run["round"], run["side"], run["task"]) for run in runs] == [(1, "jax", task), (1, "torch", task)]
    for run in runs:
        assert len(run["windows_s"]) == 2 and min(run["windows_s"]) > 0  # 4 steps in windows of 2
        assert run["steady_examples_per_s"] > 0 and run["job_s"] > 0 and run["peak_rss_gib"] > 0
    torch_run = runs[1]
    assert torch_run["threads"] >= 1 and "transformers" in torch_run["versions"]
    assert torch_run["rows"] >= 32  # a CoNLL sentence fills one row or more; a question one window or more
    assert f"round 1 torch: steady {torch_run['steady_examples_per_s']:.1f} examples/s" in result.stdout


def test_finetune_benchmark_writes_valid_conll_and_squad_tasks(tmp_path):
    from bert_jax.benchmarks import finetune as finetune_benchmark  # pylint: disable=import-outside-toplevel
    from bert_jax.data import conll, squad, tokenization  # pylint: disable=import-outside-toplevel
    vocab, table = finetune_benchmark.write_task(str(tmp_path), examples=40, vocab_size=100, task="tokens")
    words = set(open(vocab, encoding="utf-8").read().split())
    sentences = conll.read_conll(table)
    tags = {tag for sentence in sentences for tag in sentence.tags}
    assert len(sentences) == 40 and tags == {"O"} | {f"{p}-{e}" for p in "BI" for e in ("PER", "ORG", "LOC", "MISC")}
    assert all(conll.to_iob2(sentence.tags) == sentence.tags for sentence in sentences)  # IOB2 already
    assert all(set(sentence.words) <= words for sentence in sentences)

    vocab, path = finetune_benchmark.write_task(str(tmp_path), examples=40, vocab_size=100, task="qa")
    examples = squad.read_squad(path)  # every answer lies at its answer_start, none skipped
    assert len(examples) == 40 and all(len(example.answers) == 1 for example in examples)
    windows = squad.encode(tokenization.load_tokenizer(vocab, do_lower_case=True), examples, 32, 8, 8)
    # Every answer lies wholly in some window: its pieces there are its words.
    for index, example in enumerate(examples):
        row = next(row for row in np.flatnonzero(windows.example == index) if windows.start_positions[row] > 0)
        span = windows.input_ids[row, windows.start_positions[row]:windows.end_positions[row] + 1]
        assert len(span) == len(example.answers[0].split())


def test_the_modern_encoder_is_timed_against_transformers_modernbert_on_the_same_batch():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    lines = []
    # One torch thread (see test_run_reports_jax_and_torch_steps_with_consistent_flops): figures checked, not speed.
    (result,) = benchmark.run(["tiny"], seq_length=32, batch_size=2, steps=1, warmup=0, matmul_size=256,
                              compare_torch=True, threads=1, devices=jax.devices()[:1], print_fn=lines.append,
                              matmuls="off", arch="modern")
    assert type(result["model_config"]).__name__ == "ModernConfig"
    assert result["flops_per_step"] == metrics_lib.model_flops_per_sequence(result["model_config"], 32, 5) * 2
    assert result["executed_flops_per_step"] == result["flops_per_step"]  # every row of every layer
    assert result["torch_stock_s"] > 0 and result["torch_gathered_s"] > 0
    # Masked LM only on both sides, fresh initialisations: both losses sit near ln(50368) = 10.8.
    assert abs(result["loss"] - 10.83) < 0.3 and abs(result["torch_loss"] - 10.83) < 0.3, result
    assert any(line.startswith("HuggingFace ModernBertForMaskedLM on cpu") and "forward + MLM loss" in line
               for line in lines), lines
    assert not any("pooler/NSP" in line or "[CLS] and masked rows" in line for line in lines)
