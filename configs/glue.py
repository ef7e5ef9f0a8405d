"""GLUE recipe: every GLUE task fine-tuned from one checkpoint, the learning rate chosen on dev, and the table.

`python -m bert_jax.main --mode=glue --config=configs/glue.py --workdir=W --config.init=CHECKPOINT
--config.data_dir=glue_data` (GLUE's own TSV directory, as download_glue_data.py writes it). `size=NAME` picks the
preset whose learning-rate grid applies (the architecture itself comes from --config.init); `protocol=modernbert`
adds ModernBERT's and MosaicBERT's choices: five seeds reported as the median, and RTE, MRPC and STS-B started from
the chosen MNLI run. Every field of the fine-tuning recipe (configs/finetune.py) is here too, with the BERT paper's
GLUE protocol: batch 32, 3 epochs, 10% warmup, the learning rate from {5e-5, 4e-5, 3e-5, 2e-5} chosen on dev.
The config is locked, so a misspelt override is an error rather than a silently ignored flag.
"""
import ml_collections

from bert_jax.presets import MODEL_PRESETS, finetuning_config

# Learning rates tried per preset. base and large: the BERT paper's (section 4.1). The smaller presets train with
# larger steps (presets.RECIPES: 3e-4 and 1e-3 learned the keyword task, 1e-4 did not), so their grids are scaled.
GRIDS = {"tiny": "1e-3,5e-4,3e-4,1e-4", "mini": "5e-4,3e-4,2e-4,1e-4", "small": "5e-4,3e-4,2e-4,1e-4",
         "medium": "5e-4,3e-4,2e-4,1e-4", "base": "5e-5,4e-5,3e-5,2e-5", "large": "5e-5,4e-5,3e-5,2e-5"}
PROTOCOLS = ("bert", "modernbert")


def _parse_arg(arg):
    options = {"size": "base", "protocol": "bert"}
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:  # a bare word is the size, as in `configs/glue.py:base`
            key, value = "size", key
        if key not in options:
            raise ValueError(f"configs/glue.py: unknown option {key!r} in {arg!r}; known: {sorted(options)}")
        options[key] = value
    if options["size"] not in MODEL_PRESETS:
        raise ValueError(f"configs/glue.py: unknown size {options['size']!r}; choose one of {list(MODEL_PRESETS)}")
    if options["protocol"] not in PROTOCOLS:
        raise ValueError(f"configs/glue.py: unknown protocol {options['protocol']!r}; choose one of "
                         f"{list(PROTOCOLS)}")
    return options


def get_config(arg=None):
    options = _parse_arg(arg)
    config = finetuning_config(options["size"])
    config.train.batch_size = 32
    config.train.num_epochs = 3.0
    config.optim.warmup_proportion = 0.1
    config.data.max_seq_length = 128
    config.data_dir = ""  # GLUE's TSV directory (CoLA/, SST-2/, ..., diagnostic/), as download_glue_data.py writes
    config.glue = glue = ml_collections.ConfigDict()
    glue.tasks = "all"  # "all" or a comma list of cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli
    glue.learning_rates = GRIDS[options["size"]]  # tried per task; the best median on dev is kept
    glue.seeds = "0"  # train.seed of each run; with several, the table shows each learning rate's median
    glue.from_mnli = ""  # tasks started from the chosen MNLI run's encoder (mnli must be in glue.tasks)
    glue.submission = False  # also write the GLUE server's test-set files (WORKDIR/submission/*.tsv)
    if options["protocol"] == "modernbert":
        glue.seeds = "0,1,2,3,4"
        glue.from_mnli = "rte,mrpc,stsb"
    return config
