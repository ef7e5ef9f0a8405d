"""BERT pretraining recipe.

Pick a preset with `--config=configs/pretrain.py:size=base` (tiny, mini, small, medium, base, large) and override any
field with `--config.optim.learning_rate=1e-4`. Several options may be combined: `:size=tiny,data=synthetic`.
Data options: `data=corpus` (the default: make pretraining data from `data.corpus` — the offline demo corpus unless
overridden — into the workdir, then train on it), `data=tfrecord` (existing TFRecords in the original layout),
`data=synthetic` (random batches, for smoke runs and benchmarks).
The config is locked, so a misspelt override is an error rather than a silently ignored flag.
"""

import ml_collections

# The presets' architectures live in the library (--config.init compares a checkpoint with them).
from bert_jax.presets import MODEL_PRESETS, model_config


def _parse_arg(arg):
    options = {"size": "tiny", "data": "corpus"}
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:  # a bare word is the size, as in `configs/pretrain.py:base`
            key, value = "size", key
        if key not in options:
            raise ValueError(f"configs/pretrain.py: unknown option {key!r} in {arg!r}; known: {sorted(options)}")
        options[key] = value
    if options["size"] not in MODEL_PRESETS:
        raise ValueError(f"configs/pretrain.py: unknown size {options['size']!r}; choose one of {list(MODEL_PRESETS)}")
    if options["data"] not in ("corpus", "synthetic", "tfrecord"):
        raise ValueError(f"configs/pretrain.py: unknown data {options['data']!r}; choose corpus, synthetic or tfrecord")
    return options


def mesh_config() -> ml_collections.ConfigDict:
    """The mesh section, shared by every recipe (configs/finetune.py too)."""
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


def checkpoint_config(every_steps: int) -> ml_collections.ConfigDict:
    """The checkpoint section, shared by every recipe (configs/finetune.py too): the same fields and meanings."""
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


def get_config(arg=None):
    options = _parse_arg(arg)
    config = ml_collections.ConfigDict()

    config.model = model = model_config(options["size"])
    # The preset config.model was filled from. With config.init set, the checkpoint's architecture replaces the
    # preset's (model.vocab_size, hidden_size, num_layers, num_heads, intermediate_size, hidden_act,
    # max_position_embeddings, type_vocab_size, layer_norm_eps; see
    # bert_jax.interop.init_architecture.resolve_init_architecture).
    # A field set explicitly (given on the command line, or differing from this preset's value) must agree with the
    # checkpoint; the run stops naming every one that does not.
    config.model_preset = options["size"]
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

    config.optim = optim = ml_collections.ConfigDict()
    optim.optimizer = "adamw"  # "adamw" or "lamb"
    optim.learning_rate = 1e-4  # peak learning rate, reached at the end of warmup
    optim.warmup_steps = 10  # linear warmup from 0
    optim.decay = "linear"  # "linear" or "polynomial" decay to end_learning_rate at train.num_steps
    optim.decay_power = 1.0  # exponent of the polynomial decay
    optim.end_learning_rate = 0.0  # learning rate at the last step
    optim.weight_decay = 0.01  # decoupled weight decay; never applied to LayerNorm parameters or biases
    optim.b1 = 0.9  # Adam/LAMB first-moment decay
    optim.b2 = 0.999  # Adam/LAMB second-moment decay
    optim.eps = 1e-6  # Adam/LAMB epsilon
    optim.max_grad_norm = 1.0  # global-norm clipping; 0 disables it
    optim.grad_accum_steps = 1  # micro-batches per optimizer step; must divide the per-device batch

    config.data = data = ml_collections.ConfigDict()
    data.source = options["data"]  # "corpus" (make data from data.corpus first), "tfrecord" or "synthetic"
    # With source=corpus: pretraining data is made once into WORKDIR/data (reused by later runs in the workdir).
    data.corpus = "demo"  # comma-separated text globs (local or gs://), "tfds:NAME[:SPLIT][:FIELD]", or "demo"
    data.corpus_format = "lines"  # "lines" (one sentence per line, blank line between documents) or "paragraphs"
    data.vocab_file = ""  # vocab.txt / SentencePiece .model / tokenizer dir; empty trains one from the corpus
    data.tokenizer = "wordpiece"  # trained when vocab_file is empty: wordpiece, sentencepiece_unigram or _bpe
    data.tokenizer_vocab_size = 8192  # size of a trained vocab (the model pads it to a multiple of 128)
    data.do_lower_case = True  # lower-case (and strip accents) before tokenising
    data.dupe_factor = 1  # passes over the corpus when making instances (dynamic masking varies masks anyway)
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
    # 2x is far outside a healthy run's step-to-step noise (README, "What a checkpoint guarantees"). 0 = NaN/inf only.
    train.spike_factor = 2.0
    train.spike_window = 100  # steps of loss history a spike is judged against

    # Checkpoints go to WORKDIR/checkpoints; a run started in a workdir that has some resumes from the latest.
    config.checkpoint = checkpoint_config(every_steps=100)
    # Parameters to start from when the workdir has no checkpoint (optimizer, step and data start afresh): a step
    # directory or checkpoints directory of another run, a HuggingFace model directory, an original TF checkpoint or
    # a Flax export. Its architecture is taken (see model_preset), and its tokenizer when data.vocab_file is empty;
    # an imported vocabulary is padded to a multiple of 128 rows. Empty: initialise from train.seed.
    config.init = ""

    if options["size"] == "tiny":
        # The default run: 200 steps on the demo corpus, long enough for MLM accuracy to climb visibly.
        optim.learning_rate = 1e-3
        optim.warmup_steps = 20
    if options["size"] in ("base", "large"):
        train.batch_size = 256
        optim.warmup_steps = 10000
        train.num_steps = 1000000
        train.log_every = 100
        train.eval_every = 10000
        train.eval_steps = 100
        config.checkpoint.every_steps = 5000
    return config
