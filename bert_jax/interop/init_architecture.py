"""--config.init: the architecture comes from the checkpoint it names, whichever of bert_jax.arch's it is.

`resolve_init_architecture(config)` reads the checkpoint's config file (HuggingFace config.json, the original
bert_config.json, an export's bert_jax_config.json) or, for a bert_jax run, its model_config.json and array shapes,
never the weights, and fills config.model with it before anything is built.
"""

import copy
import dataclasses
import json
import os

from absl import logging
import jax

from bert_jax import arch as arch_lib
from bert_jax import checkpoint as checkpoint_lib
from bert_jax import fileio
from bert_jax import model as model_lib
from bert_jax import presets
from bert_jax.interop import flax_files
from bert_jax.interop import huggingface
from bert_jax.interop import layout
from bert_jax.interop import pretrained
from bert_jax.interop import tf_checkpoint
from bert_jax.data import tokenization
from bert_jax.interop.flax_files import FLAX_CONFIG
from bert_jax.interop.layout import VOCAB_FILE
from bert_jax.interop.tf_checkpoint import TF_CONFIG

# A bert_jax run's architecture: WORKDIR/model_config.json (pretraining), WORKDIR/finetuned/model_config.json.
RUN_MODEL_CONFIG = "model_config.json"


@dataclasses.dataclass
class InitArchitecture:
    """What a checkpoint fixes, read from its config file (and, for our own checkpoints, its array shapes) without
    reading any weights."""

    values: dict  # the architecture's checkpoint_fields the checkpoint states; a run without model_config.json fewer
    where: str  # the file (or checkpoint directory) they were read from, for messages
    format: str  # "bert_jax_checkpoint", "bert_jax" (export_flax), "huggingface" or "tf_checkpoint"
    vocab_file: str | None = None  # the checkpoint's tokenizer (a path load_tokenizer accepts), if one is known
    arch: str = arch_lib.DEFAULT  # the bert_jax.arch name

    @property
    def fields(self) -> tuple[str, ...]:
        return arch_lib.get(self.arch).checkpoint_fields


def write_run_model_config(directory: str, model_config: model_lib.BertConfig) -> None:
    """Records a run's architecture beside its checkpoints, for a later --config.init (process 0 writes)."""
    if jax.process_index() == 0:
        fileio.makedirs(directory)
        with fileio.open_file(fileio.join(directory, RUN_MODEL_CONFIG), "w") as file:
            file.write(json.dumps(arch_lib.of(model_config).record(model_config), indent=2) + "\n")


def _checkpoint_shapes(step_directory) -> tuple[str, dict]:
    """(arch, the architecture fields the parameter shapes of one of our checkpoints determine), read from its
    metadata: the first architecture that recognises the parameter tree."""
    params = checkpoint_lib.state_metadata(str(step_directory))["train_state"]["params"]
    for name in arch_lib.names():
        shapes = arch_lib.get(name).checkpoint_shapes(params)
        if shapes is not None:
            return name, shapes
    raise ValueError(f"{step_directory}: its parameters ({', '.join(sorted(params))}) are no architecture's that "
                     f"bert_jax knows ({', '.join(arch_lib.names())})")


def _run_architecture(path: str) -> InitArchitecture:
    """A bert_jax checkpoint (step, checkpoints or fine-tuned directory): its shapes, and its run's model config."""
    step = checkpoint_lib.step_directory(path)
    # WORKDIR/checkpoints/STEP belongs to WORKDIR; a fine-tuned directory holds its own files.
    home = step.parent.parent if step.name.isdigit() else step
    arch, values = _checkpoint_shapes(step)
    record, where = home / RUN_MODEL_CONFIG, str(step)
    if record.exists():
        recorded = recorded_config(str(record))
        recorded_arch = arch_lib.of(recorded).name
        disagree = [f"{field}={getattr(recorded, field)!r} there but {value!r} in the arrays"
                    for field, value in dict(values, arch=arch).items()
                    if getattr(recorded, field, recorded_arch) != value]
        if disagree:
            raise ValueError(f"{record} does not describe the checkpoint {step}: {'; '.join(disagree)}. Fix: "
                             "restore the model_config.json that run wrote, or delete it (the shapes are used)")
        values = {field: getattr(recorded, field) for field in arch_lib.get(arch).checkpoint_fields}
        where = str(record)
    vocab_file = pretrained.saved_tokenizer(str(step))
    ready = home / "data" / "READY.json"  # a run that made its data (data.source=corpus) names its tokenizer
    if vocab_file is None and ready.exists():
        tokenizer_dir = json.loads(ready.read_text()).get("tokenizer_dir")
        vocab_file = tokenizer_dir if tokenizer_dir and fileio.exists(tokenizer_dir) else None
    return InitArchitecture(values, where, "bert_jax_checkpoint", vocab_file, arch)


def recorded_config(path: str):
    """A run's model_config.json: the config of the architecture its `arch` names (none: BERT's)."""
    values = layout.read_json(path)
    try:
        architecture = arch_lib.get(values.pop("arch", arch_lib.DEFAULT))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return architecture.config_from_record(values, path)


def read_architecture(path: str) -> InitArchitecture:
    """The architecture of a --config.init checkpoint, from its config file (no weights are read): a HuggingFace
    config.json, an original bert_config.json, an export_flax bert_jax_config.json, or a bert_jax run."""
    path = os.fspath(path)
    if checkpoint_lib.is_checkpoint(path):
        return _run_architecture(path)
    if not fileio.exists(path) and not fileio.exists(path + ".index"):
        raise FileNotFoundError(f"--config.init={path} does not exist. Fix: a bert_jax run's checkpoints (or step) "
                                "directory, a fine-tuned directory, a HuggingFace model directory, an original TF "
                                "checkpoint or a Flax export")
    kind = pretrained.checkpoint_format(path)
    if kind == "bert_jax":
        config_path = os.path.join(path, FLAX_CONFIG)
        config, vocab_file = flax_files.config_from_ours(config_path), pretrained.saved_tokenizer(path)
    elif kind == "huggingface":
        config_path = huggingface.hf_config_path(path)
        values = layout.read_json(config_path)
        config = arch_lib.for_transformers(values.get("model_type")).config_from_transformers(values, config_path)
        vocab_file = huggingface.tokenizer_beside(config_path)
    else:
        prefix = tf_checkpoint.tf_prefix(path)
        config_path = os.path.join(os.path.dirname(prefix), TF_CONFIG)
        config = tf_checkpoint.config_from_tf(config_path)
        vocab_file = os.path.join(os.path.dirname(prefix), VOCAB_FILE)
    vocab_file = vocab_file if vocab_file and os.path.exists(vocab_file) else None
    architecture = arch_lib.of(config)
    return InitArchitecture({field: getattr(config, field) for field in architecture.checkpoint_fields},
                            config_path, kind, vocab_file, architecture.name)


def _preset_model(config) -> dict | None:
    """config.model as the recipe's preset (config.model_preset) left it, or None for a config without one."""
    preset = config.get("model_preset")
    if not preset:
        return None
    return arch_lib.of(config.model).preset(preset).to_dict()


def resolve_init_architecture(config, command_line=()):
    """`config` (a copy) with config.model's architecture taken from the checkpoint config.init names.

    Every field of the checkpoint's architecture's checkpoint_fields (bert_jax.arch; fine-tuning from another
    architecture's checkpoint than the recipe's then builds that one, _switch_architecture) the checkpoint states
    is copied into config.model, except fields set explicitly, which must agree with it (one ValueError names every
    one that does not). Explicit: named in `command_line` (config paths such as "model.hidden_size": the driver
    passes its --config.* overrides), or different from the recipe preset's value (config.model_preset), so the
    rule holds for configs built in Python.
    The vocabulary: a pretraining run from an imported checkpoint pads its rows to a multiple of 128 (an explicit
    model.vocab_size may be any size at least the checkpoint's rows); our own checkpoints and fine-tuning keep the
    checkpoint's rows. An empty data.vocab_file becomes the checkpoint's tokenizer when one is known, and a set one
    must fit the checkpoint: its entries <= the rows <= the entries padded to a multiple of 128.
    Without config.init, `config` itself is returned.
    """
    if not config.get("init"):
        return config
    source = read_architecture(config.init)
    resolved = copy.deepcopy(config)
    named = {name.split(".", 1)[1] for name in command_line if name.startswith("model.")}
    preset = _preset_model(config)
    pretraining = "features" not in config  # configs/finetune.py has a features section, configs/pretrain.py not
    if arch_lib.of(config.model).name != source.arch:
        preset = _switch_architecture(resolved, source, named, pretraining)
    model, data = resolved.model, resolved.data
    conflicts = []
    for field in source.fields:
        if field not in source.values:
            continue
        theirs, ours = source.values[field], model[field]
        explicit = field in named or (preset is not None and ours != preset[field])
        if field == "vocab_size" and pretraining and source.format != "bert_jax_checkpoint":
            wanted, agrees = tokenization.padded_vocab_size(theirs), ours >= theirs
            why = f" (rows are added on import, never dropped: at least {theirs})"
        else:
            wanted, agrees, why = theirs, ours == theirs, ""
        if not explicit:
            model[field] = wanted
        elif not agrees:
            conflicts.append(f"has {field}={theirs!r} but --config.model.{field}={ours!r}{why}")
    if conflicts:
        raise ValueError(f"--config.init={config.init} ({source.where}) {'; '.join(conflicts)}. Fix: leave these "
                         "fields unset (the architecture comes from the checkpoint) or set the checkpoint's values")
    if not data.vocab_file and source.vocab_file:
        data.vocab_file = source.vocab_file
        logging.info("--config.init=%s: data.vocab_file set to its tokenizer %s", config.init, source.vocab_file)
    if data.vocab_file and "vocab_size" in source.values:
        _check_tokenizer_fits(data, source)
    elif pretraining and data.get("source") == "corpus":
        raise ValueError(f"--config.init={config.init} has no tokenizer beside it and --config.data.vocab_file is "
                         "empty: the run would train a new tokenizer whose ids mean nothing to the checkpoint. "
                         "Fix: set --config.data.vocab_file to the vocabulary the checkpoint was trained with")
    if resolved.model.to_dict() != config.model.to_dict():  # said once: resolving again changes nothing
        logging.info("--config.init=%s: architecture from %s: %s", config.init, source.where,
                     ", ".join(f"{field}={model[field]!r}" for field in source.fields))
        _warn_if_another_preset(config, source)
    return resolved


def _switch_architecture(config, source: InitArchitecture, named: set, pretraining: bool) -> dict:
    """Fine-tuning from another architecture's checkpoint than the recipe's (configs/finetune.py's presets are
    BERT's; a modern encoder's checkpoint, say): config.model becomes the checkpoint's architecture's preset of the
    same size, keeping the compute choices (dtype, attention, remat) and every field named on the command line.
    Returns that preset's config.model, against which explicit fields are told. Pretraining keeps the recipe's
    architecture: a checkpoint of another one is refused, with the option to pick."""
    architecture = arch_lib.get(source.arch)
    if pretraining:
        raise ValueError(f"--config.init={config.init} ({source.where}) is a checkpoint of arch={source.arch!r} but "
                         f"the recipe trains arch={arch_lib.of(config.model).name}. Fix: "
                         f"configs/pretrain.py:arch={source.arch}")
    preset = architecture.preset(config.get("model_preset") or "base")
    foreign = sorted(name for name in named if name not in preset)
    if foreign:
        raise ValueError(f"--config.init={config.init} ({source.where}) is {architecture.description} "
                         f"(arch={source.arch}), which has no "
                         f"{', '.join(f'--config.model.{name}' for name in foreign)}. Fix: leave them unset")
    model = preset.copy_and_resolve_references()
    for name in ("dtype", "attention", "remat", *named):
        if name in config.model:
            model[name] = config.model[name]
    with config.unlocked():
        config.model = model
    logging.info("--config.init=%s is %s: the model is arch=%s", config.init, architecture.description,
                 source.arch)
    return preset.to_dict()


def _check_tokenizer_fits(data, source: InitArchitecture) -> None:
    entries = tokenization.load_tokenizer(data.vocab_file, do_lower_case=data.do_lower_case).vocab_size
    rows = source.values["vocab_size"]
    if not entries <= rows <= tokenization.padded_vocab_size(entries):
        raise ValueError(f"--config.data.vocab_file={data.vocab_file} has {entries} entries but the checkpoint "
                         f"({source.where}) has {rows} word-embedding rows: not the vocabulary it was trained with. "
                         "Fix: the checkpoint's own tokenizer" + (f" ({source.vocab_file})" if source.vocab_file
                                                                  else ""))


def _warn_if_another_preset(config, source: InitArchitecture) -> None:
    """The recipe's other defaults (learning rate, epochs) are chosen per preset: say when they are another's."""
    preset = config.get("model_preset")
    # presets.RECIPES were measured on BERT's presets; the other architectures' have no recipes to warn about.
    if (not preset or arch_lib.get(source.arch) is not arch_lib.BERT
            or not all(field in source.values for field in ("num_layers", "hidden_size", "num_heads"))):
        return
    shape = (source.values["num_layers"], source.values["hidden_size"], source.values["num_heads"])
    if presets.MODEL_PRESETS[preset] != shape:
        match = [name for name, preset_shape in presets.MODEL_PRESETS.items() if preset_shape == shape]
        logging.warning("--config.init=%s is not the %s preset (it has %d layers, hidden %d, %d heads): the "
                        "architecture is the checkpoint's, but the recipe's other defaults (learning rate, steps) are "
                        "those of size=%s%s", config.init, preset, *shape, preset,
                        f"; size={match[0]} has the ones for its size" if match else "")
