"""``DistributedGradientTape``: Horovod's tape with gradient compression.

    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = hvc.DistributedGradientTape(tape, compression=hvdcompress.DGC(0.999, momentum=0.9))
    grads = tape.gradient(loss, model.trainable_variables)   # averaged over ranks
    opt.apply_gradients(zip(grads, model.trainable_variables))

The tape has no optimizer to take momentum from: give a momentum-correcting compressor (DGC,
the Momentum decorator) its own ``momentum`` and use a plain SGD optimizer, or use
:func:`hvdcompress.tensorflow.keras.DistributedOptimizer`, which moves the optimizer's momentum
into the compressor. As in Horovod, the tape has no ``backward_passes_per_step``; accumulate with
the DistributedOptimizer. Compressor state is per compressor object (tapes are created every
step); checkpoint it with :func:`hvdcompress.tensorflow.compression_state`.

Model parallelism, as Horovod: ``tape.register_local_source(v)`` keeps ``v``'s gradient this
rank's own, :func:`PartialDistributedGradientTape` registers every trainable weight of its
``local_layers`` so, and ``tape.get_local_and_global_gradients(loss, sources)`` returns the
``(source, gradient)`` pairs split into the local ones and the exchanged ones.
"""
from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from ..step.arguments import documented
from ..step.options import check_unwrapped
from .exchange import GradientExchange, exchange_options
from .subclass import subclass_with


class _GraphSource:
    """A TF1 graph variable's shape and dtype, for the exchange (see ``_graph_source``)."""

    def __init__(self, variable):
        self.shape, self.dtype, self.variable = variable.shape, variable.dtype, variable


class _DistributedGradientTape:
    """Methods mixed into the wrapped tape's own class by :func:`DistributedGradientTape`."""

    total_bytes = property(lambda self: self.exchange.total_bytes,
                           doc="This rank's dense versus sent bytes since the compressor's first exchange (ByteCount).")
    last_step_bytes = property(lambda self: self.exchange.last_step_bytes,
                               doc="This rank's dense versus sent bytes of the last exchange (ByteCount).")

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The gradients of ``target``, compressed, exchanged and averaged over ranks."""
        grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                     unconnected_gradients)
        flat = tf.nest.flatten(sources)
        if not tf.compat.v1.executing_eagerly_outside_functions():
            flat = [self._graph_source(s) for s in flat]
        return tf.nest.pack_sequence_as(grads, self.exchange(tf.nest.flatten(grads), flat))

    def _graph_source(self, source):
        """TF1 graph mode (a ``Session``): ``source`` as the exchange may see it. Its
        ``tf.py_function`` runs eagerly and cannot read a graph's variables, so a variable is
        given as a :class:`_GraphSource` (shape and dtype, no value: no replica check or
        parameter-reading compressor on it), local if the variable is; named by position."""
        if not hasattr(source, "assign"):
            return source
        proxies = self.__dict__.setdefault("_hvdc_graph_sources", {})
        if id(source) not in proxies:
            proxies[id(source)] = _GraphSource(source)
            if id(source) in getattr(self, "_hvdc_local_ids", ()):
                self.exchange.register_local(proxies[id(source)])
        return proxies[id(source)]

    def register_local_source(self, source) -> None:
        """Keep ``source``'s gradient this rank's own: not averaged over ranks, divided by their
        number with ``scale_local_gradients=True`` (Horovod's API and default)."""
        self.exchange.register_local(source)
        self._hvdc_local_ids = getattr(self, "_hvdc_local_ids", frozenset()) | {id(source)}
        proxy = self.__dict__.get("_hvdc_graph_sources", {}).get(id(source))
        if proxy is not None:
            self.exchange.register_local(proxy)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Horovod's split of one :meth:`gradient` call: ``(local, global)``, each a list of
        ``(source, gradient)`` pairs in the order of ``sources`` (flattened); local: the sources
        registered with :meth:`register_local_source` (their gradients scaled as
        :meth:`gradient` returns them), global: the exchanged ones. Each call exchanges."""
        flat = tf.nest.flatten(sources)
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients, unconnected_gradients))
        local_ids = getattr(self, "_hvdc_local_ids", frozenset())
        local, shared = [], []
        for source, grad in zip(flat, grads):
            (local if id(source) in local_ids else shared).append((source, grad))
        return local, shared


@documented("compression", "clip_grad_norm", "collective", "intra_node", "check_replicas", "auto",
            "scaler", "fusion", "bytes")
def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = None,
                            sparse_as_dense: bool = False, op=hvd.Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups=None, process_set=hvd.global_process_set,
                            clip_grad_norm: float = None, collective: str = "auto",
                            intra_node: Any = None, ranks_per_node: int = None,
                            check_replicas: int = None, auto_allowed: Any = None,
                            link: Any = None, scaler: Any = None,
                            scale_local_gradients: bool = True,
                            fusion: Any = None) -> tf.GradientTape:
    """Wrap ``gradtape`` so that :meth:`gradient` returns gradients averaged over ranks.

    Arguments are those of ``horovod.tensorflow.DistributedGradientTape``; ``compression`` takes
    an hvdcompress compressor (default: none) or a dict for :func:`hvdcompress.from_params`.
    The returned tape is an instance of ``gradtape``'s class sharing its recording; its
    ``total_bytes`` / ``last_step_bytes``: dense vs sent bytes (the driver's, as on every front end).
    The tape is created every step, its exchange with it: build it with the same arguments on
    every rank; the compressor's state, counters, replica guard and ``auto``'s plan live with the
    compressor object (pass the same one to every step's tape). Two-level compression needs the
    process sets: ``hvd.init(process_sets=hvdcompress.tensorflow.node_process_sets())``.
    ``scaler=``: a Keras 2 ``LossScaleOptimizer``; ``gradient`` then returns unscaled gradients::

        with tf.GradientTape() as tape:
            scaled_loss = opt.get_scaled_loss(loss_fn(model(x), y))   # opt: LossScaleOptimizer
        tape = hvc.DistributedGradientTape(tape, compression=dgc, scaler=opt)
        grads = tape.gradient(scaled_loss, model.trainable_variables)  # unscaled, averaged
        opt.apply_gradients(zip(grads, model.trainable_variables))

    ``scale_local_gradients``: divide the gradients of the sources registered with
    :meth:`register_local_source` by the number of ranks (Horovod's default, True), or leave
    them as they are (False).
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"gradtape={gradtape!r}: allowed: a tf.GradientTape")
    check_unwrapped("hvdcompress.tensorflow.DistributedGradientTape", "gradtape", gradtape)
    options = exchange_options(compression, device_dense=device_dense, device_sparse=device_sparse,
                               sparse_as_dense=sparse_as_dense, op=op,
                               gradient_predivide_factor=gradient_predivide_factor,
                               num_groups=num_groups, groups=groups, process_set=process_set,
                               clip_grad_norm=clip_grad_norm, collective=collective,
                               intra_node=intra_node, ranks_per_node=ranks_per_node,
                               check_replicas=check_replicas, auto_allowed=auto_allowed, link=link,
                               scaler=scaler, scale_local_gradients=scale_local_gradients, fusion=fusion)
    cls = subclass_with(gradtape.__class__, _DistributedGradientTape)
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape.exchange = GradientExchange(options)
    return tape


def local_layer_variables(local_layers: Any) -> list:
    """The trainable weights of ``local_layers`` (None, a Keras layer, or a list of layers), each
    once, in order: what Horovod's ``PartialDistributedGradientTape`` and
    ``PartialDistributedOptimizer`` register as local."""
    layer = tf.keras.layers.Layer
    if local_layers is None:
        layers = []
    elif isinstance(local_layers, layer):
        layers = [local_layers]
    elif isinstance(local_layers, (list, tuple)) and all(isinstance(x, layer) for x in local_layers):
        layers = list(local_layers)
    else:
        raise ValueError(f"local_layers={local_layers!r}: allowed: None, a tf.keras.layers.Layer "
                         "or a list of them")
    seen, out = set(), []
    for v in (v for x in layers for v in x.trainable_weights):
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression: Any = None,
                                   sparse_as_dense: bool = False, op=hvd.Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups=None, process_set=hvd.global_process_set,
                                   local_layers: Any = None, scale_local_gradients: bool = True,
                                   **kwargs: Any) -> tf.GradientTape:
    """Horovod's ``PartialDistributedGradientTape``: a :func:`DistributedGradientTape` (same
    arguments, in Horovod's order; ``**kwargs``: our others, ``clip_grad_norm``, ``collective``,
    ``scaler``, ``fusion``...) whose ``local_layers`` (a Keras layer or a list of them) keep
    their trainable weights' gradients this rank's own (:meth:`register_local_source`): not
    exchanged, compressed, clipped or compared across ranks, and divided by the number of ranks
    with ``scale_local_gradients=True`` (Horovod's default). Model parallelism: e.g. an
    embedding sharded over the ranks."""
    variables = local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor,
                                   num_groups=num_groups, groups=groups, process_set=process_set,
                                   scale_local_gradients=scale_local_gradients, **kwargs)
    for v in variables:
        tape.register_local_source(v)
    return tape
