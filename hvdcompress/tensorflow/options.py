"""The TensorFlow front ends' arguments: Horovod's TF keyword arguments and hvdcompress's shared
ones (:mod:`hvdcompress.step.options`, documented in :mod:`hvdcompress.step.arguments`), checked once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from ..step.options import Options, parse_options


@dataclass(frozen=True)
class ExchangeOptions:
    """The TF front end's arguments: the shared ones (:class:`hvdcompress.step.options.Options`,
    ``core``) and TensorFlow's own."""

    core: Options
    device_dense: str = ""
    device_sparse: str = ""
    process_set: Any = hvd.global_process_set
    scale_local: bool = True   # divide local gradients by the number of ranks (Horovod's default)


def loss_scale_optimizers() -> tuple:
    """The Keras loss scalers ``scaler=`` takes: Keras 2's ``LossScaleOptimizer`` (its
    ``get_unscaled_gradients`` unscales, its ``apply_gradients`` takes unscaled gradients)."""
    return (tf.keras.mixed_precision.LossScaleOptimizer,)


def is_loss_scale_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a Keras ``LossScaleOptimizer``."""
    return isinstance(optimizer, loss_scale_optimizers())


def exchange_options(compression: Any = None, device_dense: str = "", device_sparse: str = "",
                     process_set: Any = hvd.global_process_set, op: Any = hvd.Average,
                     scaler: Any = None, scale_local_gradients: bool = True,
                     **kwargs: Any) -> ExchangeOptions:
    """:class:`ExchangeOptions` from Horovod's keyword arguments and hvdcompress's, each checked
    once (:func:`hvdcompress.step.options.parse_options`; the deprecated ``num_groups`` folded into
    ``groups``, as Horovod does, with a DeprecationWarning)."""
    if is_loss_scale_optimizer(scaler) and not hasattr(scaler, "get_unscaled_gradients"):
        raise ValueError(f"scaler={scaler!r}: allowed: None or a Keras 2 "
                         "tf.keras.mixed_precision.LossScaleOptimizer (one with "
                         "get_unscaled_gradients; Keras 3's unscales inside apply_gradients, "
                         "which the tape's scaler= does not support yet)")
    for key, value in (("device_dense", device_dense), ("device_sparse", device_sparse)):
        if not isinstance(value, str):
            raise ValueError(f"{key}={value!r}: allowed: a device string such as '/cpu:0' or '' "
                             "(Horovod's default)")
    if not isinstance(scale_local_gradients, bool):
        raise ValueError(f"scale_local_gradients={scale_local_gradients!r}: allowed: True or False")
    if not isinstance(process_set, hvd.ProcessSet):
        raise ValueError(f"process_set={process_set!r}: allowed: a horovod ProcessSet "
                         "(default hvd.global_process_set)")
    core = parse_options(compression, op=op, average_op=hvd.Average, sum_op=hvd.Sum,
                         process_set=process_set, global_set=hvd.global_process_set,
                         scaler=scaler, scaler_types=loss_scale_optimizers(), **kwargs)
    return ExchangeOptions(core, device_dense, device_sparse, process_set, scale_local_gradients)


