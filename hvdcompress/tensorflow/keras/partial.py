"""``PartialDistributedOptimizer``: Horovod's Keras optimizer for model parallelism, with
compression: the gradients of ``local_layers``' trainable weights stay this rank's own."""
from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd

from ..tape import local_layer_variables
from .optimizer import DistributedOptimizer


def PartialDistributedOptimizer(optimizer: Any, name: str = None, device_dense: str = "",
                                device_sparse: str = "", compression: Any = None,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op=hvd.Average,
                                groups=None, process_set=hvd.global_process_set,
                                local_layers: Any = None, scale_local_gradients: bool = True,
                                **kwargs: Any) -> Any:
    """Horovod's ``horovod.keras.PartialDistributedOptimizer`` (same arguments, in its order):
    a :func:`~hvdcompress.tensorflow.keras.DistributedOptimizer` (``**kwargs``: its others,
    ``backward_passes_per_step``, ``clip_grad_norm``, ``fusion``...) on which every trainable
    weight of ``local_layers`` (a Keras layer or a list of them) is registered with
    ``register_local_var``: its gradient is not exchanged, compressed, clipped or compared across
    ranks, and is divided by the number of ranks with ``scale_local_gradients=True`` (Horovod's
    default)."""
    variables = local_layer_variables(local_layers)
    opt = DistributedOptimizer(optimizer, name=name, device_dense=device_dense,
                               device_sparse=device_sparse, compression=compression,
                               sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op,
                               groups=groups, process_set=process_set,
                               scale_local_gradients=scale_local_gradients, **kwargs)
    for v in variables:
        opt.register_local_var(v)
    return opt
