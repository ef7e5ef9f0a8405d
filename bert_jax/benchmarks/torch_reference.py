"""The reference the step benchmark compares with: HuggingFace transformers' BertForPreTraining (PyTorch) on CPU.

The same architecture, the same batch and the same number of threads as bert_jax's step, over a full training step
(forward, MLM + NSP loss, backward, clipping, AdamW). torch is imported only when a step is timed.
"""

import importlib.util
import statistics
import time

import numpy as np

from bert_jax import model as model_lib


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


def benchmark_step(model_config: model_lib.BertConfig, batch: dict[str, np.ndarray], steps: int, warmup: int,
                   threads: int, gathered_head: bool, learning_rate: float = 1e-4) -> dict:
    """Median wall time of a HuggingFace BertForPreTraining training step on CPU, on the same batch.

    One step: forward in train mode (dropout on), MLM cross-entropy over the masked positions + NSP, backward,
    global-norm clipping to 1.0 and torch.optim.AdamW (weight decay 0.01, none on biases and LayerNorm), as our step.
    gathered_head=False is HuggingFace's standard path (MLM logits at every position, labels -100 except the masked
    ones); True runs `model.bert`, gathers the masked positions and applies `model.cls` to those vectors only.
    """
    import torch
    import transformers

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    try:
        model = transformers.BertForPreTraining(_hf_config(model_config)).to(torch.float32).train()
        optimizer = _adamw(model, learning_rate)
        step = _train_step(model, optimizer, batch, gathered_head, bfloat16=model_config.dtype == "bfloat16")

        first_loss = step()
        for _ in range(warmup):
            step()
        times, losses = [], []
        for _ in range(steps):
            start = time.perf_counter()
            losses.append(step())
            times.append(time.perf_counter() - start)
        return {"step_s": statistics.median(times), "step_times": times, "loss": first_loss, "last_loss": losses[-1],
                "threads": torch.get_num_threads(), "attention": model.config._attn_implementation or "default",
                "torch_version": torch.__version__, "transformers_version": transformers.__version__}
    finally:
        torch.set_num_threads(previous_threads)


def _hf_config(model_config: model_lib.BertConfig):
    """transformers.BertConfig of our architecture."""
    import transformers

    return transformers.BertConfig(
        vocab_size=model_config.vocab_size, hidden_size=model_config.hidden_size,
        num_hidden_layers=model_config.num_layers, num_attention_heads=model_config.num_heads,
        intermediate_size=model_config.intermediate_size,
        # gelu_new is the tanh approximation: our gelu_tanh. "gelu" is the exact erf form in both.
        hidden_act="gelu_new" if model_config.hidden_act == "gelu_tanh" else "gelu",
        max_position_embeddings=model_config.max_position_embeddings,
        type_vocab_size=model_config.type_vocab_size, hidden_dropout_prob=model_config.dropout_rate,
        attention_probs_dropout_prob=model_config.attention_dropout_rate,
        initializer_range=model_config.initializer_range, layer_norm_eps=model_config.layer_norm_eps)


def _adamw(model, learning_rate: float):
    """AdamW as our optimizer: weight decay 0.01, none on biases and LayerNorm."""
    import torch

    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)


def _train_step(model, optimizer, batch: dict[str, np.ndarray], gathered_head: bool, *, bfloat16: bool):
    """A function running one training step on `batch` and returning its loss (a float)."""
    import torch

    input_ids = torch.as_tensor(batch["input_ids"], dtype=torch.long)
    attention_mask = torch.as_tensor(batch["input_mask"], dtype=torch.long)
    token_type_ids = torch.as_tensor(batch["segment_ids"], dtype=torch.long)
    positions = torch.as_tensor(batch["masked_lm_positions"], dtype=torch.long)
    masked_lm_ids = torch.as_tensor(batch["masked_lm_ids"], dtype=torch.long)
    weights = torch.as_tensor(batch["masked_lm_weights"], dtype=torch.float32)
    nsp_labels = torch.as_tensor(batch["next_sentence_labels"], dtype=torch.long)
    labels = torch.full_like(input_ids, -100)
    labels.scatter_(1, positions, torch.where(weights > 0, masked_lm_ids, -100))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16)

    def loss_fn():
        if not gathered_head:
            return model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         labels=labels, next_sentence_label=nsp_labels).loss
        sequence_output, pooled_output = model.bert(input_ids=input_ids, attention_mask=attention_mask,
                                                    token_type_ids=token_type_ids, return_dict=False)[:2]
        index = positions[..., None].expand(-1, -1, sequence_output.shape[-1])
        mlm_logits, nsp_logits = model.cls(torch.gather(sequence_output, 1, index), pooled_output)
        xent = torch.nn.functional.cross_entropy(mlm_logits.float().flatten(0, 1), masked_lm_ids.flatten(),
                                                 reduction="none")
        mlm_loss = torch.sum(weights.flatten() * xent) / (weights.sum() + 1e-5)
        return mlm_loss + torch.nn.functional.cross_entropy(nsp_logits.float(), nsp_labels)

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
