"""The command-line flags that choose the compression, shared by the PyTorch examples.

``--compression`` picks one of a few named setups (:data:`COMPRESSIONS`); ``--params`` takes any
compressor of the registry with its options, BytePS style (key=value, comma-separated; see
``hvdcompress.available()`` and ``hvdcompress.from_params``) and overrides ``--compression``;
a list keeps its commas (``compressor=dgc,warmup_sparsities=0.75,0.9375,warmup_unit=epoch``).
``--intra-node`` turns on two-level compression (:mod:`hvdcompress.engines.two_level`): the gradients
are reduced inside each node with that mild compressor (``none``: full precision) and only the
node's shards cross nodes with the compressor above; ``--ranks-per-node`` emulates nodes on one
machine (e.g. 2 with ``horovodrun -np 4``). :func:`init_horovod` registers the process sets it needs.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

import hvdcompress
from hvdcompress.registry import parse_params
from hvdcompress.transport.process_sets import node_process_sets

COMPRESSIONS = {
    "dense": lambda a: None,
    "fp16": lambda a: hvdcompress.FP16(),
    "topk": lambda a: hvdcompress.ErrorFeedback(hvdcompress.TopK(1.0 - a.sparsity)),
    "dgc": lambda a: hvdcompress.from_params({"compressor": "dgc", "sparsity": a.sparsity,
                                              "warmup_epochs": a.warmup_epochs}),
}
INTRA_NODE = {"none": hvdcompress.NoCompression, "fp16": hvdcompress.FP16,
              "bf16": hvdcompress.BF16, "int8": hvdcompress.Int8}


def add_compression_arguments(parser: argparse.ArgumentParser, warmup_epochs: int = 4) -> None:
    """Add ``--compression``, ``--params``, ``--sparsity``, ``--warmup-epochs`` and ``--fusion`` to
    ``parser``."""
    parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="dgc")
    parser.add_argument("--params", default=None,
                        help="key=value,... for hvdcompress.from_params (overrides --compression)")
    parser.add_argument("--sparsity", type=float, default=0.999)
    parser.add_argument("--warmup-epochs", type=int, default=warmup_epochs,
                        help="DGC's exponential sparsity warm-up: epochs below the target "
                             "(from_params' warmup_epochs; 0: none)")
    parser.add_argument("--fusion", type=int, default=None, metavar="BYTES",
                        help="fused compression: consecutive tensors up to BYTES compressed as one "
                             "buffer (hvdcompress.engines.fusion; default: each tensor alone)")


def add_intra_node_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--intra-node`` and ``--ranks-per-node`` (two-level compression) to ``parser``."""
    parser.add_argument("--intra-node", choices=sorted(INTRA_NODE), default=None,
                        help="two-level compression: reduce inside each node with this compressor "
                             "(none: full precision), compress only between nodes; default: the "
                             "flat exchange")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="ranks per node for --intra-node (default: Horovod's local size; set "
                             "it to emulate nodes on one machine)")


def intra_node_from_args(args: argparse.Namespace) -> Optional[hvdcompress.Compressor]:
    """The ``intra_node=`` compressor the flags ask for (None: the flat exchange)."""
    return None if args.intra_node is None else INTRA_NODE[args.intra_node]()


def init_horovod(hvd: Any, args: argparse.Namespace) -> None:
    """``hvd.init()``, registering the node and cross-node process sets on every rank when
    ``--intra-node`` asks for two-level compression."""
    if args.intra_node is None:
        hvd.init()
    else:
        hvd.init(process_sets=node_process_sets(hvd, args.ranks_per_node))


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
