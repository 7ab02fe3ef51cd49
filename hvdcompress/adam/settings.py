"""One param group's Adam hyper-parameters, as :class:`hvdcompress.adam.frozen.FrozenAdam` reads them at
every step: from a torch.optim.Adam/AdamW param group (:func:`adam_settings`), or built by the
TensorFlow front end from its optimizer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: the param-group keys of torch.optim.Adam/AdamW that the take-over refuses when set
UNSUPPORTED = {"amsgrad": False, "maximize": False}


@dataclass
class AdamSettings:
    """One param group's Adam hyper-parameters, read at every step."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float = 0.0
    decoupled: bool = False   # AdamW: w <- w·(1 - lr·λ); Adam: λ·w added to the gradient


def adam_settings(group: Mapping[str, Any], index: int = 0) -> AdamSettings:
    """:class:`AdamSettings` from a torch.optim.Adam/AdamW param group; ValueError naming the
    option for what the take-over does not run (amsgrad, maximize)."""
    for key, default in UNSUPPORTED.items():
        if group.get(key, default) != default:
            raise ValueError(f"param_groups[{index}] {key}={group[key]!r}: FrozenAdam runs Adam "
                             f"and AdamW with {key}={default!r} only")
    beta1, beta2 = (float(b) for b in group["betas"])
    return AdamSettings(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                        weight_decay=float(group.get("weight_decay", 0.0)),
                        decoupled=bool(group.get("decoupled_weight_decay", False)))
