"""What the model needs to know of the user's model: its gradients' shapes and when each is
ready during the backward pass, the backward's end and the optimizer's time.

* :func:`from_sizes`: from a list of sizes (no model at hand). The list is in forward order (as
  ``named_parameters`` lists them); the backward pass produces the gradients in reverse order.
  With ``compute_s`` the forward and backward time of one step, the forward takes a third and
  the backward two thirds (backward ≈ 2 × forward FLOPs), and a gradient is ready when the
  backward has done the share of the parameters from the last layer down to it (time
  proportional to parameter count: a rough rule, convolutions break it). ``compute_s = 0``: every
  gradient is ready at once, nothing overlaps.
* :func:`trace_torch`: one warm-up and one traced step of a torch model on a random input: a
  post-accumulate-grad hook per parameter records when its gradient is ready (synchronising
  the GPU in each hook, so the trace runs a little slower than training); then one SGD step
  times the optimizer.
* :func:`fused`: a profile as ``fusion=`` exchanges it (buckets instead of their tensors).
* :func:`trace_keras`: TensorFlow computes every gradient before Horovod exchanges them
  (DistributedGradientTape), so all are ready when the tape's gradient returns.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class TensorProfile:
    """One gradient: ``name``, ``shape`` and ``ready_s`` (seconds after the step's start);
    ``members``: the tensors of a fused bucket (:func:`fused`), 1 for a tensor."""

    name: str
    shape: tuple
    ready_s: float
    members: int = 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelProfile:
    """The gradients in the order they become ready (ties by name), ``backward_s`` (the end of
    forward and backward) and ``optimizer_s`` (the wrapped optimizer's step)."""

    tensors: tuple
    backward_s: float = 0.0
    optimizer_s: float = 0.0

    def __post_init__(self) -> None:
        order = tuple(sorted(self.tensors, key=lambda t: (t.ready_s, t.name)))
        object.__setattr__(self, "tensors", order)

    @property
    def compute_s(self) -> float:
        """One rank's step without communication: the floor of every prediction."""
        return self.backward_s + self.optimizer_s

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)


Size = Union[int, Sequence[int]]


def from_sizes(sizes: Sequence[Size], compute_s: float = 0.0, optimizer_s: float = 0.0) -> ModelProfile:
    """A profile from sizes in forward order: each an element count or a shape (see the module
    doc for the ready times). Tensors are named ``t0``, ``t1``, ... in list order."""
    shapes = [(int(s),) if isinstance(s, (int, float)) else tuple(int(d) for d in s) for s in sizes]
    for shape in shapes:
        if not shape or min(shape) < 1:
            raise ValueError(f"sizes: {shape!r} is not a tensor size; allowed: a positive element "
                             "count or a list of positive dimensions")
    total = sum(math.prod(s) for s in shapes) or 1
    forward = compute_s * (1 - BACKWARD_SHARE)
    tensors, done = [], 0
    for index in reversed(range(len(shapes))):
        done += math.prod(shapes[index])
        tensors.append(TensorProfile(f"t{index}", shapes[index], forward + (compute_s - forward) * done / total))
    return ModelProfile(tuple(tensors), compute_s, optimizer_s)


def fused(profile: ModelProfile, threshold_bytes: int, itemsize: int = 4) -> ModelProfile:
    """``profile`` as the wrappers exchange it with ``fusion=threshold_bytes``
    (:mod:`hvdcompress.engines.fusion`): each bucket of consecutive names one flat tensor, ready when its
    last member is; the others as they are. Collectives and codec calls then count buckets."""
    from ..engines.fusion import buckets

    cut = buckets([(t.name, t.numel, t.numel * itemsize, None) for t in profile.tensors], threshold_bytes)
    member = {m: b for b in cut for m in b.members}
    ready = {b.name: max(t.ready_s for t in profile.tensors if t.name in b.members) for b in cut}
    tensors = [t for t in profile.tensors if t.name not in member] + \
        [TensorProfile(b.name, (b.numel,), ready[b.name], len(b.members)) for b in cut]
    return ModelProfile(tuple(tensors), profile.backward_s, profile.optimizer_s)


def trace_torch(model: Any, input_shape: Sequence[int], input_dtype: str = "float32",
                device: Optional[str] = None) -> ModelProfile:
    """Trace one step of a ``torch.nn.Module`` on a random input (zeros for integer inputs:
    a valid index for any embedding); the loss is the sum of the output's elements."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    dtype = getattr(torch, input_dtype)
    batch = torch.zeros(tuple(input_shape), dtype=dtype, device=device) if not dtype.is_floating_point \
        else torch.randn(tuple(input_shape), dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    ready: dict = {}
    start = [0.0]

    def hook_for(name: str):
        def hook(_param: Any) -> None:
            sync()
            ready[name] = time.perf_counter() - start[0]
        return hook

    def step() -> float:
        model.zero_grad(set_to_none=True)
        sync()
        start[0] = time.perf_counter()
        output = model(batch)
        output = output[0] if isinstance(output, (tuple, list)) else output
        output.float().sum().backward()
        sync()
        return time.perf_counter() - start[0]

    handles = [p.register_post_accumulate_grad_hook(hook_for(n)) for n, p in named]
    try:
        step()              # warm-up (allocations, kernel selection)
        backward_s = step()
    finally:
        for handle in handles:
            handle.remove()
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.0, momentum=0.9)
    optimizer.step()
    sync()
    begin = time.perf_counter()
    optimizer.step()
    sync()
    optimizer_s = time.perf_counter() - begin
    tensors = tuple(TensorProfile(n, tuple(p.shape) or (1,), ready.get(n, backward_s)) for n, p in named)
    return ModelProfile(tensors, backward_s, optimizer_s)


def trace_keras(model: Any, input_shape: Sequence[int]) -> ModelProfile:
    """Time one gradient computation of a Keras model on a random input (after a warm-up);
    every gradient is ready at its end."""
    import tensorflow as tf

    batch = tf.random.normal(tuple(input_shape))

    def step() -> float:
        begin = time.perf_counter()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(model(batch), tf.float32))
        grads = tape.gradient(loss, model.trainable_variables)
        _ = [g.numpy() for g in grads if g is not None][:1]
        return time.perf_counter() - begin

    step()
    backward_s = step()
    tensors = tuple(TensorProfile(v.name, tuple(v.shape) or (1,), backward_s)
                    for v in model.trainable_variables)
    return ModelProfile(tensors, backward_s, 0.0)
