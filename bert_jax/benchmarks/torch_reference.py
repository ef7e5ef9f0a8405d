"""The reference the benchmarks compare with: HuggingFace transformers' BERT models (PyTorch), on the JAX side's
platform (the CPU, or CUDA where JAX runs on a GPU).

The same architecture, the same batch (and on CPU the same number of threads) as bert_jax's step, over a full
training step (forward, loss, backward, clipping, AdamW): BertForPreTraining for pretraining, and the
sequence-classification, token-classification and question-answering models for the fine-tuning tasks. torch is
imported only when a step is timed.
"""

import importlib.util
import statistics
import time

import numpy as np

from bert_jax import model as model_lib
from bert_jax import arch as arch_lib


def unavailable_reason() -> str:
    """'' when torch and transformers are installed, else the reason (with the install hint).

    Only looked up, not imported: importing torch starts its OpenMP thread pool, which competes with XLA's for the
    same cores and made the JAX step measured afterwards 1.7x slower (6.79 s instead of 4.02 s for base here).
    """
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return (f"{' and '.join(missing)} not installed; install them with `pip install torch==2.13.0 "
                "'transformers>=5,<6'` (or `pip install -e .[test]`)")
    return ""


# What each task trains in transformers: bert_jax's pretraining model and its fine-tuning heads (bert_jax.tasks).
TASK_MODELS = {"pretraining": "BertForPreTraining", "sequence": "BertForSequenceClassification",
               "tokens": "BertForTokenClassification", "qa": "BertForQuestionAnswering"}


def torch_device(platform: str) -> str:
    """The torch device of a JAX platform, so that both sides run on the same chip: "cuda" for gpu, "cpu" for cpu;
    a ValueError for platforms torch does not run on here (TPU)."""
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"transformers' side runs on the CPU or a CUDA GPU; JAX's platform is {platform}")
    return "cuda" if platform == "gpu" else "cpu"


def benchmark_step(model_config: model_lib.BertConfig, batch: dict[str, np.ndarray], steps: int, warmup: int,
                   threads: int, gathered_head: bool, learning_rate: float = 1e-4, device: str = "cpu",
                   task: str = "pretraining", num_labels: int = 2) -> dict:
    """Median wall time of a HuggingFace training step on `device` ("cpu" or "cuda"), on the same batch.

    One step: forward in train mode (dropout on), the task's loss, backward, global-norm clipping to 1.0 and
    torch.optim.AdamW (weight decay 0.01, none on biases and LayerNorm), as our step; bfloat16 autocast where the
    model config's dtype is bfloat16. Each timed step ends with the loss read back (and, on CUDA,
    torch.cuda.synchronize), so the time is the device's work, not the launch.
    task "pretraining": gathered_head=False is HuggingFace's standard path (MLM logits at every position, labels -100
    except the masked ones); True runs `model.bert`, gathers the masked positions and applies `model.cls` to those
    vectors only. The fine-tuning tasks (TASK_MODELS) read label_ids and weights as bert_jax.finetune's batches.
    peak_bytes: torch.cuda.max_memory_allocated over this step's runs on CUDA, None on CPU.
    """
    import torch
    import transformers

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        architecture = arch_lib.of(model_config)
        if task != "pretraining" and architecture is not arch_lib.BERT:  # TASK_MODELS are BERT's classes
            raise ValueError(f"task={task!r}: {architecture.description} is compared in pretraining only")
        model_class = getattr(transformers, architecture.transformers_pretraining_class if task == "pretraining"
                              else TASK_MODELS[task])
        hf_config = _hf_config(model_config)
        if task != "pretraining":
            hf_config.num_labels = num_labels
        model = model_class(hf_config).to(device=device, dtype=torch.float32).train()
        optimizer = _adamw(model, learning_rate)
        step = _train_step(model, optimizer, batch, gathered_head, bfloat16=model_config.dtype == "bfloat16",
                           device=device, task=task)
        synchronize = torch.cuda.synchronize if cuda else (lambda: None)

        first_loss = step()
        for _ in range(warmup):
            step()
        times, losses = [], []
        for _ in range(steps):
            synchronize()
            start = time.perf_counter()
            losses.append(step())
            synchronize()
            times.append(time.perf_counter() - start)
        return {"step_s": statistics.median(times), "step_times": times, "loss": first_loss, "last_loss": losses[-1],
                "threads": torch.get_num_threads(), "attention": model.config._attn_implementation or "default",
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                "torch_version": torch.__version__, "transformers_version": transformers.__version__}
    finally:
        torch.set_num_threads(previous_threads)


def _hf_config(model_config):
    """transformers' config of our architecture's pretraining model (its converter's config.json fields), with the
    benchmark batches' token ids ([CLS] 101, [SEP] 102, padding 0)."""
    import transformers

    values = dict(arch_lib.of(model_config).transformers_config(model_config))
    values.update(pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102)
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values)


def _adamw(model, learning_rate: float):
    """AdamW as our optimizer: weight decay 0.01, none on biases and LayerNorm."""
    import torch

    def exempt(name):  # BERT's LayerNorm, ModernBERT's norms (attn_norm, mlp_norm, ...), and biases
        return name.endswith("bias") or "LayerNorm" in name or "norm" in name.split(".")[-2]

    no_decay = [p for n, p in model.named_parameters() if exempt(n)]
    decay = [p for n, p in model.named_parameters() if not exempt(n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)


def _task_loss_fn(model, batch: dict[str, np.ndarray], task: str, tensor):
    """The loss of a fine-tuning task's model on bert_jax.finetune's batch layout (label_ids, weights)."""
    import torch

    inputs = {"input_ids": tensor(batch["input_ids"], torch.long),
              "attention_mask": tensor(batch["input_mask"], torch.long),
              "token_type_ids": tensor(batch["segment_ids"], torch.long)}
    label_ids = tensor(batch["label_ids"], torch.long)
    if task == "qa":  # [rows, 2]: the answer's first and last piece
        return lambda: model(**inputs, start_positions=label_ids[:, 0], end_positions=label_ids[:, 1]).loss
    # Tokens: -100 (conll.IGNORE) already marks what no loss counts; sequence: one label per row.
    return lambda: model(**inputs, labels=label_ids).loss


def _train_step(model, optimizer, batch: dict[str, np.ndarray], gathered_head: bool, *, bfloat16: bool,
                device: str = "cpu", task: str = "pretraining"):
    """A function running one training step on `batch` and returning its loss (a float)."""
    import torch

    def tensor(array, dtype):
        return torch.as_tensor(array, dtype=dtype).to(device)

    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=bfloat16)
    if task != "pretraining":
        loss_fn = _task_loss_fn(model, batch, task, tensor)
        return _optimizer_step(model, optimizer, loss_fn, autocast)

    input_ids = tensor(batch["input_ids"], torch.long)
    attention_mask = tensor(batch["input_mask"], torch.long)
    token_type_ids = tensor(batch["segment_ids"], torch.long)
    positions = tensor(batch["masked_lm_positions"], torch.long)
    masked_lm_ids = tensor(batch["masked_lm_ids"], torch.long)
    weights = tensor(batch["masked_lm_weights"], torch.float32)
    nsp_labels = tensor(batch["next_sentence_labels"], torch.long)
    labels = torch.full_like(input_ids, -100)
    labels.scatter_(1, positions, torch.where(weights > 0, masked_lm_ids, -100))

    def masked(sequence_output):  # the masked rows of the encoder's output
        return torch.gather(sequence_output, 1, positions[..., None].expand(-1, -1, sequence_output.shape[-1]))

    def mlm_loss(mlm_logits):  # weighted as bert_jax's: sum(weights * xent) / (sum(weights) + 1e-5)
        xent = torch.nn.functional.cross_entropy(mlm_logits.float().flatten(0, 1), masked_lm_ids.flatten(),
                                                 reduction="none")
        return torch.sum(weights.flatten() * xent) / (weights.sum() + 1e-5)

    def modern_loss_fn():  # masked LM only, as bert_jax.modern; gathered: the head on the masked rows only
        if not gathered_head:
            return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        sequence_output = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return mlm_loss(model.decoder(model.head(masked(sequence_output))))

    def loss_fn():
        if not gathered_head:
            return model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         labels=labels, next_sentence_label=nsp_labels).loss
        sequence_output, pooled_output = model.bert(input_ids=input_ids, attention_mask=attention_mask,
                                                    token_type_ids=token_type_ids, return_dict=False)[:2]
        mlm_logits, nsp_logits = model.cls(masked(sequence_output), pooled_output)
        return mlm_loss(mlm_logits) + torch.nn.functional.cross_entropy(nsp_logits.float(), nsp_labels)

    modern = type(model).__name__ == "ModernBertForMaskedLM"
    return _optimizer_step(model, optimizer, modern_loss_fn if modern else loss_fn, autocast)


def _optimizer_step(model, optimizer, loss_fn, autocast):
    """step() -> float: forward and loss under `autocast`, backward, clipping to 1.0, the optimizer's update."""
    import torch

    def step():
        with autocast:
            loss = loss_fn()
        loss.backward()
        loss = loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step
