"""Keras callbacks: sparsity warm-up, and the initial-state broadcast for Keras 3.

:class:`SparsityWarmupCallback` drives the warm-up of a sparsifying compressor (DGC) with a
schedule from :mod:`hvdcompress.contract.schedule`: :class:`~hvdcompress.ExponentialWarmup` (density
shrinks geometrically to the target) or :class:`~hvdcompress.ListWarmup` (an explicit list with
a begin and a ramp length), counted in epochs or optimizer steps (the schedule's ``unit``). It
writes the sparsity in force into the epoch logs (``logs["sparsity"]``), so History, CSVLogger
and TensorBoard record it. The sparsity is read by the compressor at run time, so changing it
never retraces the training function.

:class:`BroadcastGlobalVariablesCallback` is Horovod's callback rebuilt on the broadcast op, for
Keras 3 (Horovod's own one keeps working beside these callbacks on Keras 2).
"""
from __future__ import annotations

from typing import Any, Optional

import horovod.tensorflow as hvd
import tensorflow as tf

from ...contract.compressor import Compressor
from ...contract.schedule import Schedule
from ..broadcast import broadcast_variables, optimizer_variables


def _sparsifier(target: Any) -> Any:
    """The compressor with a sparsity warm-up inside ``target`` (an optimizer or compressor)."""
    exchange = getattr(target, "_hvdc_exchange", None)
    compressor = exchange.compressor if exchange is not None else target
    if not isinstance(compressor, Compressor):
        raise TypeError(f"SparsityWarmupCallback: {target!r} is neither an hvdcompress compressor "
                        "nor an optimizer wrapped by "
                        "hvdcompress.tensorflow.keras.DistributedOptimizer")
    algorithm = compressor.unwrap()
    if not algorithm.supports_warmup:
        raise ValueError(f"SparsityWarmupCallback: compressor {compressor!r} has no sparsity "
                         "warm-up; allowed: DGC or CSC")
    return algorithm


class SparsityWarmupCallback(tf.keras.callbacks.Callback):
    """Ramp the sparsity of ``compression`` (a DGC, or a DistributedOptimizer holding one).

    ``schedule``: an ExponentialWarmup or ListWarmup; installed as the compressor's warm-up.
    None keeps the compressor's own (``DGC(..., warmup=...)``), which must then exist.
    ``verbose``: print the sparsity at the start of every epoch on rank 0.
    """

    def __init__(self, compression: Any, schedule: Optional[Schedule] = None, verbose: int = 0):
        super().__init__()
        self.compressor = _sparsifier(compression)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise ValueError(f"SparsityWarmupCallback: schedule={schedule!r} is not a schedule; "
                             "allowed: None, ExponentialWarmup(...) or ListWarmup(...)")
        if schedule is None and self.compressor.warmup is None:
            raise ValueError("SparsityWarmupCallback: schedule=None and the compressor has no "
                             "warmup; allowed: ExponentialWarmup(...) or ListWarmup(...)")
        if schedule is not None:
            self.compressor.warmup = schedule
        self.verbose = verbose

    @property
    def sparsity(self) -> float:
        """The sparsity in force now."""
        return self.compressor.current_sparsity

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.compressor.set_epoch(epoch)
        if self.verbose and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: sparsity {self.sparsity:.6g}")

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if logs is not None:
            logs["sparsity"] = self.sparsity


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Start every rank from ``root_rank``'s state: the model's variables when training begins
    (once the model is built), the optimizer's after the first batch (they exist by then)."""

    def __init__(self, root_rank: int = 0, process_set=hvd.global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self._model_done = False
        self._done = False

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if self.model.built and not self._model_done:
            broadcast_variables(self.model.variables, self.root_rank, self.process_set)
            self._model_done = True

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if self._done:
            return
        variables = [] if self._model_done else list(self.model.variables)
        broadcast_variables(variables + optimizer_variables(self.model.optimizer),
                            self.root_rank, self.process_set)
        self._model_done = self._done = True
