"""A module-driven loader's copy, as pure shape arithmetic (torch is never imported): TensorRT-LLM's
`load_weight_shard` slices the checkpoint tensor by its *own* width (ceil(width / tp) per rank, a width of 1 not
split), `copy_weight` casts it to the parameter's dtype, silently, then `copy_`s it, which broadcasts; fused layers
`torch.cat` their shards along dim 0 first. The error texts are torch's (tests check them against torch itself).
"""

from __future__ import annotations

Shape = tuple[int, ...]
BROADCAST = "RuntimeError: The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension {dim}"
OUTPUT = "RuntimeError: output with shape {dst} doesn't match the broadcast shape {shape}"
CAT = ("RuntimeError: Sizes of tensors must match except in dimension 0. Expected {a} in dimension {dim} but got {b} for "
       "tensor number {i} in the list")


def rank_slice(shape: Shape, split_dim: int | None, tp: int, rank: int) -> Shape:
    """The part of a checkpoint tensor `load_weight_shard` gives `rank` (split_dim None: not split)."""
    if split_dim is None or tp <= 1 or (len(shape) == 1 and split_dim == 1) or split_dim >= len(shape):
        return shape
    width = shape[split_dim]
    if width == 1:
        return shape
    step = -(-width // tp)
    size = max(0, min((rank + 1) * step, width) - rank * step)
    return shape[:split_dim] + (size,) + shape[split_dim + 1:]


def copy_error(dst: Shape, src: Shape) -> str | None:
    """torch's error for `dst.copy_(src)` (None: it copies, broadcasting a size-1 or missing leading dim)."""
    ndim = max(len(dst), len(src))
    shape = []
    for i in range(ndim - 1, -1, -1):  # torch's infer_size walks from the last dim
        a = dst[i - ndim + len(dst)] if i - ndim + len(dst) >= 0 else 1
        b = src[i - ndim + len(src)] if i - ndim + len(src) >= 0 else 1
        if a != b and a != 1 and b != 1:
            return BROADCAST.format(a=a, b=b, dim=i)
        shape.append(b if a == 1 else a)
    shape = shape[::-1]
    if tuple(shape) != tuple(dst):
        return OUTPUT.format(dst=list(dst), shape=shape)
    return None


def cat_error(parts: list[Shape]) -> str | None:
    """torch's error for `torch.cat(parts)` along dim 0 (None: the shapes fit)."""
    first = parts[0]
    for i, shape in enumerate(parts[1:], start=1):
        for dim in range(1, len(first)):
            if len(shape) == len(first) and shape[dim] != first[dim]:
                return CAT.format(a=first[dim], b=shape[dim], dim=dim, i=i)
    return None


def cat_shape(parts: list[Shape]) -> Shape:
    return (sum(p[0] for p in parts),) + tuple(parts[0][1:])
