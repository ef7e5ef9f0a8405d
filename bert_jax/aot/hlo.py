"""What the compiled program's HLO text says that XLA's analyses do not: loops, collectives, transfers between
slices."""

import re

import numpy as np

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8, "u64": 8}
# A transfer between slices in a multi-slice program: a host-transfer `send` handed to the MegaScale runtime, e.g.
#   %send = (f32[1,1,128]{...}, u32[], token[]) send(...), ..., _xla_megascale_transfer_type="ALL_REDUCE"}
_DCN_SEND = re.compile(r"= \((\w+)\[([\d,]*)\][^\n]*?\) send\([^\n]*?_xla_megascale_transfer_type=\"(\w+)\"")


def _shape_bytes(dtype: str, dims: str) -> int:
    """Bytes of an HLO array shape such as f32[8,128] (dtype "f32", dims "8,128")."""
    return int(np.prod([int(dim) for dim in dims.split(",") if dim])) * _DTYPE_BYTES[dtype]


def dcn_transfers(hlo_text: str) -> dict[str, int]:
    """Bytes one chip sends to other slices per step, by transfer type (ALL_REDUCE, ONE_TO_ONE, ...), read from
    the compiled multi-slice program; empty for one slice."""
    transfers: dict[str, int] = {}
    for dtype, dims, kind in _DCN_SEND.findall(hlo_text):
        transfers[kind] = transfers.get(kind, 0) + _shape_bytes(dtype, dims)
    return transfers


_COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%\S+ = (.*?) (all-gather|all-reduce|reduce-scatter|all-to-all|"
                         r"collective-permute)(-start)?\(([^\n]*)", re.MULTILINE)
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_SHAPE = re.compile(r"\b(\w+)\[([\d,]*)\]")


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """The result sizes of the collectives in a compiled program (one chip's), by kind: what the step moves over
    the chips' links, to within the algorithm's factor (an all-gather's result is the gathered array, an all-reduce
    sends about twice its size). XLA combines small collectives into one with a tuple result, whose elements all
    count; an asynchronous start's tuple holds its operands, then its results. XLA:TPU copies one collective into
    several fusions (its async and pipelined forms), so each channel counts once. A collective in a while-loop
    body counts once, like XLA's FLOPs."""
    totals: dict[str, int] = {}
    channels = set()
    for result, kind, start, rest in _COLLECTIVE.findall(hlo_text):
        channel = _CHANNEL.search(rest)
        if channel:
            if channel.group(1) in channels:
                continue
            channels.add(channel.group(1))
        shapes = [(dtype, dims) for dtype, dims in _SHAPE.findall(result) if dtype in _DTYPE_BYTES]
        if start and kind != "all-reduce" and len(shapes) > 1:
            shapes = shapes[len(shapes) // 2:]
        totals[kind] = totals.get(kind, 0) + sum(_shape_bytes(dtype, dims) for dtype, dims in shapes)
    return totals




def while_loops(hlo_text: str) -> int:
    """While loops in the program: each body's FLOPs are counted once by XLA's cost analysis, not per trip."""
    return len(re.findall(r"\bwhile\(", hlo_text))
