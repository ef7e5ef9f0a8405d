"""The presets every job's config starts from: the model presets (tiny to large), their architectures and
config.model defaults (which --config.init compares a checkpoint's architecture with), the mesh section, and the
pretraining and fine-tuning jobs' fields with their defaults per preset.

The recipes in configs/ build from these (and add their options); the benchmarks read them directly, so they run
from an installed package with no configs/ directory at hand."""

import ml_collections

# (layers, hidden, heads) of each preset; the intermediate size is always 4 * hidden, as in BERT.
MODEL_PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def model_config(size: str) -> ml_collections.ConfigDict:
    """config.model of preset `size` (MODEL_PRESETS), as every job's config starts it."""
    layers, hidden, heads = MODEL_PRESETS[size]
    model = ml_collections.ConfigDict()
    # Word-embedding rows; must exceed every token id in the data. 30522 is the original BERT WordPiece vocab, so the
    # presets match HF's bert-base/large exactly. data.source=corpus replaces it with the trained tokenizer's size
    # padded to a multiple of 128. Training the original vocab from scratch: 30592 (padded to a multiple of 128)
    # keeps the vocab dimension shardable over any tensor axis and tile-aligned; padding rows are never looked up,
    # --config.init pads an imported vocab, and HF exports drop the padding rows given data.vocab_file.
    model.vocab_size = 30522
    model.hidden_size = hidden  # width of the residual stream
    model.num_layers = layers  # number of encoder layers
    model.num_heads = heads  # attention heads; must divide hidden_size
    model.intermediate_size = 4 * hidden  # feed-forward width
    model.hidden_act = "gelu_tanh"  # "gelu_tanh" (the original BERT code) or "gelu" (exact erf form)
    model.max_position_embeddings = 512  # learned position table size; must be >= data.max_seq_length
    model.type_vocab_size = 2  # segment (token type) ids
    model.dropout_rate = 0.1  # hidden-state dropout
    model.attention_dropout_rate = 0.1  # dropout on attention probabilities
    model.initializer_range = 0.02  # stddev of the truncated-normal initialiser
    model.layer_norm_eps = 1e-12  # as in the original BERT
    # Compute dtype: "float32" or "bfloat16" (mixed precision: parameters, optimizer state, attention scores and
    # softmax, LayerNorm statistics and the losses stay float32; matmuls and activations run in bfloat16).
    model.dtype = "float32"
    return model


# model.arch="modern" (bert_jax.modern): (layers, hidden, heads, GeGLU width) per preset. base and large are
# ModernBERT-base's and -large's shapes (Warner et al., 2024); the smaller ones keep base's 1.5x GeGLU width.
MODERN_PRESETS = {
    "tiny": (2, 128, 2, 192),
    "mini": (4, 256, 4, 384),
    "small": (4, 512, 8, 768),
    "medium": (8, 512, 8, 768),
    "base": (22, 768, 12, 1152),
    "large": (28, 1024, 16, 2624),
}
def modern_model_config(size: str) -> ml_collections.ConfigDict:
    """config.model of preset `size` for arch=modern (bert_jax.modern.ModernConfig's fields)."""
    layers, hidden, heads, intermediate = MODERN_PRESETS[size]
    model = ml_collections.ConfigDict()
    model.arch = "modern"  # a ModernBERT-style encoder (bert_jax.modern): masked LM only
    model.vocab_size = 50368  # ModernBERT's; data.source=corpus replaces it with the trained tokenizer's, padded
    model.hidden_size = hidden
    model.num_layers = layers
    model.num_heads = heads
    model.intermediate_size = intermediate  # the GeGLU's width (its input kernel is twice as wide: input and gate)
    model.max_position_embeddings = 8192  # the longest sequence (rotary embeddings: no table); >= data.max_seq_length
    model.local_attention = 128  # a local layer's window: each token sees the tokens up to half of it away
    model.global_attn_every_n_layers = 3  # layers 0, 3, 6, ... attend globally, the others locally
    model.global_rope_theta = 160000.0  # rotary base of the global layers
    model.local_rope_theta = 10000.0  # rotary base of the local layers
    model.norm_eps = 1e-5  # LayerNorm (no bias) epsilon
    model.dropout_rate = 0.0  # embedding and MLP dropout (ModernBERT pretrains without)
    model.attention_dropout_rate = 0.0
    model.initializer_range = 0.02  # stddev of the truncated-normal initialiser
    model.dtype = "float32"  # compute dtype, as for BERT
    # Fine-tuning: a sequence classifier reads the [CLS] row ("cls") or the mean of the real rows ("mean").
    model.classifier_pooling = "cls"
    return model


def mesh_config() -> ml_collections.ConfigDict:
    """The mesh section, shared by every job's config (pretraining and fine-tuning)."""
    mesh = ml_collections.ConfigDict()
    mesh.dcn_data = 1  # pod slices the job spans (data parallel across them, over the data-centre network)
    mesh.data = -1  # data-parallel axis size within a slice; -1 fills the devices left over by the other axes
    mesh.fsdp = 1  # fully-sharded data-parallel axis size (parameters and optimizer state sharded over it)
    mesh.tensor = 1  # tensor-parallel axis size (heads, mlp and vocab split over it)
    # Logical axis -> mesh axes. The batch goes over the slices, then ('fsdp', 'data') in that order: XLA:CPU
    # computed wrong gradients for ('data', 'fsdp') with FSDP + TP parameters (tests/test_sharding.py guards this).
    mesh.rules = (
        ("batch", ("dcn_data", "fsdp", "data")),
        ("length", None),
        ("act_embed", None),
        ("act_heads", "tensor"),
        ("act_mlp", "tensor"),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("mlp", "tensor"),
        ("vocab", "tensor"),
        ("position", None),
        ("segment", None),
        ("norm", None),
        ("classes", None),
        ("layers", None),  # the leading axis of scanned layer parameters (model.scan_layers)
    )
    return mesh


def optim_config(learning_rate: float) -> ml_collections.ConfigDict:
    """The optimizer section both jobs share; each sets its warmup and accumulation fields."""
    optim = ml_collections.ConfigDict()
    optim.optimizer = "adamw"  # "adamw" or "lamb"
    optim.learning_rate = learning_rate  # peak learning rate, reached at the end of warmup
    # "linear" or "polynomial" decay to end_learning_rate at the last step, or "wsd" (warmup-stable-decay): the
    # peak held until the last decay_fraction of the steps, which cool down to end_learning_rate as 1 - sqrt(t).
    optim.decay = "linear"
    optim.decay_power = 1.0  # exponent of the polynomial decay
    optim.decay_fraction = 0.1  # with decay="wsd": the share of the schedule's steps that decay
    optim.end_learning_rate = 0.0  # learning rate at the last step
    # Steps the schedule spans (0: train.num_steps). Set it to run a job in stages of one schedule: each stage's
    # train.num_steps stops it where it should, and every stage compiles the same step (the schedule is part of it).
    optim.schedule_steps = 0
    optim.weight_decay = 0.01  # decoupled weight decay; never applied to LayerNorm parameters or biases
    optim.b1 = 0.9  # Adam/LAMB first-moment decay
    optim.b2 = 0.999  # Adam/LAMB second-moment decay
    optim.eps = 1e-6  # Adam/LAMB epsilon
    optim.max_grad_norm = 1.0  # global-norm clipping; 0 disables it
    return optim


def checkpoint_config(every_steps: int) -> ml_collections.ConfigDict:
    """The checkpoint section: the same fields and meanings for every job (both run bert_jax.loop)."""
    ckpt = ml_collections.ConfigDict()
    ckpt.every_steps = every_steps  # steps between checkpoints (and one at the last step and on SIGTERM); 0: only those
    ckpt.max_to_keep = 3  # most recent checkpoints kept
    ckpt.keep_best = False  # also keep the checkpoint with the lowest eval loss (needs evaluation data)
    ckpt.async_save = True  # write in the background; the loop waits only for the copy to host memory
    ckpt.compression = False  # zstd the arrays: float weights shrink ~8%, and the save takes ~2x as long on CPU hosts
    # Rewind: resume from this step's checkpoint rather than the newest (newer ones are moved aside to STEP.rewound,
    # once: a rerun of the same command resumes from the newest checkpoint written after the rewind). 0 = the newest.
    ckpt.restore_step = 0
    ckpt.skip_batches = 0  # with restore_step: batches of input skipped after resuming from it (once, like the rewind)
    # On divergence, automatically: restore the newest verified checkpoint, skip the input up to and including the
    # batch that diverged plus rewind_skip_batches more, and go on; at most max_rewinds times in the run's lineage
    # (each logged, and recorded in the checkpoints). 0 = stop with an error naming the checkpoint to resume from.
    ckpt.max_rewinds = 0
    ckpt.rewind_skip_batches = 0
    return ckpt


def pretraining_config(size: str = "tiny", data_source: str = "corpus", arch: str = "bert"
                       ) -> ml_collections.ConfigDict:
    """The pretraining job's config for preset `size`, data source ("corpus", "tfrecord" or "synthetic") and
    architecture (bert_jax.arch.names()): every field with its default, as configs/pretrain.py gives it and the
    benchmarks build from."""
    # Imported here: this module stays importable without JAX (the benchmarks' torch processes read the recipes).
    from bert_jax import arch as arch_lib  # pylint: disable=import-outside-toplevel
    if arch not in arch_lib.names():
        raise ValueError(f"unknown arch {arch!r}; choose one of {arch_lib.names()}")
    config = ml_collections.ConfigDict()

    config.model = model = arch_lib.get(arch).preset(size)
    # The preset config.model was filled from. With config.init set, the checkpoint's architecture replaces the
    # preset's (model.vocab_size, hidden_size, num_layers, num_heads, intermediate_size, hidden_act,
    # max_position_embeddings, type_vocab_size, layer_norm_eps; see
    # bert_jax.interop.init_architecture.resolve_init_architecture).
    # A field set explicitly (given on the command line, or differing from this preset's value) must agree with the
    # checkpoint; the run stops naming every one that does not.
    config.model_preset = size
    # "auto" | "xla" | "cudnn" | "pallas" | "reference". auto: cuDNN flash attention on GPU (bfloat16), Pallas splash
    # attention on TPU, the reference einsum path on CPU (faster there than XLA's dot_product_attention); an
    # unsupported kernel falls back to "xla" (jax.nn.dot_product_attention), logging why.
    # No fused kernel has attention dropout, so with attention_dropout_rate > 0 auto trains through the reference
    # einsum/softmax path (exact BERT) and uses the fused kernel for evaluation only; set attention_dropout_rate=0.0
    # for fused kernels in training too (naming a fused kernel requires it). "reference" = the plain einsum path.
    model.attention = "auto"
    # Rematerialisation of each layer's activations in the backward pass: "none", "matmuls" (keep weight-matmul
    # outputs, recompute the rest incl. the length^2 attention scores: little extra compute) or "full" (keep only
    # layer inputs: least memory, ~one extra forward pass).
    model.remat = "none"
    # One nn.scan over the layers: compile time independent of depth; parameters stacked under "layers" with a
    # leading layer axis (interop.layout.unstack_layers / stack_layers convert; exports unstack automatically).
    model.scan_layers = False

    config.mesh = mesh_config()

    config.optim = optim = optim_config(learning_rate=1e-4)
    optim.warmup_steps = 10  # linear warmup from 0
    optim.grad_accum_steps = 1  # micro-batches per optimizer step; must divide the per-device batch

    config.data = data = ml_collections.ConfigDict()
    data.source = data_source  # "corpus" (make data from data.corpus first), "tfrecord" or "synthetic"
    # With source=corpus: pretraining data is made once into WORKDIR/data (reused by later runs in the workdir).
    data.corpus = "demo"  # comma-separated file globs (local or gs://), "tfds:NAME[:SPLIT][:FIELD]", or "demo"
    # "auto" (by file name: .jsonl/.json/.ndjson, .parquet, .csv, .tsv, +.gz/.zst; else "lines"), "lines" (one
    # sentence per line, blank line between documents), "paragraphs" (prose files), "jsonl", "parquet", "csv", "tsv"
    data.corpus_format = "auto"
    data.corpus_field = "text"  # the JSON Lines field / Parquet or CSV column holding each record's text
    data.skip_bad_records = False  # skip and count records without that text, instead of stopping at the first
    data.vocab_file = ""  # vocab.txt / SentencePiece .model / tokenizer dir; empty trains one from the corpus
    data.tokenizer = "wordpiece"  # trained when vocab_file is empty: wordpiece, sentencepiece_unigram or _bpe
    data.tokenizer_vocab_size = 8192  # size of a trained vocab (the model pads it to a multiple of 128)
    data.do_lower_case = True  # lower-case (and strip accents) before tokenising
    data.dupe_factor = 1  # passes over the corpus when making instances (dynamic masking varies masks anyway)
    # Instances made from data.corpus: "pairs" (BERT's NSP sentence pairs), or MLM-only, without labels, "rows"
    # (documents joined by [SEP], cut into full rows) or "fragments" (documents cut alone; for data.pack).
    data.instances = "pairs"
    data.eval_every_nth_document = 50  # every n-th corpus document is held out for evaluation; 0 = no held-out set
    data.masking = "auto"  # "auto" (static if the records carry masks, else dynamic), "static" or "dynamic"
    data.masked_lm_prob = 0.15  # fraction of tokens predicted (dynamic masking and data creation)
    data.whole_word_mask = False  # mask all WordPieces of a word together
    data.special_ids = (0, 101, 102, 103)  # [PAD], [CLS], [SEP], [MASK] ids; set from the tokenizer for source=corpus
    data.input_files = ""  # comma-separated globs of training TFRecords (local or gs://), for source=tfrecord
    data.eval_input_files = ""  # comma-separated globs of held-out TFRecords; empty means no evaluation
    data.max_seq_length = 128  # input_ids length in the records
    data.max_predictions_per_seq = 20  # masked_lm_positions length in the records
    data.shuffle_buffer = 10000  # records held for shuffling
    data.num_parallel_reads = 8  # files read at once
    data.pack = False  # pack several instances per row (block-diagonal attention, NSP per instance): no padding work
    data.max_instances_per_row = 4  # with data.pack: most instances in one row (e.g. 4 at seq 128, 8 or more at 512)
    data.max_predictions_per_row = 0  # with data.pack: MLM slots per row; 0 = max_predictions_per_seq per instance
    data.pack_window = 256  # with data.pack: instances packed together per process (larger packs tighter)

    config.train = train = ml_collections.ConfigDict()
    train.batch_size = 32  # global batch size in sequences, over all processes
    train.num_steps = 200  # optimizer steps
    train.log_every = 10  # steps between log lines and TensorBoard points
    train.eval_every = 100  # steps between evaluations (when data.eval_input_files is set)
    train.eval_steps = 10  # batches per evaluation
    train.seed = 0  # seeds initialisation, dropout, shuffling and synthetic data
    # Dropout's random bits: "threefry" (masks independent of the mesh), "rbg" or "unsafe_rbg" (XLA's
    # RngBitGenerator: cheaper on TPU; the driver sets the libtpu option unsafe_rbg needs), or "auto" (per platform,
    # bert_jax.runtime.AUTO_DROPOUT_RNG). A checkpoint resumes only with the kind of key it was written with.
    train.dropout_rng = "auto"
    train.peak_flops_per_device = 0.0  # for MFU; 0 means look the device kind up (unknown kinds print no MFU)
    train.profile_start_step = 0  # capture a profiler trace from this step into WORKDIR/profile; 0 = no trace
    train.profile_steps = 5  # steps in the profiler trace
    # A step diverges when its loss, gradient norm or parameters are not finite, or when its loss spikes: above
    # spike_factor times the median of the previous spike_window healthy losses (judged once that many are known).
    # 2x is far outside a healthy run's step-to-step noise (docs/checkpoints.md, "What a checkpoint guarantees").
    # 0 = NaN/inf only.
    train.spike_factor = 2.0
    train.spike_window = 100  # steps of loss history a spike is judged against

    # Checkpoints go to WORKDIR/checkpoints; a run started in a workdir that has some resumes from the latest.
    config.checkpoint = checkpoint_config(every_steps=100)
    # Parameters to start from when the workdir has no checkpoint (optimizer, step and data start afresh): a step
    # directory or checkpoints directory of another run, a HuggingFace model directory, an original TF checkpoint or
    # a Flax export. Its architecture is taken (see model_preset), and its tokenizer when data.vocab_file is empty;
    # an imported vocabulary is padded to a multiple of 128 rows. Empty: initialise from train.seed.
    config.init = ""

    if size == "tiny":
        # The default run: 200 steps on the demo corpus, long enough for MLM accuracy to climb visibly.
        optim.learning_rate = 1e-3
        optim.warmup_steps = 20
    arch_lib.get(arch).pretraining_recipe(config)  # what the architecture's own recipe changes
    if size in ("base", "large"):
        train.batch_size = 256
        optim.warmup_steps = 10000
        train.num_steps = 1000000
        train.log_every = 100
        train.eval_every = 10000
        train.eval_steps = 100
        config.checkpoint.every_steps = 5000
    return config


# preset -> (peak learning rate, epochs); batch 32 and 10% warmup for every preset. base, large: the BERT paper's
# recipe (its grid: learning rate 2e-5 to 5e-5, batch 16 or 32, 2 to 4 epochs). The small presets need larger steps
# and more of them. Measured on a 320-sentence task whose label is set by one keyword (tests/fixtures/keyword_task;
# accuracy on its 160 held-out sentences, chance 0.53): tiny at 1e-4 for 3 epochs (30 steps) stayed at chance from
# the quick start's checkpoint, and so did 3e-4 for 5 epochs from scratch; tiny at 1e-3 and mini, small and medium at
# 3e-4, for 10 epochs, reached 1.0 from scratch (tiny from the quick start's checkpoint too). 5 epochs are too few:
# tiny at 1e-3 from the quick start's checkpoint stayed at chance for one seed of three, medium at 1e-4 reached 0.86.
RECIPES = {"tiny": (1e-3, 10), "mini": (3e-4, 10), "small": (3e-4, 10), "medium": (3e-4, 10),
           "base": (2e-5, 3), "large": (2e-5, 3)}


def finetuning_config(size: str = "tiny") -> ml_collections.ConfigDict:
    """The fine-tuning and feature-extraction job's config for preset `size`: every field with its default and the
    preset's learning rate and epochs (RECIPES). configs/finetune.py sets its task and encoder choices on it; the
    benchmarks build from it."""
    config = ml_collections.ConfigDict()

    # The preset's architecture, as in pretraining_config. With config.init set, the architecture is the checkpoint's
    # (any format: a bert_jax run or fine-tuned directory, HuggingFace, original TF, a Flax export); from here come
    # model.dtype, the dropout rates (dropout_rate also applies to the pooled vector before the classifier) and
    # initializer_range (the classifier's weights). A field set explicitly (given on the command line, or differing
    # from the preset's value) must agree with the checkpoint; the run stops naming every one that does not.
    config.model = model_config(size)
    config.model_preset = size  # the preset config.model was filled from (see above)

    # The task (bert_jax.tasks: its files, head, held-out scores and outputs), as the recipe option task=NAME sets it:
    # "sequence", "tokens" or "qa". data.format must be a file format this task reads.
    config.task = "sequence"

    config.mesh = mesh_config()  # as in pretraining_config

    config.optim = optim = optim_config(learning_rate=RECIPES[size][0])
    optim.warmup_steps = 0  # linear warmup steps; 0 means warmup_proportion of the run
    optim.warmup_proportion = 0.1  # fraction of the steps spent warming up when warmup_steps is 0
    optim.grad_accum_steps = 1  # must stay 1: fine-tuning batches are small enough not to need accumulation

    config.data = data = ml_collections.ConfigDict()
    # Sources: a CSV (.csv) or TSV (.tsv) file with a header row, or "tfds:NAME[:VERSION]:SPLIT" (prepared only).
    data.train_file = ""  # training examples (local path, gs://, or tfds:NAME:SPLIT)
    data.eval_file = ""  # held-out examples for eval accuracy; empty = no evaluation
    # "csv", "tsv", "tfds", "txt", "glue" or "auto" (tfds: prefix, .tsv, .txt, otherwise csv): task=sequence and
    # task=regression;
    # "conll" (task=tokens): token classification, a token and its tag (last column) per line, IOB1 or IOB2 tags;
    # "squad" (task=qa): extractive question answering, SQuAD v1.1 / v2.0 JSON.
    data.format = "auto"
    # data.format="glue": the GLUE task whose own TSV files data.train_file and data.eval_file are (cola, sst2, mrpc,
    # stsb, qqp, mnli, qnli, rte, wnli: bert_jax.data.glue), their quirks and columns its own; --mode=glue sets it.
    data.glue_task = ""
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
    train.num_epochs = float(RECIPES[size][1])  # passes over the training set when num_steps is 0
    train.log_every = 50  # steps between log lines and TensorBoard points
    train.eval_every = 0  # steps between evaluations (and always at the end); 0 = only at the end
    train.seed = 0  # seeds the classifier initialisation, dropout and the example order
    # Token classification (task=tokens) only: "tuned" fine-tunes every parameter (the BERT paper's NER setup);
    # "frozen_last4" is its feature-based variant: the encoder frozen, each token's last four layers concatenated
    # (4 * hidden wide; needs >= 4 layers) -> dropout -> linear classifier, the only part trained; it does not
    # export to transformers. The recipe option (`:task=tokens,encoder=frozen_last4`) also sets its learning rate.
    train.encoder = "tuned"
    train.dropout_rng = "auto"  # dropout's random bits, as in pretraining_config
    # Divergence, as in pretraining_config. Spikes are off: a classifier's loss nears zero, where a ratio to the
    # median is noise (one hard batch is many times a near-zero median); non-finite values always stop the run.
    train.spike_factor = 0.0
    train.spike_window = 100  # steps of loss history a spike is judged against (with spike_factor > 0)
    train.profile_start_step = 0  # capture a profiler trace from this step into WORKDIR/profile; 0 = no trace
    train.profile_steps = 5  # steps in the profiler trace

    # Checkpoints of the whole run (parameters, optimizer, dropout key, input position) in WORKDIR/checkpoints, as in
    # pretraining_config: rerunning the same command resumes from the newest (after a crash or SIGTERM).
    # WORKDIR/finetuned (what --config.init and --mode=export read) is written once the run ends.
    config.checkpoint = checkpoint_config(every_steps=1000)

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
    return config
