"""What the Keras wrapper reads off the optimizer it wraps: the Keras classes by name (Keras 2's
legacy twins included), SGD's momentum moved into a compressor that takes it over, FrozenAdam's
Adam/AdamW settings read at each step, and the warning for Keras's own clipping after the
exchange (:mod:`hvdcompress.tensorflow.keras.optimizer`)."""
from __future__ import annotations

import warnings
from typing import Any

import tensorflow as tf

from ...adam.settings import AdamSettings
from ...contract.compressor import Compressor
from ...step.clipping import state_carrier, what_it_keeps


def keras_classes(name: str) -> tuple:
    """``tf.keras.optimizers.<name>`` and, where Keras 2 has it, its legacy twin."""
    legacy = getattr(tf.keras.optimizers, "legacy", None)
    return (getattr(tf.keras.optimizers, name),) + \
        ((getattr(legacy, name),) if hasattr(legacy, name) else ())


def take_over_momentum(compressor: Compressor, optimizer: Any, config: dict) -> tuple:
    """(momentum, nesterov) moved from an SGD's ``config`` into the compressor's hands."""
    if not compressor.takes_over_momentum or not isinstance(optimizer, keras_classes("SGD")):
        return 0.0, False
    momentum, nesterov = config.get("momentum", 0.0), bool(config.get("nesterov", False))
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise ValueError(f"SGD momentum={momentum!r}: {compressor.name} takes the momentum over "
                         "and needs a constant number")
    explicit = compressor.explicit_momentum
    if explicit is not None and momentum:
        raise ValueError(f"SGD momentum={momentum!r} and the compressor's momentum={explicit!r}: "
                         "momentum would be applied twice; set one of them to 0 (or leave the "
                         "compressor's at None to take the optimizer's)")
    config.update(momentum=0.0, nesterov=False)
    return float(momentum), nesterov


def warn_keras_clipping(compressor: Compressor, intra_node: Any, config: dict) -> None:
    """Keras clips inside ``apply_gradients``, after the exchange: with a compressor that
    carries state (or a two-level ``intra_node`` one that does) that clips the exchanged
    update, not the gradient. Warn, naming the fix."""
    used = [k for k in ("clipnorm", "global_clipnorm", "clipvalue") if config.get(k) is not None]
    carrier = state_carrier(compressor, intra_node)
    if used and carrier is not None:
        warnings.warn(f"the wrapped optimizer has {used[0]}={config[used[0]]!r}: Keras clips after "
                      f"the exchange, and with {carrier.name}, which {what_it_keeps(carrier)}, "
                      "that clips the exchanged update, not the gradient (a different "
                      "algorithm). To clip gradients, pass clip_grad_norm=... to "
                      "hvdcompress.tensorflow.keras.DistributedOptimizer instead.", stacklevel=3)


def adam_settings(optimizer: Any, compressor: Compressor, config: dict):
    """For :class:`~hvdcompress.adam.frozen.FrozenAdam`: check that ``optimizer`` is a Keras Adam or
    AdamW it can run, and return the callable that reads its settings at each step (the
    learning rate may be a schedule). Keras's weight decay is decoupled (AdamW's)."""
    if not compressor.takes_over_adam:
        return None
    if not isinstance(optimizer, keras_classes("Adam") + keras_classes("AdamW")):
        raise ValueError(f"compression={compressor!r} takes over Adam's step, but the optimizer is "
                         f"{type(optimizer).__name__}; allowed: a Keras Adam or AdamW")
    if config.get("amsgrad"):
        raise ValueError("amsgrad=True: FrozenAdam runs Adam and AdamW with amsgrad=False only")
    fixed = {"beta1": float(config["beta_1"]), "beta2": float(config["beta_2"]),
             "eps": float(config["epsilon"]), "weight_decay": float(config.get("weight_decay") or 0.0)}

    def settings() -> AdamSettings:
        lr = optimizer.learning_rate
        if callable(lr) and not isinstance(lr, tf.Variable):
            lr = lr(optimizer.iterations)
        return AdamSettings(lr=float(tf.convert_to_tensor(lr)), decoupled=True, **fixed)
    return settings
