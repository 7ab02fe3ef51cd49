"""Compressor state held in ``tf.Variable`` objects, so ``tf.train.Checkpoint`` (and Keras's
TF-format checkpoints) capture and restore it.

* :class:`VariableState`: one tensor's state dict (residual, momentum, velocity, step counter)
  as the core sees it: a mapping whose tensor entries are variables (written with ``assign``)
  and whose Python-number entries (random-k's ``step``) are mirrored in 0-d variables.
* :class:`CompressionState`: everything a compressor keeps: the per-tensor states, keyed by
  tensor name, and the compressor-wide :meth:`~hvdcompress.Compressor.state_dict` (DGC's step
  and epoch counters). One per compressor object, from :func:`compression_state`, because
  Horovod-style tapes are created anew every step while the state must live on.

At another world size (a checkpoint resumed at P' ranks, an elastic reset) the per-rank state
is gathered and laid out again by :mod:`hvdcompress.tensorflow.resume`; the state carries what
that needs between the load and the next exchange (:attr:`CompressionState.loaded`,
:attr:`CompressionState.generation`).
"""
from __future__ import annotations

import re
import weakref
from collections.abc import MutableMapping
from typing import Any, Iterator, Mapping, Optional

import numpy as np
import tensorflow as tf

from ..contract.compressor import Compressor

_PYTHON_DTYPES = {bool: tf.bool, int: tf.int64, float: tf.float64}


def _variable(value: Any, name: str) -> tf.Variable:
    """A non-trainable variable created outside any ``tf.function`` being traced; a Python
    number gets the dtype of :data:`_PYTHON_DTYPES`."""
    with tf.init_scope():
        if type(value) in _PYTHON_DTYPES:
            value = tf.constant(value, _PYTHON_DTYPES[type(value)])
        return tf.Variable(value, trainable=False, name=re.sub(r"[^A-Za-z0-9_.\-/]", "_", name))


class VariableState(tf.Module, MutableMapping):
    """One tensor's compressor state; every entry is backed by a ``tf.Variable``."""

    def __init__(self, name: str):
        super().__init__(name=None)
        self.label = name
        self.slots = {}
        self._python_types = {}

    def __getitem__(self, key: str) -> Any:
        var = self.slots[key]
        kind = self._python_types.get(key)
        return var if kind is None else kind(var.numpy())

    def __setitem__(self, key: str, value: Any) -> None:
        kind = type(value) if type(value) in _PYTHON_DTYPES else None
        if key in self.slots:
            self.slots[key].assign(value)
            return
        if kind is not None:
            self._python_types[key] = kind
        self.slots[key] = _variable(value, f"{self.label}/{key}")

    def __delitem__(self, key: str) -> None:
        del self.slots[key]
        self._python_types.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.slots))

    def __len__(self) -> int:
        return len(self.slots)

    def replace(self, values: Mapping[str, Any]) -> None:
        """Make the state exactly ``values`` (numpy arrays and Python numbers): entries not in it
        are dropped, variables of the same shape and dtype are assigned, others made anew."""
        for key in [k for k in self.slots if k not in values]:
            del self[key]
        for key, value in values.items():
            var = self.slots.get(key)
            if isinstance(value, np.ndarray):
                if var is None or key in self._python_types or tuple(var.shape) != value.shape \
                        or var.dtype.as_numpy_dtype != value.dtype:
                    self.pop(key, None)
                    self.slots[key] = _variable(tf.constant(value), f"{self.label}/{key}")
                else:
                    var.assign(value)
            else:
                if var is not None and self._python_types.get(key) is not type(value):
                    del self[key]
                self[key] = value


class Loaded:
    """A gathered compressor state loaded but not yet laid out (a plain object: not tracked by
    checkpoints). ``saved``: the gathered dict; ``left``: the tensor names still to lay out."""

    def __init__(self, saved: dict):
        self.saved = saved
        self.left = {name for per_rank in saved["ranks"] for name in per_rank}


class CompressionState(tf.Module):
    """All state of one compressor: per-tensor :class:`VariableState` and compressor-wide counters.

    Per-tensor states are checkpointed by position (order of first use), as Keras checkpoints
    optimizer slots: Keras names layers by creation order within a process, so a model rebuilt
    in the same process has other variable names but the same order.

    The compressor object runs the algorithm in Python; its counters (``state_dict()``) are
    mirrored here after every step (:meth:`push`). Before a step, :meth:`pull` loads them back
    into the compressor when the variables no longer hold what was pushed last, i.e. after a
    checkpoint restore; changes made directly on the compressor (``set_epoch`` from a warm-up
    callback) are kept otherwise.
    """

    def __init__(self, compressor: Compressor):
        super().__init__(name=None)
        self.compressor = compressor
        self.per_tensor = []
        self._positions = {}
        initial = compressor.state_dict()
        for key, value in initial.items():
            if type(value) not in _PYTHON_DTYPES:
                raise TypeError(f"{type(compressor).__name__}.state_dict()[{key!r}] = {value!r}: "
                                "the TensorFlow wrapper checkpoints bool, int and float values "
                                "only")
        self.counters = {k: _variable(v, f"compressor/{k}") for k, v in initial.items()}
        self._pushed = dict(initial)
        #: a gathered state to lay out at the next exchange (hvdcompress.tensorflow.resume)
        self.loaded: Optional[Loaded] = None
        #: bumped by an elastic reset: exchanges built before it rebuild for the new world
        self.generation = 0
        #: the process set and op of the last exchange built on this state (for gathering)
        self.process_set: Any = None
        self.average: Optional[bool] = None

    def __contains__(self, name: str) -> bool:
        return name in self._positions

    def tensor(self, name: str) -> VariableState:
        """The state of tensor ``name`` (created empty on first use)."""
        if name not in self._positions:
            self._positions[name] = len(self.per_tensor)
            self.per_tensor.append(VariableState(name))
        return self.per_tensor[self._positions[name]]

    def named(self) -> dict:
        """Tensor name -> its :class:`VariableState`."""
        return {name: self.per_tensor[i] for name, i in self._positions.items()}

    def pull(self) -> None:
        """Load the counters into the compressor if a restore changed them since :meth:`push`."""
        stored = {k: type(self._pushed[k])(v.numpy()) for k, v in self.counters.items()}
        if stored != self._pushed:
            self.compressor.load_state_dict(stored)
            self._pushed = stored

    def push(self) -> None:
        """Write the compressor's counters into the variables."""
        current = self.compressor.state_dict()
        for key, value in current.items():
            self.counters[key].assign(value)
        self._pushed = dict(current)


_STATES: "weakref.WeakKeyDictionary[Compressor, CompressionState]" = weakref.WeakKeyDictionary()


def compression_state(compressor: Compressor) -> CompressionState:
    """The :class:`CompressionState` of ``compressor`` (one per compressor object).

    Put it in your checkpoint when you use the tape::

        ckpt = tf.train.Checkpoint(model=model, optimizer=opt,
                                   compression=hvc.compression_state(dgc))
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compression_state: compressor={compressor!r} is not an hvdcompress "
                        "Compressor")
    if compressor not in _STATES:
        _STATES[compressor] = CompressionState(compressor)
    return _STATES[compressor]
