"""The TensorFlow exchange's part of the front-end contract (:mod:`hvdcompress.step.frontend`).

One object per step, inside the exchange's eager code (:mod:`.exchange`). Keys are positions in
the step's dense gradients; a completion group is one of the exchange's bundles (the tensors of
one grouped collective, or a fused bucket compressed as one), handed over whole with
:meth:`~hvdcompress.step.frontend.FrontEnd.ready`, so each bundle is launched as one group, as
Horovod's grouped allreduce does. The decoded averages are kept in :attr:`TapeSteps.totals`.

The clips: the tape clips ``clip_grad_norm`` in the graph, around the exchange (before it with a
compressor that carries state, after it otherwise: :meth:`GradientExchange._shared`), so here they
run only under the Adam take-over, whose clip changes from step to step (its compressed steps
clip each rank's gradient scaled by the last v-step's coefficient; its v-steps clip the mean).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from ..adam.settings import AdamSettings
from ..contract.compressor import TensorInfo
from ..engines.fusion import totals as fused_totals
from ..step.driver import Completion
from ..step.frontend import FrontEnd
from .gradients import clipped


class TapeSteps(FrontEnd):
    """One step of :class:`hvdcompress.tensorflow.exchange.GradientExchange` ``exchange`` over
    ``grads`` (dense), their ``params`` (variables or None), ``infos`` and ``bundles``
    (``(bucket or None, positions)``); ``settings``: the Keras Adam's, under the take-over."""

    def __init__(self, exchange: Any, grads: Sequence[Any], params: Sequence[Any], infos: Sequence[TensorInfo],
                 bundles: Sequence[tuple], settings: Optional[AdamSettings] = None):
        super().__init__(exchange.driver)
        self.grads, self.params, self.infos, self._settings = list(grads), params, infos, settings
        self.totals: list = [None] * len(grads)
        self._clip = exchange.core.clip_grad_norm if self.driver.adam is not None else None
        self._limit = exchange._local_limit
        self._bundles = [positions for _, positions in bundles]
        self._group = {i: b for b, positions in enumerate(self._bundles) for i in positions}
        self.buckets = {b: bucket for b, (bucket, _) in enumerate(bundles) if bucket is not None}
        self.driver.completion = Completion({b: len(positions) for b, positions in enumerate(self._bundles)})

    def run(self) -> bool:
        """The step's exchange: every bundle handed over in turn, then :meth:`wait`."""
        for positions in self._bundles:
            self.ready(positions)
        return self.wait()

    def name(self, i: int) -> str:
        return self.infos[i].name

    def gradient(self, i: int) -> tf.Tensor:
        return tf.reshape(self.grads[i], [-1])

    def info(self, i: int) -> TensorInfo:
        info = self.infos[i]
        if self.params[i] is not None:
            info.param = tf.reshape(tf.convert_to_tensor(self.params[i]), [-1])
        return info

    def settings(self, i: int) -> Optional[AdamSettings]:
        return self._settings

    def group(self, i: int) -> int:
        return self._group[i]

    def write(self, entry: Any) -> None:
        for i, total in fused_totals(self.driver.ops, entry):
            self.totals[i] = total

    def clip_local(self, keys: Sequence[int], scale: float) -> None:
        if self._clip is None:
            return   # clipped in the graph, before the exchange
        for i, g in zip(keys, clipped([self.grads[i] * scale for i in keys], self._limit())):
            self.grads[i] = g

    def clip_mean(self, keys: Sequence[int]) -> Optional[float]:
        if self._clip is None:
            return None   # clipped in the graph, after the exchange
        present = [i for i in keys if self.totals[i] is not None]
        kappa = self._clip / max(float(tf.linalg.global_norm([self.totals[i] for i in present])), self._clip)
        for i in present:
            self.totals[i] = self.totals[i] * kappa
        return kappa
