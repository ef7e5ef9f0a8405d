"""Ahead-of-time compilation of the real train step for TPU topologies on this CPU host (bert_jax.aot).

Needs libtpu, which the test extra pins: without it these tests fail (they do not skip), so CI notices.
"""

import dataclasses
import functools
import math
import multiprocessing
import os
import re
import subprocess
import sys

import jax
import pytest

from bert_jax import aot
from bert_jax import chips
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from configs import pretrain

# The planner's compiler processes compile with XLA's full optimisation (they do not run tests/conftest.py): so do
# these tests, so that their compiles and the planner's are of one kind.
pytestmark = pytest.mark.xla_optimized

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What `python -m bert_jax.aot` sets before JAX starts (bert_jax/aot/__main__.py, _set_compile_only_environment):
# the tests compile in this process, beside other test processes that may load libtpu too.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
TOPOLOGY = "v5e:2x2"  # 4 chips, one host: the smallest slice that holds an fsdp x tensor = 2 x 2 mesh


def _require_libtpu():
    """Called first in every test, so that a missing libtpu fails each test (not an error in a fixture)."""
    try:
        import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        pytest.fail("libtpu is not installed, and bert_jax.aot compiles for TPU topologies with its compiler: "
                    "install the test extra (pip install -e '.[test]'), which pins it", pytrace=False)


def _tiny_config():
    config = pretrain.get_config("size=tiny")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 2, 2
    # A global batch of 8 rather than the preset's 32: the TPU compile takes less than half as long, and the FLOP and
    # memory figures below are per row or per state, the same either way.
    config.train.batch_size = 8
    return config


def _small_vocab_config(num_layers=2):
    """_tiny_config with a 512-word vocabulary (and `num_layers`), for tests whose checks hold for any model (which
    kernel, which shardings and collectives, memory and FLOPs per chip against the model's own): the 30522-word
    embedding and head take most of tiny's TPU compile (27 against 17 CPU-s for this step at two layers)."""
    config = _tiny_config()
    config.model.num_layers, config.model.vocab_size = num_layers, 512
    return config


@functools.cache
def _compiled_step():
    """_small_vocab_config's train step (two layers, dropout on, global batch 8) compiled once for a 4-chip v5e
    slice: its memory and FLOPs are checked against the model's own, which hold for any vocabulary."""
    return aot.compile_train_step(_small_vocab_config(), TOPOLOGY)


def _state_shard_bytes(config):
    """Exact bytes of one chip's shard of the train state, from the shardings the training loop uses."""
    from bert_jax import optim, sharding as sharding_lib, train  # pylint: disable=import-outside-toplevel
    devices = aot.topology_devices(TOPOLOGY)
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    mesh = sharding_lib.create_mesh(config.mesh, devices)
    tx, _ = optim.create_optimizer(config.optim, config.train.num_steps)
    abstract, shardings, _ = train.abstract_train_state(model, tx, mesh, sharding_lib.logical_rules(config.mesh),
                                                        config.data.max_seq_length,
                                                        config.data.max_predictions_per_seq)
    return sum(math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               for leaf, sharding in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)))


def test_compiled_step_memory_is_the_sharded_state_plus_activations():
    _require_libtpu()
    _, report = _compiled_step()
    assert (report.num_chips, report.num_hosts, report.device_kind) == (4, 1, "TPU v5 lite")
    assert report.mesh == {"dcn_data": 1, "data": 1, "fsdp": 2, "tensor": 2}
    for field in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes",
                  "xla_peak_bytes"):
        assert getattr(report, field) > 0, field
    # The arguments are this chip's quarter of the state (parameters and two Adam moments) plus its batch rows:
    # a replicated state would be ~4x as large. TPU tile layouts pad small arrays, hence the upper margin.
    state = _state_shard_bytes(_small_vocab_config())
    assert state < report.num_params * 12 / 2  # sanity of the expectation itself: sharded, not replicated
    assert state <= report.argument_bytes <= 1.25 * state + (1 << 20)
    # The state is donated: the new state is written over it.
    assert state <= report.alias_bytes <= report.argument_bytes
    assert report.total_bytes == (report.argument_bytes + report.output_bytes - report.alias_bytes
                                  + report.temp_bytes + report.generated_code_bytes)
    assert report.fits and report.hbm_bytes == 16 * aot.GIB


def test_compiled_step_flops_match_the_model_per_chip():
    _require_libtpu()
    compiled, report = _compiled_step()
    config = _small_vocab_config()
    model_config = model_lib.BertConfig.from_config(config.model)
    rows_per_chip = config.train.batch_size / 4
    expected = metrics_lib.model_flops_per_sequence(model_config, 128, 20) * rows_per_chip
    assert report.model_flops_per_device == pytest.approx(expected)
    executed = metrics_lib.step_matmul_flops_per_sequence(model_config, 128, 20) * rows_per_chip
    assert report.executed_flops_per_device == pytest.approx(executed) and executed < expected
    assert report.flops_per_device == compiled.cost_analysis()["flops"]
    # XLA's traffic for the program, which the planner's step time reads: at least the state shard read and written.
    assert report.bytes_accessed >= 2 * _state_shard_bytes(config)
    # The compiled step is forward + backward (the matmuls the step executes: model_flops_per_sequence's less the
    # last layer's rows the heads do not read) plus the work the matmul count leaves out: dropout bits, softmax,
    # LayerNorm, GELU and the AdamW update (measured 1.06 here). A wrong batch (2x), a step replicated over an axis
    # instead of split, or a last layer computed at every row lands outside. XLA's cost analysis counts a loop body
    # once, so the bound holds only for a step without loops, as this one is.
    assert report.while_loops == 0
    assert 1.0 <= report.flops_ratio <= 1.45, report.flops_ratio
    assert report.flops_total == pytest.approx(report.flops_per_device * 4)


def test_a_step_too_large_for_the_chip_is_reported_not_raised():
    _require_libtpu()
    config = pretrain.get_config("size=tiny")
    # Two layers: the first computes every row (the last only the rows the heads read); ~40 GiB of activations
    # per 16 GiB chip.
    config.model.num_layers, config.model.vocab_size = 2, 512
    config.data.max_seq_length, config.train.batch_size = 512, 32768
    compiled, report = aot.compile_train_step(config, TOPOLOGY)
    assert compiled is None and not report.fits
    assert "RESOURCE_EXHAUSTED" in report.out_of_memory
    table = aot.format_reports([report])
    assert re.search(r"fits\s+NO: XLA needs [\d.]+G for HLO temporaries, [\d.]+G of HBM available", table), table
    assert re.search(r"per chip: total\s+-\n", table), table


def test_auto_attention_compiles_the_pallas_kernel_for_the_tpu_from_a_cpu_host():
    _require_libtpu()
    # Traced for the TPU (model.compiling_for), auto takes the splash kernel there, as the TPU run itself would;
    # with BERT's attention dropout it keeps the exact einsum path, which no custom kernel implements. Two layers:
    # the last attends only from the rows the heads read, too few for the kernel's blocks of 128.
    config = _small_vocab_config()
    config.model.attention_dropout_rate = 0.0
    # One row per shard: the batch does not change which attention the step gets, and a smaller one compiles sooner.
    config.train.batch_size = 2
    compiled, report = aot.compile_train_step(config, TOPOLOGY)
    assert report.fits
    assert 'custom_call_target="tpu_custom_call"' in compiled.as_text()
    with_dropout, _ = _compiled_step()
    assert 'custom_call_target="tpu_custom_call"' not in with_dropout.as_text()
    assert model_lib.target_platform() == "cpu"  # the override ends with the compilation


def test_the_modern_encoder_compiles_for_the_tpu_with_the_splash_kernels_local_mask():
    """arch=modern on the same path (fsdp x tensor = 2 x 2 on a v5e slice), scanned (4 layers: layer 0, then one
    group of two local layers and a global one under nn.scan): its global and local layers both take the splash
    kernel (the local ones with its LocalMask: a 256-token row, a 128-token window), and the report holds."""
    _require_libtpu()
    config = pretrain.get_config("size=tiny,data=synthetic,arch=modern")
    config.model.vocab_size, config.model.num_layers, config.model.scan_layers = 512, 4, True
    config.data.max_seq_length, config.data.max_predictions_per_seq = 256, 40
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 2, 2
    config.train.batch_size = 4
    compiled, report = aot.compile_train_step(config, TOPOLOGY)
    assert report.fits and report.flops_per_device > 0
    text = compiled.as_text()
    assert "while" in text  # the scanned group
    assert text.count('custom_call_target="tpu_custom_call"') >= 2  # forward kernels of layer 0 and the scan body
    assert model_lib.target_platform() == "cpu"


def test_bad_topologies_name_the_flag():
    _require_libtpu()
    with pytest.raises(ValueError, match=r"--topology='v9x:2x2'.*unknown TPU chip 'v9x'"):
        aot.topology_devices("v9x:2x2")
    with pytest.raises(ValueError, match=r"--topology='v5p-128'.*v5p-128 = v5p:4x4x4"):
        aot.topology_devices("v5p-128")
    with pytest.raises(ValueError, match=r"--topology='v5e:3x3': libtpu cannot build it"):
        aot.topology_devices("v5e:3x3")
    # v4 is one (megacore) device per chip, as a v4 TPU VM runs it.
    assert len(aot.topology_devices("v4:2x2x1")) == 4


def _run_cli(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "bert_jax.aot", "--config=configs/pretrain.py:size=tiny", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_cli_prints_the_table():
    _require_libtpu()
    # One layer and a small vocab keep this compile short; the numbers are checked above.
    result = _run_cli(f"--topology={TOPOLOGY}", "--config.model.num_layers=1", "--config.model.vocab_size=512",
                      "--config.train.batch_size=8")
    assert result.returncode == 0, result.stderr[-3000:]
    # None of libtpu's or JAX's start-up complaints about the host not being a TPU VM.
    for noise in ("Failed to find host bounds", "Logging before InitGoogle", "Unable to initialize backend",
                  "TPU_WORKER_HOSTNAMES"):
        assert noise not in result.stderr, result.stderr[-3000:]
    lines = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.splitlines()
                 if re.search(r"\S\s{2,}\S", line))
    assert lines["topology"] == TOPOLOGY
    assert lines["chips (hosts)"] == "4 (1)"
    assert lines["mesh dcn_data,data,fsdp,tensor"] == "1,4,1,1"
    assert lines["global batch x seq"] == "8 x 128"
    assert lines["fits"].startswith("yes")
    for label in ("per chip: arguments", "per chip: total", "per chip: XLA peak"):
        assert lines[label].endswith("iB") and float(lines[label].split()[0]) > 0, (label, lines[label])
    # This one-layer step can keep everything in its arguments and outputs: XLA reports 0 bytes of temporaries.
    assert lines["per chip: temporaries"].endswith("iB") and float(lines["per chip: temporaries"].split()[0]) >= 0
    assert float(lines["compiled TFLOP/step per chip"]) > 0
    assert 1.0 <= float(lines["compiled / executed matmul FLOPs"]) <= 1.6
    assert float(lines["executed matmul TFLOP/step per chip"]) < float(lines["model TFLOP/step per chip"])


def test_cli_bad_topology_names_the_flag():
    _require_libtpu()
    result = _run_cli("--topology=v5litepod-16")
    assert result.returncode != 0
    assert "--topology='v5litepod-16'" in result.stderr and "v5e:16x16" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("args, message", [
    ([f"--topology={TOPOLOGY},v5e:4x4"], "--plan searches one topology at a time"),
    ([f"--topology={TOPOLOGY}", "--plan_meshes=2x1"], "--plan_meshes: '2x1' is not DATAxFSDPxTENSOR"),
    ([f"--topology={TOPOLOGY}", "--plan_meshes=2x1x1"], "--plan_meshes: 2x1x1 is 2 chips, but a slice has 4"),
    ([f"--topology={TOPOLOGY}", "--plan_remat=some"], "--plan_remat=some must name policies of"),
    ([f"--topology={TOPOLOGY}", "--plan_headroom=1.5"], "--plan_headroom=1.5: must be in [0, 1)"),
    ([f"--topology={TOPOLOGY}", "--plan_batch=-256"], "--plan_batch=-256: must be positive"),
    ([f"--topology={TOPOLOGY}", "--plan_saturation=0"], "--plan_saturation=0.0: must be in (0, 1]"),
])
def test_cli_plan_refuses_bad_flags_by_name(args, message):
    _require_libtpu()
    result = _run_cli("--plan", *args)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_cli_without_libtpu_says_which_extra_installs_it():
    _require_libtpu()
    # libtpu made unimportable in the child, as on a machine without the aot / test extra (JAX, once it has
    # loaded libtpu here, also exports its path as TPU_LIBRARY_PATH: drop that too).
    script = ("import runpy, sys; sys.modules['libtpu'] = None; "
              "sys.argv = ['aot', '--config=configs/pretrain.py:size=tiny', '--topology=v5e:2x2']; "
              "runpy.run_module('bert_jax.aot', run_name='__main__')")
    env = {name: value for name, value in os.environ.items() if name != "TPU_LIBRARY_PATH"}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=dict(env, JAX_PLATFORMS="cpu"),
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0
    assert "needs libtpu: pip install -e '.[aot]'" in result.stderr, result.stderr[-2000:]


def test_tiny_compiles_for_two_slices_with_the_batch_over_both():
    """2 x v5e:2x2 joined by DCN: the mesh puts the slices on dcn_data, each slice's 4 chips on data x fsdp x
    tensor, and the batch is split over both slices."""
    _require_libtpu()
    from jax.sharding import PartitionSpec  # pylint: disable=import-outside-toplevel
    config = _small_vocab_config(num_layers=1)
    config.train.batch_size = 4  # one row per shard, which compiles sooner; its sharding maps any batch as below
    compiled, report = aot.compile_train_step(config, TOPOLOGY, num_slices=2)
    assert report.topology == f"2 x {TOPOLOGY}" and report.num_chips == 8 and report.num_hosts == 2
    assert report.mesh == {"dcn_data": 2, "data": 1, "fsdp": 2, "tensor": 2} and report.fits
    batch_sharding = compiled.input_shardings[0][1]["input_ids"]
    assert batch_sharding.spec == PartitionSpec(("dcn_data", "fsdp", "data"))
    for index, slice_devices in enumerate(batch_sharding.mesh.devices):
        assert {device.slice_index for device in slice_devices.flat} == {index}
    rows = {device.slice_index: set() for device in batch_sharding.mesh.devices.flat}
    for device, where in batch_sharding.devices_indices_map((8, 128)).items():  # where an 8-row batch goes
        rows[device.slice_index].update(range(8)[where[0]])
    assert rows == {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
    # What crosses the slices, by the compiled program: the gradient all-reduce and nothing else (no FSDP all-gather,
    # no activation): each chip sends its share of the fp32 gradients, the state being split 4 ways in a slice.
    assert set(report.dcn_bytes) == {"ALL_REDUCE"}, report.dcn_bytes
    gradient_bytes = 4 * report.num_params
    assert gradient_bytes / 4 <= report.dcn_bytes["ALL_REDUCE"] <= 1.01 * gradient_bytes, report.dcn_bytes
    assert _compiled_step()[1].dcn_bytes == {}


@pytest.mark.timeout(900)  # 3-5 compilations and 2 to check them
def test_planner_finds_a_batch_the_plain_compile_confirms_and_rejects_the_next(tmp_path):
    """The planner for fsdp x tensor = 2 x 2 on v5e:2x2 against a 19 MiB budget, which the tiny preset (one layer,
    32-token rows of 32 predictions, a 4096-word vocabulary, dropout off) outgrows between 8 and 16 rows per shard:
    compiled at 8 and 32 rows, the memory line between them, one compile at its answer. The plain AOT path confirms
    that the batch it returns fits with 10% headroom and that the next size up it names does not; a second plan is
    served from the cache."""
    _require_libtpu()
    # pylint: disable=import-outside-toplevel
    from bert_jax.aot import estimate, planner
    from bert_jax.aot import plan as plan_lib
    from bert_jax.aot.cache import ReportCache
    config, budget, headroom = pretrain.get_config("size=tiny"), 19 << 20, 0.1
    config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
    # One layer, 32-token rows and a 4096-word vocabulary keep each TPU compile short (the 30522-word one's take ~1.7x
    # as long); 32 predictions a row keep the MLM logits growing with the batch: ~0.2 MiB a row, 16.6 MiB at 8 rows.
    config.model.num_layers, config.data.max_seq_length = 1, 32
    config.model.vocab_size, config.data.max_predictions_per_seq = 4096, 32
    candidate = plan_lib.Candidate(data=1, fsdp=2, tensor=2, remat="none", scan_layers=False)
    cache = ReportCache(str(tmp_path))
    spec = plan_lib.PlanSpec(config, TOPOLOGY, 1, headroom, budget, ("none",), (False,), meshes=((1, 2, 2),),
                             resolution=0.5)
    (row,) = planner.plan(spec, cache)
    assert row.candidate == candidate and row.fits and row.confirmed and row.limit == "memory", row
    assert 8 <= row.rows_per_shard < 16 and row.compiles <= 5, row
    assert row.report.batch_size == 2 * row.rows_per_shard < row.not_fitting.batch_size <= 64
    for report, fits in ((row.report, True), (row.not_fitting, False)):
        _, plain = aot.compile_train_step(planner.configure(config, candidate, report.batch_size // 2, 1), TOPOLOGY)
        assert plain.mesh == {"dcn_data": 1, "data": 1, "fsdp": 2, "tensor": 2}
        assert plain.batch_size == report.batch_size
        assert estimate.fits_with_headroom(plain, headroom, budget) is fits, (plain.batch_size, plain.needed_bytes)
        if fits:  # compiled, not predicted: the plain path's report figure for figure
            assert dataclasses.replace(plain, lower_seconds=0, compile_seconds=0) == dataclasses.replace(
                report, lower_seconds=0, compile_seconds=0)
    assert plan_lib.flag_line(row, 1) == ("--config.mesh.dcn_data=1 --config.mesh.data=1 --config.mesh.fsdp=2 "
                                     "--config.mesh.tensor=2 --config.model.remat=none --config.model.scan_layers="
                                     f"False --config.train.batch_size={row.report.batch_size} "
                                     "--config.optim.grad_accum_steps=1")
    # The predicted time is the roofline of XLA's own figures for the compiled step.
    step_time = estimate.predict(row.report, chips.CHIPS["v5e"], row.fixed_bytes)
    assert row.seconds == step_time.seconds > 0
    assert row.sequences_per_s_per_chip == pytest.approx(row.report.batch_size / row.seconds / 4)
    table = plan_lib.format_plan([row], headroom, budget, chips.CHIPS["v5e"])
    assert re.search(rf"^1,2,2  none  off +{row.rows_per_shard} +1 +{row.report.batch_size} .* / 0\.0186 \(", table,
                     re.MULTILINE), table
    hits = cache.hits
    assert planner.plan(spec, cache) == [row]
    assert cache.hits - hits == row.compiles
    assert not multiprocessing.active_children()  # the spare compiling process is gone with the plan


def test_an_error_in_the_compiling_process_is_raised_in_the_planner_as_it_is(tmp_path):
    """A configuration the step refuses (a batch the mesh does not divide) raises the same ValueError, naming the
    flag, as compiling it in the planner's own process would; nothing is cached for it."""
    _require_libtpu()
    # pylint: disable=import-outside-toplevel
    from bert_jax.aot import planner
    from bert_jax.aot.cache import ReportCache
    from bert_jax.aot.plan import Candidate
    from bert_jax.aot.pool import CompilerPool
    config = planner.configure(pretrain.get_config("size=tiny"), Candidate(4, 1, 1, "none", False), 1, 1)
    config.train.batch_size = 6
    cache = ReportCache(str(tmp_path))
    with CompilerPool() as pool, pytest.raises(ValueError, match="batch_size") as raised:
        planner.compile_report(config, TOPOLOGY, 1, cache, pool)
    with pytest.raises(ValueError) as directly:
        aot.compile_train_step(config, TOPOLOGY)
    assert str(raised.value) == str(directly.value)
    assert not os.listdir(tmp_path)
    assert not multiprocessing.active_children()


def test_collective_bytes_counts_combined_and_asynchronous_collectives():
    """The forms XLA:TPU prints: a combined all-reduce with a tuple result, a plain all-gather (and a copy of it in
    another fusion, same channel), an asynchronous all-gather start (operands, then results) and an all-reduce
    start (its result)."""
    hlo = "\n".join([
        "  %all-reduce.53 = (f32[128]{0:T(128)S(1)}, /*index=1*/f32[512,128]{1,0:T(8,128)}) all-reduce(%a, %b), x",
        "  %all-gather.7 = bf16[128,128]{1,0:T(8,128)(2,1)} all-gather(%p), channel_id=72",
        "  %all-gather.9 = bf16[128,128]{1,0:T(8,128)(2,1)} all-gather(%p.2), channel_id=72",  # a copy
        "  %all-gather-start = (bf16[64,128]{1,0}, bf16[128,128]{1,0}) all-gather-start(%q), channel_id=3",
        "  ROOT %all-reduce-start.2 = f32[16]{0} all-reduce-start(%r), channel_id=4",
        "  %add.1 = f32[] add(%all-reduce.53, %c)",
    ])
    assert aot.collective_bytes(hlo) == {"all-reduce": 4 * (128 + 512 * 128) + 4 * 16,
                                         "all-gather": 2 * 128 * 128 * 2}
