"""Local gradient sums over ``backward_passes_per_step`` passes for the Keras wrapper (Horovod's
aggregation helper)."""
from __future__ import annotations

import tensorflow as tf


class GradientAccumulator(tf.Module):
    """Local sums of gradients over ``passes`` backward passes (Horovod's aggregation helper,
    also reachable as ``opt._agg_helper``). ``counter``: the passes of the current cycle so far,
    0 after the pass that completes a step, as Horovod's."""

    def __init__(self, passes: int, average: bool):
        super().__init__(name=None)
        self.passes = passes
        self.average = average
        self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="passes")
        self.sums = []

    def add(self, grads: list) -> tf.Tensor:
        """Add ``grads``; True when this pass completes a step."""
        if not self.sums:
            with tf.init_scope():
                self.sums = [tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False,
                                         name="grad_sum") for g in grads]
        for s, g in zip(self.sums, grads):
            s.assign_add(g)
        return tf.equal(self.counter.assign((self.counter + 1) % self.passes), 0)

    def ready(self) -> tf.Tensor:
        """True when the last pass completed a step."""
        return tf.equal(self.counter, 0)

    def running(self) -> list:
        """The sums so far (what Horovod's compute_gradients returns between steps)."""
        return [s.read_value() for s in self.sums]

    def take(self) -> list:
        """The sums (or means) so far, and reset them."""
        out = [s.read_value() / self.passes if self.average else s.read_value() for s in self.sums]
        for s in self.sums:
            s.assign(tf.zeros_like(s))
        return out
