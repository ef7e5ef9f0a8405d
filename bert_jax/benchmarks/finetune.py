"""Fine-tuning benchmark: bert_jax's fine-tuning job against transformers' loop, same model shape, same data.

`python -m bert_jax.benchmarks.finetune --steps=60 --rounds=2`

It writes a sentence-classification task (a CSV of random sentences whose label is set by a keyword, and a WordPiece
vocab.txt of whole words) into a temporary directory, then times, in turn and in separate processes (A B A B, so a
noisy host slows both alike, and so torch's thread pool never competes with XLA's):
- jax: the driver's fine-tuning job (`bert_jax.finetune.finetune`, as `--mode=finetune` runs it) from scratch with
  the architecture of all-MiniLM-L6-v2 by default (6 layers, hidden 384, 12 heads, intermediate 1536, exact gelu);
- torch: transformers' BertForSequenceClassification with the same shape, on the same encoded rows (our
  tokenizer's ids, padded to --seq_length), in the same order, with the job's optimizer (clip 1.0, AdamW with weight
  decay 0.01 off biases and LayerNorm, linear warmup and decay), dropout on.
Each prints the seconds of every window of --log_every steps; the first window (compilation, first allocations) is
left out of the steady rate. Also printed: the whole job's wall time, and each process's peak RSS.
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
    flags.DEFINE_string("side", "", "Internal: run one side in this process on --task_dir and print its JSON.")
    flags.DEFINE_string("task_dir", "", "Internal: the task written by the parent.")


FLAGS = flags.FLAGS

RESULT_PREFIX = "RESULT "
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_task(directory: str, examples: int, vocab_size: int, seed: int = 0) -> tuple[str, str]:
    """vocab.txt (whole lower-case words) and train.csv (sentence,label) in `directory`; returns their paths.

    Sentence lengths (4 to 40 words) and Zipf-distributed words look like short text, the kind sentence embedders
    are fine-tuned on; the label is whether the sentence holds the word "keyword"."""
    rng = np.random.default_rng(seed)
    words = [f"w{index}" for index in range(vocab_size - len(_SPECIALS) - 1)] + ["keyword"]
    vocab_path, csv_path = os.path.join(directory, "vocab.txt"), os.path.join(directory, "train.csv")
    with open(vocab_path, "w", encoding="utf-8") as file:
        file.write("\n".join(_SPECIALS + words) + "\n")
    with open(csv_path, "w", encoding="utf-8") as file:
        file.write("sentence,label\n")
        for _ in range(examples):
            length = int(rng.integers(4, 41))
            sentence = [words[(int(z) - 1) % (len(words) - 1)] for z in rng.zipf(1.3, size=length)]
            label = int(rng.integers(0, 2))
            if label:
                sentence[int(rng.integers(0, length))] = "keyword"
            file.write(f"{' '.join(sentence)},{label}\n")
    return vocab_path, csv_path


def task_config(vocab_path: str, csv_path: str):
    """configs/finetune.py with the benchmark's shape, data, steps and learning rate; no evaluation."""
    from configs import finetune as finetune_recipe  # pylint: disable=import-outside-toplevel
    config = finetune_recipe.get_config("size=mini")
    model = config.model
    model.num_layers, model.hidden_size, model.num_heads = FLAGS.layers, FLAGS.hidden, FLAGS.heads
    model.intermediate_size, model.vocab_size, model.hidden_act = FLAGS.intermediate, FLAGS.vocab_size, "gelu"
    config.data.train_file, config.data.vocab_file = csv_path, vocab_path
    config.data.max_seq_length = FLAGS.seq_length
    config.train.batch_size, config.train.num_steps = FLAGS.batch_size, FLAGS.steps
    config.train.log_every = FLAGS.log_every
    config.optim.learning_rate = FLAGS.learning_rate
    return config


def run_jax(task_dir: str) -> dict:
    """The driver's fine-tuning job on the task; window seconds from its metrics.jsonl."""
    from bert_jax import finetune  # pylint: disable=import-outside-toplevel
    from bert_jax import job_config  # pylint: disable=import-outside-toplevel
    config = task_config(os.path.join(task_dir, "vocab.txt"), os.path.join(task_dir, "train.csv"))
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        finetune.finetune(job_config.prepare(config, workdir, "finetune"), workdir)
        job_s = time.perf_counter() - start
        with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as file:
            records = [json.loads(line) for line in file if line.strip()]
    windows = [FLAGS.log_every * FLAGS.batch_size / record["examples_per_second"] for record in records
               if "examples_per_second" in record]
    return {"windows_s": windows, "job_s": job_s}


def run_torch(task_dir: str) -> dict:
    """transformers' BertForSequenceClassification on the rows our tokenizer encodes, in the job's order."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    from bert_jax.data import finetune_data, tokenization  # pylint: disable=import-outside-toplevel

    config = task_config(os.path.join(task_dir, "vocab.txt"), os.path.join(task_dir, "train.csv"))
    tokenizer = tokenization.load_tokenizer(config.data.vocab_file, do_lower_case=True)
    examples = finetune_data.read_examples(config.data.train_file, config.data)
    labels = finetune_data.label_ids(examples, finetune_data.label_names(examples, config.data))
    encoded = finetune_data.encode_examples(tokenizer, examples, config.data.max_seq_length)
    torch.manual_seed(0)
    model_config = config.model
    hf_config = transformers.BertConfig(
        vocab_size=model_config.vocab_size, hidden_size=model_config.hidden_size,
        num_hidden_layers=model_config.num_layers, num_attention_heads=model_config.num_heads,
        intermediate_size=model_config.intermediate_size, hidden_act="gelu",
        max_position_embeddings=model_config.max_position_embeddings, type_vocab_size=model_config.type_vocab_size,
        hidden_dropout_prob=model_config.dropout_rate, attention_probs_dropout_prob=model_config.attention_dropout_rate,
        layer_norm_eps=model_config.layer_norm_eps, num_labels=2)
    model = transformers.BertForSequenceClassification(hf_config).train()
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1.0, betas=(0.9, 0.999), eps=1e-6)
    # The job's schedule (bert_jax.optim.learning_rate_schedule, linear warmup then linear decay to 0), in Python:
    # evaluating the optax one here would start JAX's thread pool beside torch's.
    warmup, peak = int(config.optim.warmup_proportion * FLAGS.steps), config.optim.learning_rate
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: peak * (
        step / warmup if step < warmup else max(0.0, 1 - (step - warmup) / max(FLAGS.steps - warmup, 1))))
    batches = finetune_data.train_batches(len(labels), FLAGS.batch_size, config.train.seed)
    windows, start, job_start = [], time.perf_counter(), time.perf_counter()
    for step in range(1, FLAGS.steps + 1):
        indices = next(batches)
        output = model(input_ids=torch.as_tensor(encoded["input_ids"][indices], dtype=torch.long),
                       attention_mask=torch.as_tensor(encoded["input_mask"][indices], dtype=torch.long),
                       token_type_ids=torch.as_tensor(encoded["segment_ids"][indices], dtype=torch.long),
                       labels=torch.as_tensor(labels[indices], dtype=torch.long))
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
            "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
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


def main(argv):
    del argv
    if FLAGS.side:
        _child(FLAGS.side, FLAGS.task_dir)
        return
    passed = [arg for arg in sys.argv[1:] if not arg.startswith(("--side", "--task_dir", "--rounds", "--sides"))]
    with tempfile.TemporaryDirectory() as task_dir:
        write_task(task_dir, FLAGS.examples, FLAGS.vocab_size)
        print(f"task: {FLAGS.examples} sentences, seq {FLAGS.seq_length}, batch {FLAGS.batch_size}, {FLAGS.steps} "
              f"steps; model {FLAGS.layers} layers, hidden {FLAGS.hidden}, {FLAGS.heads} heads, intermediate "
              f"{FLAGS.intermediate}, vocab {FLAGS.vocab_size}; dropout on; windows of {FLAGS.log_every} steps",
              flush=True)
        print(f"XLA_FLAGS (jax, before the driver's are added): {os.environ.get('XLA_FLAGS', '')}; GLIBC_TUNABLES: "
              f"jax {os.environ.get('GLIBC_TUNABLES', runtime.CPU_GLIBC_TUNABLES)} (the driver's on CPU), torch "
              f"{os.environ.get('GLIBC_TUNABLES', '(unset)')}", flush=True)
        rates = {side: [] for side in FLAGS.sides}
        for round_index in range(1, FLAGS.rounds + 1):
            for side in FLAGS.sides:
                command = [sys.executable, "-m", "bert_jax.benchmarks.finetune", f"--side={side}",
                           f"--task_dir={task_dir}", *passed]
                env = dict(os.environ)
                if side == "jax":  # the allocator the driver's CPU runs have, unless GLIBC_TUNABLES is yours
                    env.setdefault("GLIBC_TUNABLES", runtime.CPU_GLIBC_TUNABLES)
                done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
                lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
                if done.returncode or not lines:
                    raise RuntimeError(f"{side} run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
                result = json.loads(lines[-1][len(RESULT_PREFIX):])
                rate = steady_rate(result["windows_s"])
                rates[side].append(rate)
                # The loop (every window, the first one's compilation included) compares like with like; the
                # jax job also reads and encodes the data, initialises, and saves its checkpoint.
                extra = (f"; {result['versions']}, {result['threads']} threads" if side == "torch"
                         else f"; whole job {result['job_s']:.1f} s")
                print(f"round {round_index} {side}: steady {rate:.1f} examples/s (windows s: "
                      f"{', '.join(f'{s:.2f}' for s in result['windows_s'])}); loop {sum(result['windows_s']):.1f} s; "
                      f"peak RSS {result['peak_rss_gib']:.2f} GiB{extra}", flush=True)
        summary = ", ".join(f"{side} {statistics.median(values):.1f}" for side, values in rates.items())
        print(f"median steady examples/s: {summary}", flush=True)
        if "jax" in rates and "torch" in rates:
            print(f"jax / torch: {statistics.median(rates['jax']) / statistics.median(rates['torch']):.2f}",
                  flush=True)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
