"""Fine-tuning (sentence / sentence-pair classification, token classification, extractive question answering) and
feature-extraction recipe.

`--config=configs/finetune.py:size=base,task=tokens` picks a model preset and a task; override any field with
`--config.optim.learning_rate=3e-5`. A task has one name everywhere (this option, config.task, the fine-tuned
directory's task.json, `python -m bert_jax.benchmarks.finetune --task`; bert_jax.tasks registers them):
- `sequence` (the default): sentence / sentence-pair classification of your own CSV/TSV files (set data.train_file,
  data.eval_file and the column names), or of a GLUE dataset with `glue=NAME` (below);
- `tokens`: token classification, e.g. NER: CoNLL files in data.train_file and data.eval_file; entity-level F1, and
  the predicted tags in WORKDIR/eval_predictions.txt. `encoder=frozen_last4` picks the BERT paper's feature-based
  variant (see train.encoder) and its learning rate;
- `qa`: extractive question answering: SQuAD v1.1 / v2.0 JSON in data.train_file and data.eval_file; exact match and
  F1, and the answers in WORKDIR/predictions.json, the official format;
- `regression`: a score per sentence or sentence pair (STS-B's similarity), from the same files as `sequence` (the
  label column a number); one output trained with the squared error; Pearson and Spearman correlation.
`glue=NAME` is the sequence task on a GLUE dataset read from TensorFlow Datasets (cola, sst2, mrpc, qqp, mnli, qnli,
rte, wnli; prepared beforehand with `tfds build glue/NAME`, never downloaded here): `size=base,glue=sst2`. A GLUE
name is a dataset, not a task, so it has its own option; data.format is the files' format (csv, tsv, tfds, txt,
conll, squad), a third thing again.
Older spellings keep working, mapped here and logged: `task=csv` is task=sequence, `task=conll` task=tokens,
`task=squad` task=qa, and `task=sst2` (any GLUE name) is glue=sst2.
Defaults: AdamW, batch 32, 10% warmup, dropout 0.1, and per preset the learning rate and epochs of RECIPES (the
BERT paper's for base and large; larger steps for longer for the small presets).
The config is locked, so a misspelt override is an error rather than a silently ignored flag.
"""
from absl import logging

# The fine-tuning job's fields, their defaults and the presets' RECIPES live in the library (the benchmarks build from
# them too); this recipe adds the task, dataset and encoder options.
from bert_jax.presets import MODEL_PRESETS, RECIPES, finetuning_config

# glue=NAME -> (TFDS name, text columns, train split, eval split); labels are the dataset's `label` ClassLabel.
GLUE_TASKS = {
    "cola": ("glue/cola", "sentence", "train", "validation"),
    "sst2": ("glue/sst2", "sentence", "train", "validation"),
    "mrpc": ("glue/mrpc", "sentence1,sentence2", "train", "validation"),
    "qqp": ("glue/qqp", "question1,question2", "train", "validation"),
    "mnli": ("glue/mnli", "premise,hypothesis", "train", "validation_matched"),
    "qnli": ("glue/qnli", "question,sentence", "train", "validation"),
    "rte": ("glue/rte", "sentence1,sentence2", "train", "validation"),
    "wnli": ("glue/wnli", "sentence1,sentence2", "train", "validation"),
}

# task=qa: the BERT paper's SQuAD v1.1 recipe for base and large (learning rate 5e-5, batch 32, 3 epochs); the
# small presets keep RECIPES'.
QA_RECIPES = dict(RECIPES, base=(5e-5, 3), large=(5e-5, 3))
# The task names, as bert_jax.tasks.NAMES (a test holds them equal; the recipe does not import the tasks' code).
TASKS = ("sequence", "tokens", "qa", "regression")
# Older spellings of task=..., still accepted: each maps to its task name here, at the recipe's boundary.
TASK_ALIASES = {"csv": "sequence", "conll": "tokens", "squad": "qa"}

# Peak learning rate of the feature-based recipe (`encoder=frozen_last4`, which trains only a linear head), for every
# preset: what learns is the same linear layer over LayerNorm-scaled features whatever the encoder's size. Measured on
# tests/fixtures/tagging_task (entity F1 on its 160 held-out sentences, 10 epochs, a randomly initialised frozen
# encoder): tiny with 4 layers 0.83 at 1e-3, 0.92 at 3e-3, 0.92 at 1e-2; mini 0.94 at 3e-3. base and large: untested.
FROZEN_ENCODER_LEARNING_RATE = 3e-3
TOKEN_ENCODERS = ("tuned", "frozen_last4")  # as bert_jax.model.TOKEN_ENCODERS


def _parse_arg(arg):
    options = {"size": "tiny", "task": "sequence", "glue": "", "encoder": "tuned"}
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:  # a bare word is the size, as in `configs/finetune.py:base`
            key, value = "size", key
        if key not in options:
            raise ValueError(f"configs/finetune.py: unknown option {key!r} in {arg!r}; known: {sorted(options)}")
        options[key] = value
    if options["size"] not in MODEL_PRESETS:
        raise ValueError(f"configs/finetune.py: unknown size {options['size']!r}; choose one of "
                         f"{list(MODEL_PRESETS)}")
    task = options["task"]
    if task in TASK_ALIASES:
        options["task"] = TASK_ALIASES[task]
        logging.info("configs/finetune.py: task=%s is the older spelling of task=%s", task, options["task"])
    elif task in GLUE_TASKS and not options["glue"]:
        options["task"], options["glue"] = "sequence", task
        logging.info("configs/finetune.py: task=%s is the older spelling of glue=%s (the sequence task)", task, task)
    if options["task"] not in TASKS:
        raise ValueError(f"configs/finetune.py: unknown task {task!r}; choose one of {list(TASKS)} (or glue=NAME "
                         f"for a GLUE dataset: {list(GLUE_TASKS)})")
    if options["glue"] and options["glue"] not in GLUE_TASKS:
        raise ValueError(f"configs/finetune.py: unknown GLUE dataset glue={options['glue']!r}; choose one of "
                         f"{list(GLUE_TASKS)}")
    if options["glue"] and options["task"] != "sequence":
        raise ValueError(f"configs/finetune.py: glue={options['glue']} is a dataset of the sequence task, not of "
                         f"task={options['task']}. Fix: leave task out (or task=sequence)")
    if options["encoder"] not in TOKEN_ENCODERS:
        raise ValueError(f"configs/finetune.py: unknown encoder {options['encoder']!r}; choose one of "
                         f"{list(TOKEN_ENCODERS)}")
    return options


def get_config(arg=None):
    options = _parse_arg(arg)
    # Every field, with its one-line comment and its default for the preset: bert_jax.presets.finetuning_config.
    config = finetuning_config(options["size"])
    optim, data, train = config.optim, config.data, config.train
    config.task = options["task"]
    train.encoder = options["encoder"]
    if options["encoder"] == "frozen_last4":  # only the head learns: larger steps (FROZEN_ENCODER_LEARNING_RATE)
        optim.learning_rate = FROZEN_ENCODER_LEARNING_RATE

    if options["task"] == "tokens":
        data.format = "conll"
    if options["task"] == "qa":
        data.format = "squad"
        data.max_seq_length = 384  # the original's SQuAD length
        optim.learning_rate, train.num_epochs = QA_RECIPES[options["size"]][0], float(QA_RECIPES[options["size"]][1])
    if options["glue"]:
        name, columns, train_split, eval_split = GLUE_TASKS[options["glue"]]
        data.train_file = f"tfds:{name}:{train_split}"
        data.eval_file = f"tfds:{name}:{eval_split}"
        data.text_columns = columns
    return config
