"""The command-line flags that choose the compression, shared by the PyTorch examples.

``--compression`` picks one of a few named setups (:data:`COMPRESSIONS`); ``--params`` takes any
compressor of the registry with its options, BytePS style (key=value, comma-separated; see
``hvdcompress.available()`` and ``hvdcompress.from_params``) and overrides ``--compression``;
a list keeps its commas (``compressor=dgc,warmup_sparsities=0.75,0.9375,warmup_unit=epoch``).
"""
from __future__ import annotations

import argparse
from typing import Optional

import hvdcompress
from hvdcompress.registry import parse_params

COMPRESSIONS = {
    "dense": lambda a: None,
    "fp16": lambda a: hvdcompress.FP16(),
    "topk": lambda a: hvdcompress.ErrorFeedback(hvdcompress.TopK(1.0 - a.sparsity)),
    "dgc": lambda a: hvdcompress.from_params({"compressor": "dgc", "sparsity": a.sparsity,
                                              "warmup_epochs": a.warmup_epochs}),
}


def add_compression_arguments(parser: argparse.ArgumentParser, warmup_epochs: int = 4) -> None:
    """Add ``--compression``, ``--params``, ``--sparsity`` and ``--warmup-epochs`` to ``parser``."""
    parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="dgc")
    parser.add_argument("--params", default=None,
                        help="key=value,... for hvdcompress.from_params (overrides --compression)")
    parser.add_argument("--sparsity", type=float, default=0.999)
    parser.add_argument("--warmup-epochs", type=int, default=warmup_epochs,
                        help="DGC's exponential sparsity warm-up: epochs below the target "
                             "(from_params' warmup_epochs; 0: none)")


def compression_from_args(parser: argparse.ArgumentParser,
                          args: argparse.Namespace) -> Optional[hvdcompress.Compressor]:
    """The compressor the flags ask for (None: dense); with ``--params``, ``args.compression``
    becomes the compressor's name. A malformed ``--params`` exits through ``parser.error``."""
    if not args.params:
        return COMPRESSIONS[args.compression](args)
    try:
        params = parse_params(args.params)
    except ValueError as error:
        parser.error(f"--params: {error}")
    compression = hvdcompress.from_params(params)
    args.compression = compression.name
    return compression
