"""Broadcast of variables from one rank, on Horovod's ``broadcast`` op only.

Horovod's own ``broadcast_variables`` and Keras callbacks need TF variables with ``ref()``;
Keras 3 variables have none, so this works on anything with ``assign`` that converts to a
tensor (tf.Variable, Keras 2 and Keras 3 variables).
"""
from __future__ import annotations

from typing import Any, Iterable

import horovod.tensorflow as hvd
import tensorflow as tf


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0,
                        process_set=hvd.global_process_set) -> None:
    """Assign every rank's ``variables`` the values they have on ``root_rank``."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) \
            or not 0 <= root_rank < process_set.size():
        raise ValueError(f"root_rank={root_rank!r}: allowed: an integer in [0, "
                         f"{process_set.size() - 1}]")
    for i, var in enumerate(variables):
        var.assign(hvd.broadcast(tf.convert_to_tensor(var), root_rank,
                                 name=f"hvdc.broadcast.{i}", process_set=process_set))


def optimizer_variables(optimizer: Any) -> list:
    """A Keras optimizer's variables (a property in Keras 3 and the new Keras 2 optimizers, a
    method in Keras 2's legacy ones)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)
