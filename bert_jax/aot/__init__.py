"""Ahead-of-time compilation of the real train step for a Cloud TPU slice, on any machine (a laptop CPU included).

`python -m bert_jax.aot --config=configs/pretrain.py:size=large --topology=v5p:4x4x4,v5e:16x16` (add
`--config.mesh.data=1 --config.mesh.fsdp=-1` for FSDP, or any other --config override) needs only the `aot`
extra (`pip install -e '.[aot]'`: libtpu, whose compiler XLA runs here without a TPU). The step is
`bert_jax.steps.make_train_step` with the config's model, optimizer, mesh, logical rules and batch, jitted with
the same shardings and donation as the training loop and compiled for the topology's devices. The table gives,
per chip, the memory XLA assigned (state and batch arguments, outputs, temporaries, code) against the chip's HBM,
and the compiled step's FLOPs next to the model's matmul FLOPs: whether a run fits, and how the compiled work
compares with the model's, before any TPU is booked. A step too large for the chip is refused by XLA:TPU itself
(RESOURCE_EXHAUSTED); the table then says NO with XLA's figures instead of failing. The model is traced for the
TPU (`model.compiling_for`), so `model.attention=auto`/`pallas` compiles the Pallas splash kernel, as the run on
the TPU itself would.

`--num_slices=N` compiles for N such slices joined by the data-centre network: data parallel across them
(`mesh.dcn_data`), the config's mesh inside each.

Topologies are `CHIP:AxB[xC]` chip grids as Cloud TPU names them (v4:2x2x4 is the v4-32 accelerator type, 16
chips; v5p:4x4x4 is v5p-128, 64 chips; v5e:16x16 is v5litepod-256). One JAX device per chip, as on the TPU VMs
(v4 and v5p run their two TensorCores as one megacore device).
"""

# The package face: the names callers use, from the modules that own them (compiling, hlo, report); the planner is
# bert_jax.aot.planner, the command line bert_jax.aot.__main__.
from bert_jax.aot.compiling import LibtpuMissingError, compile_train_step, topology_devices
from bert_jax.aot.hlo import collective_bytes, dcn_transfers
from bert_jax.aot.report import GIB, HBM_GIB_PER_CHIP, AotReport, fits_verdict, format_reports

__all__ = ["GIB", "HBM_GIB_PER_CHIP", "AotReport", "LibtpuMissingError", "collective_bytes", "compile_train_step",
           "dcn_transfers", "fits_verdict", "format_reports", "topology_devices"]
