"""Fine-tuning benchmark: bert_jax's fine-tuning job against transformers' loop, same model shape, same data.

`python -m bert_jax.benchmarks.finetune --steps=60 --rounds=2 [--task=sequence|tokens|qa] [--json_out=FILE]`

It writes a task and a WordPiece vocab.txt of whole words into a temporary directory (--task is the task's name, as
in configs/finetune.py:task=NAME): sequence (the default) sentence classification, a CSV of random sentences whose
label is set by a keyword; tokens: token classification, a CoNLL file of random sentences with CoNLL-2003's 9 IOB2
tags; qa: extractive question answering, a SQuAD v1.1 JSON of random paragraphs with one answer span each
(max_query_length and doc_stride --seq_length // 4). Then it times, in turn and in separate processes (A B A B,
so a noisy host slows both alike, and so torch's thread pool never competes with XLA's):
- jax: the driver's fine-tuning job (`bert_jax.finetune.finetune`, as `--mode=finetune` runs it) from scratch with
  the architecture of all-MiniLM-L6-v2 by default (6 layers, hidden 384, 12 heads, intermediate 1536, exact gelu);
- torch: transformers' BertForSequenceClassification (BertForTokenClassification, BertForQuestionAnswering) with the
  same shape, on the same encoded rows (our tokenizer's ids padded to --seq_length; conll.encode's rows with their
  labels, squad.encode's windows with their start and end positions), in the same order, with the job's optimizer
  (clip 1.0, AdamW with weight decay 0.01 off biases and LayerNorm, linear warmup and decay), dropout on.
Each prints the seconds of every window of --log_every steps; the first window (compilation, first allocations) is
left out of the steady rate (examples/s: rows per second; for qa a row is one passage window). Also printed: the
whole job's wall time, and each process's peak RSS.
Run as a program, it sets the driver's process options (XLA:CPU flags, the CPU where no TPU is attached) in the jax
child before JAX starts.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

from bert_jax import presets
from bert_jax import runtime

def _define_flags():
    """The program's flags, defined only when it runs: importing this module (a test does) defines none, so they
    never collide with another benchmark's."""
    flags.DEFINE_integer("layers", 6, "Encoder layers (all-MiniLM-L6-v2: 6).")
    flags.DEFINE_integer("hidden", 384, "Hidden size (all-MiniLM-L6-v2: 384).")
    flags.DEFINE_integer("heads", 12, "Attention heads (all-MiniLM-L6-v2: 12).")
    flags.DEFINE_integer("intermediate", 1536, "Feed-forward width (all-MiniLM-L6-v2: 1536).")
    flags.DEFINE_integer("vocab_size", 30522, "Vocabulary rows (all-MiniLM-L6-v2: 30522).")
    flags.DEFINE_integer("seq_length", 64, "Rows are padded or truncated to this many tokens.")
    flags.DEFINE_integer("batch_size", 32, "Examples per step.")
    flags.DEFINE_integer("examples", 2200, "Training sentences written.")
    flags.DEFINE_integer("steps", 60, "Training steps of each run.")
    flags.DEFINE_integer("log_every", 10, "Steps per timed window.")
    flags.DEFINE_integer("rounds", 2, "Rounds of (jax, torch), run one after the other.")
    flags.DEFINE_list("sides", ["jax", "torch"], "What each round runs, in order: jax, torch.")
    flags.DEFINE_float("learning_rate", 1e-4, "Peak learning rate of both.")
    flags.DEFINE_enum("task", "sequence", list(TASKS), "What is fine-tuned: sequence (sentence classification, "
                      "a CSV), tokens (token classification, CoNLL), qa (extractive question answering, SQuAD), "
                      "regression (a score per sentence, a CSV).")
    flags.DEFINE_string("json_out", "", "Also write every run's result (its round, side, steady examples/s, "
                        "windows, peak RSS) to this JSON file.")
    flags.DEFINE_string("side", "", "Internal: run one side in this process on --task_dir and print its JSON.")
    flags.DEFINE_string("task_dir", "", "Internal: the task written by the parent.")


FLAGS = flags.FLAGS

RESULT_PREFIX = "RESULT "
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# --task (a task's one name: configs/finetune.py:task=NAME, bert_jax.tasks.NAMES) -> (the training file's name,
# transformers' head).
TASKS = {"sequence": ("train.csv", "BertForSequenceClassification"),
         "tokens": ("train.conll", "BertForTokenClassification"),
         "qa": ("train.json", "BertForQuestionAnswering"),
         "regression": ("train.csv", "BertForSequenceClassification")}
# The one file format bert_jax.tasks reads for these tasks (importing the tasks would load jax into the torch side).
FILE_FORMATS = {"tokens": "conll", "qa": "squad"}
# CoNLL-2003's 9 tags, IOB2.
_ENTITIES = ("PER", "ORG", "LOC", "MISC")


def _sentence(rng, words: list[str], low: int, high: int) -> list[str]:
    """low to high Zipf-distributed words (never the last one, "keyword")."""
    return [words[(int(z) - 1) % (len(words) - 1)] for z in rng.zipf(1.3, size=int(rng.integers(low, high + 1)))]


def _write_sequence(file, rng, words: list[str], examples: int) -> None:
    """sentence,label rows; the label is whether the sentence holds the word "keyword"."""
    file.write("sentence,label\n")
    for _ in range(examples):
        sentence = _sentence(rng, words, 4, 40)
        label = int(rng.integers(0, 2))
        if label:
            sentence[int(rng.integers(0, len(sentence)))] = "keyword"
        file.write(f"{' '.join(sentence)},{label}\n")


def _write_regression(file, rng, words: list[str], examples: int) -> None:
    """sentence,label rows; the label (0 to 5) is 1.25 times the times the sentence holds the word "keyword"."""
    file.write("sentence,label\n")
    for _ in range(examples):
        sentence, count = _sentence(rng, words, 4, 40), int(rng.integers(0, 5))
        for _ in range(count):
            sentence[int(rng.integers(0, len(sentence)))] = "keyword"
        file.write(f"{' '.join(sentence)},{1.25 * sentence.count('keyword'):.2f}\n")


def _write_tokens(file, rng, words: list[str], examples: int) -> None:
    """CoNLL sentences: a word and its tag per line; one word in four opens an entity of 1 to 3 words."""
    for _ in range(examples):
        sentence, position = _sentence(rng, words, 4, 40), 0
        while position < len(sentence):
            length = int(rng.integers(1, 4)) if rng.random() < 0.25 else 0
            entity = _ENTITIES[int(rng.integers(0, len(_ENTITIES)))]
            tags = [f"B-{entity}"] + [f"I-{entity}"] * (length - 1) if length else ["O"]
            for tag in tags[:len(sentence) - position]:
                file.write(f"{sentence[position]} {tag}\n")
                position += 1
        file.write("\n")


def _write_qa(file, rng, words: list[str], examples: int) -> None:
    """SQuAD v1.1: one question (3 to 8 words) per paragraph (20 to 120 words), its answer 1 to 4 of them."""
    paragraphs = []
    for index in range(examples):
        context = _sentence(rng, words, 20, 120)
        first = int(rng.integers(0, len(context)))
        answer = " ".join(context[first:first + int(rng.integers(1, 5))])
        start = len(" ".join(context[:first])) + (1 if first else 0)
        question = " ".join(_sentence(rng, words, 3, 8))
        paragraphs.append({"context": " ".join(context), "qas": [
            {"id": f"q{index}", "question": question + "?", "answers": [{"text": answer, "answer_start": start}]}]})
    json.dump({"version": "1.1", "data": [{"title": "benchmark", "paragraphs": paragraphs}]}, file)


def write_task(directory: str, examples: int, vocab_size: int, seed: int = 0,
               task: str = "sequence") -> tuple[str, str]:
    """vocab.txt (whole lower-case words) and the task's training file in `directory`; returns their paths.

    Sentence lengths (4 to 40 words) and Zipf-distributed words look like short text, the kind sentence embedders
    are fine-tuned on. sequence: train.csv (sentence,label), the label whether the sentence holds the word
    "keyword"; tokens: train.conll, CoNLL-2003's 9 IOB2 tags; qa: train.json, SQuAD v1.1 questions; regression:
    train.csv (sentence,label), the label 1.25 times the times the sentence holds "keyword"."""
    rng = np.random.default_rng(seed)
    words = [f"w{index}" for index in range(vocab_size - len(_SPECIALS) - 1)] + ["keyword"]
    vocab_path, train_path = os.path.join(directory, "vocab.txt"), os.path.join(directory, TASKS[task][0])
    with open(vocab_path, "w", encoding="utf-8") as file:
        file.write("\n".join(_SPECIALS + words) + "\n")
    writer = {"sequence": _write_sequence, "tokens": _write_tokens, "qa": _write_qa, "regression": _write_regression}[
        task]
    with open(train_path, "w", encoding="utf-8") as file:
        writer(file, rng, words, examples)
    return vocab_path, train_path


def task_config(vocab_path: str, train_path: str, task: str = "sequence"):
    """The fine-tuning job's defaults (bert_jax.presets, as configs/finetune.py starts from them) with the
    benchmark's task, shape, data, steps and learning rate; no evaluation."""
    config = presets.finetuning_config("mini")
    config.task = task
    if task in FILE_FORMATS:  # as configs/finetune.py's task=tokens and task=qa set it
        config.data.format = FILE_FORMATS[task]
    model = config.model
    model.num_layers, model.hidden_size, model.num_heads = FLAGS.layers, FLAGS.hidden, FLAGS.heads
    model.intermediate_size, model.vocab_size, model.hidden_act = FLAGS.intermediate, FLAGS.vocab_size, "gelu"
    config.data.train_file, config.data.vocab_file = train_path, vocab_path
    config.data.max_seq_length = FLAGS.seq_length
    # qa: the original's 384 / 64 / 128 (query and stride a sixth and a third of the row) scaled to a quarter each.
    config.data.max_query_length = config.data.doc_stride = FLAGS.seq_length // 4
    config.train.batch_size, config.train.num_steps = FLAGS.batch_size, FLAGS.steps
    config.train.log_every = FLAGS.log_every
    config.optim.learning_rate = FLAGS.learning_rate
    return config


def run_jax(task_dir: str) -> dict:
    """The driver's fine-tuning job on the task; window seconds from its metrics.jsonl."""
    from bert_jax import finetune  # pylint: disable=import-outside-toplevel
    from bert_jax import job_config  # pylint: disable=import-outside-toplevel
    config = _config_of(task_dir)
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        finetune.finetune(job_config.prepare(config, workdir, "finetune"), workdir)
        job_s = time.perf_counter() - start
        with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as file:
            records = [json.loads(line) for line in file if line.strip()]
    windows = [FLAGS.log_every * FLAGS.batch_size / record["examples_per_second"] for record in records
               if "examples_per_second" in record]
    return {"windows_s": windows, "job_s": job_s}


def _config_of(task_dir: str):
    return task_config(os.path.join(task_dir, "vocab.txt"), os.path.join(task_dir, TASKS[FLAGS.task][0]), FLAGS.task)


def torch_rows(config, task: str) -> tuple[dict, dict, int]:
    """(inputs, targets, num_labels) as the job encodes them, without JAX: the three input arrays [rows, length]
    and, by transformers' argument name, the targets of each row (-100 where the token loss ignores a position)."""
    from bert_jax.data import conll, finetune_data, squad, tokenization  # pylint: disable=import-outside-toplevel
    data = config.data
    tokenizer = tokenization.load_tokenizer(data.vocab_file, do_lower_case=True)
    if task == "tokens":  # as bert_jax.tasks.tokens: tag ids in sorted order
        sentences = conll.read_conll(data.train_file)
        names = sorted({tag for sentence in sentences for tag in sentence.tags})
        rows = conll.encode(tokenizer, sentences, {name: i for i, name in enumerate(names)}, data.max_seq_length)
        return rows.arrays(), {"labels": np.where(rows.labels == conll.IGNORE, -100, rows.labels)}, len(names)
    if task == "qa":
        windows = squad.encode(tokenizer, squad.read_squad(data.train_file), data.max_seq_length, data.doc_stride,
                               data.max_query_length)
        return windows.arrays(), {"start_positions": windows.start_positions,
                                  "end_positions": windows.end_positions}, 2
    examples = finetune_data.read_examples(data.train_file, data)
    encoded = finetune_data.encode_examples(tokenizer, examples, data.max_seq_length)
    if task == "regression":  # one output, float targets: transformers' problem_type="regression"
        return encoded, {"labels": np.asarray([float(label) for label in examples.labels], np.float32)}, 1
    names = finetune_data.label_names(examples, data)
    return encoded, {"labels": finetune_data.label_ids(examples, names)}, len(names)


def torch_model(model_config, head: str, num_labels: int):
    """transformers' `head` (e.g. BertForTokenClassification) with the job's architecture, in training mode."""
    import transformers  # pylint: disable=import-outside-toplevel
    hf_config = transformers.BertConfig(
        vocab_size=model_config.vocab_size, hidden_size=model_config.hidden_size,
        num_hidden_layers=model_config.num_layers, num_attention_heads=model_config.num_heads,
        intermediate_size=model_config.intermediate_size, hidden_act="gelu",
        max_position_embeddings=model_config.max_position_embeddings, type_vocab_size=model_config.type_vocab_size,
        hidden_dropout_prob=model_config.dropout_rate, attention_probs_dropout_prob=model_config.attention_dropout_rate,
        layer_norm_eps=model_config.layer_norm_eps, num_labels=num_labels,
        problem_type="regression" if num_labels == 1 else None)
    return getattr(transformers, head)(hf_config).train()


def torch_optimizer(model, config):
    """The job's optimizer: AdamW, weight decay 0.01 off biases and LayerNorm, and its schedule (linear warmup then
    linear decay to 0) in Python: evaluating the optax one here would start JAX's thread pool beside torch's."""
    import torch  # pylint: disable=import-outside-toplevel
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1.0, betas=(0.9, 0.999), eps=1e-6)
    warmup, peak = int(config.optim.warmup_proportion * FLAGS.steps), config.optim.learning_rate
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: peak * (
        step / warmup if step < warmup else max(0.0, 1 - (step - warmup) / max(FLAGS.steps - warmup, 1))))
    return optimizer, scheduler


def run_torch(task_dir: str) -> dict:
    """transformers' model for the task on the rows our tokenizer encodes, in the job's order."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    from bert_jax.data import finetune_data  # pylint: disable=import-outside-toplevel

    config = _config_of(task_dir)
    inputs, targets, num_labels = torch_rows(config, FLAGS.task)
    torch.manual_seed(0)
    model = torch_model(config.model, TASKS[FLAGS.task][1], num_labels)
    optimizer, scheduler = torch_optimizer(model, config)
    rows = len(inputs["input_ids"])
    batches = finetune_data.train_batches(rows, FLAGS.batch_size, config.train.seed)
    windows, start, job_start = [], time.perf_counter(), time.perf_counter()
    for step in range(1, FLAGS.steps + 1):
        indices = next(batches)
        output = model(input_ids=torch.as_tensor(inputs["input_ids"][indices], dtype=torch.long),
                       attention_mask=torch.as_tensor(inputs["input_mask"][indices], dtype=torch.long),
                       token_type_ids=torch.as_tensor(inputs["segment_ids"][indices], dtype=torch.long),
                       **{name: torch.as_tensor(value[indices], dtype=torch.float32 if value.dtype.kind == "f"
                                                else torch.long) for name, value in targets.items()})
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % FLAGS.log_every == 0:
            output.loss.item()
            windows.append(time.perf_counter() - start)
            start = time.perf_counter()
    # jaxlib bundles its own oneDNN and thread pools: the torch process must not load it beside torch's.
    assert "jaxlib" not in sys.modules, "the torch process loaded jaxlib"
    return {"windows_s": windows, "job_s": time.perf_counter() - job_start, "threads": torch.get_num_threads(),
            "rows": rows, "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
            "attention": model.config._attn_implementation or "default"}  # pylint: disable=protected-access


def _child(side: str, task_dir: str) -> None:
    if side == "jax":
        # Before JAX starts its backend, as the driver does.
        runtime.set_up_jax()
        result = run_jax(task_dir)
    else:
        result = run_torch(task_dir)
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def steady_rate(windows_s: list[float]) -> float:
    """Examples/s over every window but the first (compilation and first allocations)."""
    steady = windows_s[1:] or windows_s
    return len(steady) * FLAGS.log_every * FLAGS.batch_size / sum(steady)


def run_side(side: str, task_dir: str, passed: list[str]) -> dict:
    """One side's run in a child process; its result with the steady rate added."""
    command = [sys.executable, "-m", "bert_jax.benchmarks.finetune", f"--side={side}", f"--task_dir={task_dir}",
               *passed]
    env = dict(os.environ)
    if side == "jax":  # the allocator the driver's CPU runs have, unless GLIBC_TUNABLES is yours
        env.setdefault("GLIBC_TUNABLES", runtime.CPU_GLIBC_TUNABLES)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode or not lines:
        raise RuntimeError(f"{side} run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    return dict(result, steady_examples_per_s=steady_rate(result["windows_s"]))


def _print_header() -> None:
    what = {"sequence": "sentences", "tokens": "CoNLL sentences", "qa": "SQuAD questions",
            "regression": "scored sentences"}[FLAGS.task]
    print(f"task: {FLAGS.task}, {FLAGS.examples} {what}, seq {FLAGS.seq_length}, batch {FLAGS.batch_size}, "
          f"{FLAGS.steps} steps; model {FLAGS.layers} layers, hidden {FLAGS.hidden}, {FLAGS.heads} heads, "
          f"intermediate {FLAGS.intermediate}, vocab {FLAGS.vocab_size}; dropout on; windows of {FLAGS.log_every} "
          "steps", flush=True)
    print(f"XLA_FLAGS (jax, before the driver's are added): {os.environ.get('XLA_FLAGS', '')}; GLIBC_TUNABLES: "
          f"jax {os.environ.get('GLIBC_TUNABLES', runtime.CPU_GLIBC_TUNABLES)} (the driver's on CPU), torch "
          f"{os.environ.get('GLIBC_TUNABLES', '(unset)')}", flush=True)


def main(argv):
    del argv
    if FLAGS.side:
        _child(FLAGS.side, FLAGS.task_dir)
        return
    passed = [arg for arg in sys.argv[1:]
              if not arg.startswith(("--side", "--task_dir", "--rounds", "--sides", "--json_out"))]
    _print_header()
    results = []
    with tempfile.TemporaryDirectory() as task_dir:
        write_task(task_dir, FLAGS.examples, FLAGS.vocab_size, task=FLAGS.task)
        for round_index in range(1, FLAGS.rounds + 1):
            for side in FLAGS.sides:
                result = run_side(side, task_dir, passed)
                results.append(dict(result, round=round_index, side=side, task=FLAGS.task))
                # The loop (every window, the first one's compilation included) compares like with like; the
                # jax job also reads and encodes the data, initialises, and saves its checkpoint.
                extra = (f"; {result['rows']} rows; {result['versions']}, {result['threads']} threads"
                         if side == "torch" else f"; whole job {result['job_s']:.1f} s")
                print(f"round {round_index} {side}: steady {result['steady_examples_per_s']:.1f} examples/s "
                      f"(windows s: {', '.join(f'{s:.2f}' for s in result['windows_s'])}); loop "
                      f"{sum(result['windows_s']):.1f} s; peak RSS {result['peak_rss_gib']:.2f} GiB{extra}",
                      flush=True)
    rates = {side: [r["steady_examples_per_s"] for r in results if r["side"] == side] for side in FLAGS.sides}
    print(f"median steady examples/s: {', '.join(f'{s} {statistics.median(v):.1f}' for s, v in rates.items())}",
          flush=True)
    if "jax" in rates and "torch" in rates:
        print(f"jax / torch: {statistics.median(rates['jax']) / statistics.median(rates['torch']):.2f}", flush=True)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
