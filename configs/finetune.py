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
  F1, and the answers in WORKDIR/predictions.json, the official format.
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
import ml_collections

from bert_jax.presets import MODEL_PRESETS, model_config
from configs.pretrain import mesh_config

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

# preset -> (peak learning rate, epochs); batch 32 and 10% warmup for every preset. base, large: the BERT paper's
# recipe (its grid: learning rate 2e-5 to 5e-5, batch 16 or 32, 2 to 4 epochs). The small presets need larger steps
# and more of them. Measured on a 320-sentence task whose label is set by one keyword (tests/fixtures/keyword_task;
# accuracy on its 160 held-out sentences, chance 0.53): tiny at 1e-4 for 3 epochs (30 steps) stayed at chance from
# the quick start's checkpoint, and so did 3e-4 for 5 epochs from scratch; tiny at 1e-3 and mini, small and medium at
# 3e-4, for 10 epochs, reached 1.0 from scratch (tiny from the quick start's checkpoint too). 5 epochs are too few:
# tiny at 1e-3 from the quick start's checkpoint stayed at chance for one seed of three, medium at 1e-4 reached 0.86.
RECIPES = {"tiny": (1e-3, 10), "mini": (3e-4, 10), "small": (3e-4, 10), "medium": (3e-4, 10),
           "base": (2e-5, 3), "large": (2e-5, 3)}
# task=qa: the BERT paper's SQuAD v1.1 recipe for base and large (learning rate 5e-5, batch 32, 3 epochs); the
# small presets keep RECIPES'.
QA_RECIPES = dict(RECIPES, base=(5e-5, 3), large=(5e-5, 3))
# The task names, as bert_jax.tasks.NAMES (a test holds them equal; the recipe does not import the tasks' code).
TASKS = ("sequence", "tokens", "qa")
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
    config = ml_collections.ConfigDict()

    # The preset's architecture, as in configs/pretrain.py. With config.init set, the architecture is the checkpoint's
    # (any format: a bert_jax run or fine-tuned directory, HuggingFace, original TF, a Flax export); from here come
    # model.dtype, the dropout rates (dropout_rate also applies to the pooled vector before the classifier) and
    # initializer_range (the classifier's weights). A field set explicitly (given on the command line, or differing
    # from the preset's value) must agree with the checkpoint; the run stops naming every one that does not.
    config.model = model_config(options["size"])
    config.model_preset = options["size"]  # the preset config.model was filled from (see above)

    # The task (bert_jax.tasks: its files, head, held-out scores and outputs), as the recipe option task=NAME set it:
    # "sequence", "tokens" or "qa". data.format must be a file format this task reads.
    config.task = options["task"]

    config.mesh = mesh_config()  # as in configs/pretrain.py

    config.optim = optim = ml_collections.ConfigDict()
    optim.optimizer = "adamw"  # "adamw" or "lamb"
    optim.learning_rate = RECIPES[options["size"]][0]  # peak learning rate, reached at the end of warmup
    if options["encoder"] == "frozen_last4":  # only the head learns: larger steps (FROZEN_ENCODER_LEARNING_RATE)
        optim.learning_rate = FROZEN_ENCODER_LEARNING_RATE
    optim.warmup_steps = 0  # linear warmup steps; 0 means warmup_proportion of the run
    optim.warmup_proportion = 0.1  # fraction of the steps spent warming up when warmup_steps is 0
    optim.decay = "linear"  # "linear" or "polynomial" decay to end_learning_rate at the last step
    optim.decay_power = 1.0  # exponent of the polynomial decay
    optim.end_learning_rate = 0.0  # learning rate at the last step
    optim.weight_decay = 0.01  # decoupled weight decay; never applied to LayerNorm parameters or biases
    optim.b1 = 0.9  # Adam/LAMB first-moment decay
    optim.b2 = 0.999  # Adam/LAMB second-moment decay
    optim.eps = 1e-6  # Adam/LAMB epsilon
    optim.max_grad_norm = 1.0  # global-norm clipping; 0 disables it
    optim.grad_accum_steps = 1  # must stay 1: fine-tuning batches are small enough not to need accumulation

    config.data = data = ml_collections.ConfigDict()
    # Sources: a CSV (.csv) or TSV (.tsv) file with a header row, or "tfds:NAME[:VERSION]:SPLIT" (prepared only).
    data.train_file = ""  # training examples (local path, gs://, or tfds:NAME:SPLIT)
    data.eval_file = ""  # held-out examples for eval accuracy; empty = no evaluation
    # "csv", "tsv", "tfds", "txt" or "auto" (tfds: prefix, .tsv, .txt, otherwise csv): task=sequence;
    # "conll" (task=tokens): token classification, a token and its tag (last column) per line, IOB1 or IOB2 tags;
    # "squad" (task=qa): extractive question answering, SQuAD v1.1 / v2.0 JSON.
    data.format = "auto"
    data.text_columns = "sentence"  # one column (single sentence) or two, comma-separated (sentence pair)
    data.label_column = "label"  # column with the class; strings or integers
    # Class names in id order; empty: the TFDS ClassLabel's names, else the training labels sorted (numerically
    # when all are integers). The map is logged and saved to WORKDIR/finetuned/labels.json.
    data.label_names = ""
    data.max_seq_length = 128  # [CLS] a [SEP] b [SEP] padded/truncated to this length (the longer text is cut first)
    # WordPiece vocab.txt, SentencePiece .model or tokenizer directory; empty: config.init's tokenizer where it has
    # one (a HuggingFace or original vocab.txt, a Flax export's or fine-tuned directory's, a corpus run's)
    data.vocab_file = ""
    data.do_lower_case = True  # lower-case before tokenising; must match how the model was pretrained
    data.tfds_data_dir = ""  # where prepared TFDS datasets live; empty: $TFDS_DATA_DIR or ~/tensorflow_datasets
    # Question answering (task=qa), as the original run_squad.py: rows are [CLS] question [SEP] passage [SEP];
    # a passage longer than a row is read in windows whose starts are doc_stride pieces apart.
    data.max_query_length = 64  # question pieces kept (the rest cut)
    data.doc_stride = 128  # passage pieces between the starts of two windows
    data.version_2_with_negative = False  # SQuAD v2.0: questions may have no answer ("is_impossible")
    data.n_best_size = 20  # start and end candidates per window, and answers kept per question in nbest
    data.max_answer_length = 30  # longest answer predicted, in pieces
    # v2.0: answer "" when the no-answer score beats the best span's by more than this (tune it on dev)
    data.null_score_diff_threshold = 0.0

    config.train = train = ml_collections.ConfigDict()
    train.batch_size = 32  # global batch size (training, evaluation and features), over all processes
    train.num_steps = 0  # optimizer steps; 0 means num_epochs passes over the training set
    train.num_epochs = float(RECIPES[options["size"]][1])  # passes over the training set when num_steps is 0
    train.log_every = 50  # steps between log lines and TensorBoard points
    train.eval_every = 0  # steps between evaluations (and always at the end); 0 = only at the end
    train.seed = 0  # seeds the classifier initialisation, dropout and the example order
    # Token classification (task=tokens) only: "tuned" fine-tunes every parameter (the BERT paper's NER setup);
    # "frozen_last4" is its feature-based variant: the encoder frozen, each token's last four layers concatenated
    # (4 * hidden wide; needs >= 4 layers) -> dropout -> linear classifier, the only part trained; it does not
    # export to transformers. The recipe option (`:task=tokens,encoder=frozen_last4`) also sets its learning rate.
    train.encoder = options["encoder"]
    train.dropout_rng = "auto"  # dropout's random bits, as in configs/pretrain.py
    # Divergence, as in configs/pretrain.py. Spikes are off: a classifier's loss nears zero, where a ratio to the
    # median is noise (one hard batch is many times a near-zero median); non-finite values always stop the run.
    train.spike_factor = 0.0
    train.spike_window = 100  # steps of loss history a spike is judged against (with spike_factor > 0)

    # Parameters to start from: a bert_jax pretraining checkpoint (step directory or checkpoints directory), a
    # fine-tuned WORKDIR/finetuned directory, or a HuggingFace / original-TF BERT checkpoint (via
    # bert_jax.interop.pretrained).
    # Only the encoder and pooler are read; the classifier always starts fresh. Its architecture is taken (see
    # config.model above). Empty: from scratch.
    config.init = ""

    config.features = features = ml_collections.ConfigDict()
    features.input_file = ""  # texts to embed: CSV/TSV/tfds (data.text_columns) or .txt (one text per line)
    # "cls": last layer's [CLS] vector; "mean": mean of the last layer over real tokens ([CLS] and [SEP] included);
    # "last4": the [CLS] vectors of the last four layers concatenated, last layer first (4 * hidden wide).
    features.pooling = "cls"
    features.output = ""  # .npy path for the [num_texts, width] float32 array; empty: WORKDIR/features.npy

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
