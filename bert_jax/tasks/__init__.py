"""The downstream tasks bert_jax fine-tunes for, one module each, and the registry that names them.

- sequence (tasks/sequence.py): sentence / sentence-pair classification from CSV/TSV/.txt files or TFDS;
- tokens (tasks/tokens.py): token classification from CoNLL files;
- qa (tasks/qa.py): extractive question answering from SQuAD JSON;
- regression (tasks/regression.py): a score per sentence or sentence pair (STS-B), from the sequence task's files.

A task's name is the same everywhere: configs/finetune.py:task=NAME (config.task), WORKDIR/finetuned/task.json and
`python -m bert_jax.benchmarks.finetune --task=NAME`. Each task class (tasks/base.py: Task) owns how its files are
read and labelled, its head, its held-out scores and what it writes; bert_jax.finetune runs one loop over any of them.
"""

from bert_jax.tasks import qa
from bert_jax.tasks import regression
from bert_jax.tasks import sequence
from bert_jax.tasks import tokens
from bert_jax.tasks.base import Task

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (sequence.SequenceClassification,
                                                         tokens.TokenClassification, qa.QuestionAnswering,
                                                         regression.Regression)}
NAMES = tuple(TASKS)  # ("sequence", "tokens", "qa", "regression")


def task_class(name: str, where: str = "config.task") -> type[Task]:
    """The task class registered as `name`; a ValueError naming `where` the name came from otherwise."""
    if name not in TASKS:
        raise ValueError(f"{where}: unknown task {name!r}; choose one of {list(NAMES)}")
    return TASKS[name]


def read_task(config, tokenizer) -> Task:
    """config.task's examples from config.data's files, tokenized and labelled."""
    return task_class(config.task).read(config, tokenizer)


def head_model(name: str, model_config, num_labels: int, encoder: str = "tuned"):
    """The model with task `name`'s head (as a fine-tuned directory's task.json names it) over `num_labels`."""
    return task_class(name).head(model_config, num_labels, encoder)
