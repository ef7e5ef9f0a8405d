"""What a chip can do per second, and how long a compiled step should take on it.

`CHIPS` holds one row per TPU generation, from Cloud TPU's system-architecture pages (docs.cloud.google.com/tpu/docs/
v4, v5e, v5p-training, v6e; read 2026-11): peak bf16 FLOP/s, HBM capacity and bandwidth, the bandwidth one chip
gets in an all-reduce over ICI (the pod's "all-reduce bandwidth" over its chips where the page gives it, else half
the chip's bidirectional ICI bandwidth, the same ratio as v5e's and v6e's) and its share of the data-centre network
(DCN). `estimate` turns what XLA reports for one chip's compiled program (FLOPs, bytes accessed, collective and DCN
bytes) into seconds per step: a roofline in two phases, plus the transfers. The traffic that does not grow with the
batch (`fixed_bytes`: the optimizer reading and writing the state, the weights read once) runs at HBM bandwidth on
its own, as the update follows the backward pass; the rest takes the larger of its compute and memory time. The
transfers are taken as not overlapped with compute, so the estimate leans towards too slow.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    peak_flops: float  # per second, bf16 matmuls on the MXUs
    hbm_gib: float
    hbm_bytes_per_s: float
    ici_bytes_per_s: float  # one chip's all-reduce bandwidth over ICI
    dcn_bytes_per_s: float  # one chip's share of the data-centre network
    source: str

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * (1 << 30))


CHIPS = {
    # All-reduce bandwidth per pod 1.1 PB/s over 4096 chips; no DCN figure is published: v5p's is assumed.
    "v4": Chip("v4", 275e12, 32, 1200e9, 1.1e15 / 4096, 50e9 / 8, "cloud.google.com/tpu/docs/v4"),
    # All-reduce 51.2 TB/s and DCN 6.4 Tbps per 256-chip pod.
    "v5e": Chip("v5e", 197e12, 16, 819e9, 51.2e12 / 256, 6.4e12 / 8 / 256, "cloud.google.com/tpu/docs/v5e"),
    # Bidirectional ICI 1200 GB/s per chip (half of it for an all-reduce), DCN 50 Gbps per chip.
    "v5p": Chip("v5p", 459e12, 95, 2765e9, 1200e9 / 2, 50e9 / 8, "cloud.google.com/tpu/docs/v5p-training"),
    # All-reduce 102.4 TB/s per 256-chip pod; no DCN figure is published: v5e's is assumed.
    "v6e": Chip("v6e", 918e12, 32, 1638e9, 102.4e12 / 256, 6.4e12 / 8 / 256, "cloud.google.com/tpu/docs/v6e"),
}


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Predicted seconds of one step on one chip, and what bounds it."""

    compute_s: float  # FLOPs / peak
    memory_s: float  # bytes accessed / HBM bandwidth
    fixed_memory_s: float  # the part of memory_s that does not grow with the batch
    ici_s: float  # collective bytes / all-reduce bandwidth
    dcn_s: float  # bytes to other slices / DCN bandwidth

    @property
    def on_chip_s(self) -> float:
        return self.fixed_memory_s + max(self.compute_s, self.memory_s - self.fixed_memory_s)

    @property
    def seconds(self) -> float:
        return self.on_chip_s + self.ici_s + self.dcn_s

    @property
    def bound(self) -> str:
        parts = {"compute": self.compute_s, "HBM": self.memory_s, "ICI": self.ici_s, "DCN": self.dcn_s}
        return max(parts, key=parts.get)


def estimate(chip: Chip, flops: float, bytes_accessed: float, collective_bytes: float = 0.0, dcn_bytes: float = 0.0,
             fixed_bytes: float = 0.0) -> Estimate:
    """The step time of one chip's program (all figures per chip and per step) on `chip`."""
    memory_s = bytes_accessed / chip.hbm_bytes_per_s
    return Estimate(compute_s=flops / chip.peak_flops, memory_s=memory_s,
                    fixed_memory_s=min(max(fixed_bytes, 0.0) / chip.hbm_bytes_per_s, memory_s),
                    ici_s=collective_bytes / chip.ici_bytes_per_s if collective_bytes else 0.0,
                    dcn_s=dcn_bytes / chip.dcn_bytes_per_s if dcn_bytes else 0.0)
