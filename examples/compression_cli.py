"""The command-line flags that choose the compression, shared by the PyTorch examples.

``--compression`` picks one of a few named setups (:data:`COMPRESSIONS`); ``--params`` takes any
compressor of the registry with its options, BytePS style (key=value, comma-separated; see
``hvdcompress.available()`` and ``hvdcompress.from_params``) and overrides ``--compression``.
"""
from __future__ import annotations

import argparse
from typing import Optional

import hvdcompress

COMPRESSIONS = {
    "dense": lambda a: None,
    "fp16": lambda a: hvdcompress.FP16(),
    "topk": lambda a: hvdcompress.ErrorFeedback(hvdcompress.TopK(1.0 - a.sparsity)),
    "dgc": lambda a: hvdcompress.DGC(a.sparsity, warmup=hvdcompress.ExponentialWarmup(a.warmup_epochs)
                                     if a.warmup_epochs else None),
}


def add_compression_arguments(parser: argparse.ArgumentParser, warmup_epochs: int = 4) -> None:
    """Add ``--compression``, ``--params``, ``--sparsity`` and ``--warmup-epochs`` to ``parser``."""
    parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="dgc")
    parser.add_argument("--params", default=None,
                        help="key=value,... for hvdcompress.from_params (overrides --compression)")
    parser.add_argument("--sparsity", type=float, default=0.999)
    parser.add_argument("--warmup-epochs", type=int, default=warmup_epochs,
                        help="DGC's exponential sparsity warm-up, in epochs (0: none)")


def compression_from_args(parser: argparse.ArgumentParser,
                          args: argparse.Namespace) -> Optional[hvdcompress.Compressor]:
    """The compressor the flags ask for (None: dense); with ``--params``, ``args.compression``
    becomes the compressor's name. A malformed ``--params`` exits through ``parser.error``."""
    if not args.params:
        return COMPRESSIONS[args.compression](args)
    pairs = [kv.split("=", 1) for kv in args.params.split(",")]
    if any(len(kv) != 2 for kv in pairs):
        parser.error(f"--params {args.params!r}: expected key=value pairs separated by commas")
    compression = hvdcompress.from_params(dict(pairs))
    args.compression = compression.name
    return compression
