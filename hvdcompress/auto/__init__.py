"""``compression="auto"``: per tensor, the compressor and collective the cost model
(:mod:`hvdcompress.plan`) predicts fastest on this process set's link, from an allowed set.

    opt = hvc.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression="auto")                       # measure the link
    opt = hvc.DistributedOptimizer(..., compression="auto", link={"bandwidth": "10gbit", "latency": "50us"},
                                   auto_allowed=["none", "fp16", "int8", "onebit+ef"])
    hvdcompress.from_params({"compressor": "auto", "allowed": "none,fp16,int8", "link": "10gbit,50us"})

:mod:`.choice`: the per-tensor pick (pure); :mod:`.probe`: the link and the calibration, rank
0's for every rank; :mod:`.compressor`: :class:`Auto`, planning at the first exchange and
re-planning once; :mod:`.dispatch`: :class:`Dispatch`, each tensor to its pick. Importing this
package registers :class:`Auto` as ``"auto"`` (a planner: not in ``available()``). User guide:
docs/auto.md.
"""
from __future__ import annotations

from ..registry import AUTO, register
from .choice import CHOICES, SAFE, Choice, choose, parse_allowed, parse_link, predict_exchange
from .compressor import Auto
from .dispatch import Dispatch

register(Auto, planner=True)   # compressor="auto" in from_params and the front ends
from_arguments = Auto.from_arguments

__all__ = ["AUTO", "Auto", "CHOICES", "Choice", "Dispatch", "SAFE", "choose", "from_arguments",
           "parse_allowed", "parse_link", "predict_exchange"]
