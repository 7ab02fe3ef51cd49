"""Train a byte-level LSTM language model with Horovod, hvdcompress and gradient clipping.

    horovodrun -np 2 -H localhost:2 --gloo python examples/lm_train.py --compression dgc
    horovodrun -np 2 -H localhost:2 --gloo python examples/lm_train.py \
        --params compressor=onebit,ef=vanilla,momentum=plain --clip 0.5
    horovodrun -np 2 -H localhost:2 --gloo python examples/lm_train.py --optimizer adamw \
        --lr 0.002 --params compressor=onebit,ef=vanilla,adam=frozen --clip 0.5

``--optimizer adamw``: AdamW (``--weight-decay``); with it, wrap the compressor in the Adam
take-over (``adam=frozen``, :class:`hvdcompress.FrozenAdam`: a full-precision warm-up, then each
rank's momentum compressed with v frozen), as 1-bit Adam does.

Clipping with compression is ``clip_grad_norm=`` of ``hvdcompress.torch.DistributedOptimizer``:
each rank clips its own gradients (all parameters together, by their global L2 norm) to
``c * sqrt(N)`` (the DGC paper's c / sqrt(N) on each rank's share g / N) before error feedback, momentum correction and compression, the local gradient
clipping of the DGC paper. Do not clip ``p.grad`` between ``synchronize()`` and ``step()`` with a
compressor that owns the momentum (DGC, ``momentum=``) or keeps a residual (``ef=``): there
``p.grad`` is the exchanged update, not the gradient.

The text is ``torch/_torch_docs.py`` of the installed torch (English docstrings with code
examples, 439 kB for torch 2.13: no download, the same bytes on every run of one torch version).
Its first 90% is the training text, the rest the validation text. Each step every rank draws its
own ``--batch-size`` windows of ``--seq-len + 1`` bytes at random offsets of the training text
and the model predicts each next byte. An "epoch" is ``--epoch-steps`` steps: DGC's warm-up
(``--warmup-epochs``) counts them, and the validation loss, in bits per byte
(cross-entropy / ln 2; 8 would be a uniform guess), is measured on the first ``--val-bytes``
of the validation text after each. ``--compression``/``--params`` as in ``pytorch_train.py``
(:mod:`compression_cli`). At the end every rank reports (``hvdrun.write_result``)
the validation curve, the gradient bytes of the last step (dense vs sent by this rank) and a
checksum of its parameters.
"""
from __future__ import annotations

import argparse
import math
import pydoc_data
import time
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from compression_cli import add_compression_arguments, compression_from_args  # examples/
from hvdrun import compression_figures, figures_text, write_result

import hvdcompress.torch as hvc

#: the byte-level texts, each shipping with a package: ``torch-docs`` (torch's docstrings, the
#: benchmarks' tuning corpus) and ``python-docs`` (Python's own pydoc topics, a held-out one)
CORPORA = {"torch-docs": Path(torch.__file__).parent / "_torch_docs.py",
           "python-docs": Path(pydoc_data.__file__).parent / "topics.py"}
CORPUS = CORPORA["torch-docs"]
TRAIN_FRACTION = 0.9


def load_corpus(name: str = "torch-docs") -> tuple:
    """``(train, validation)``: the bytes of the corpus ``name`` (:data:`CORPORA`) as int64
    tensors, split 90/10."""
    if name not in CORPORA:
        raise ValueError(f"corpus {name!r}: allowed: {', '.join(map(repr, CORPORA))}")
    path = CORPORA[name]
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the corpus {name!r} ships with its package")
    data = torch.from_numpy(np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.int64))
    cut = int(len(data) * TRAIN_FRACTION)
    return data[:cut], data[cut:]


class ByteLSTM(torch.nn.Module):
    """Embedding(256, embed) -> one-layer LSTM(hidden) -> Linear(hidden, 256) next-byte logits.

    With embed 64 and hidden 128 (0.15M parameters) every weight matrix has at least 16384
    elements, so every compressor (DGC sends smaller tensors dense) compresses all of them.
    """

    def __init__(self, embed: int = 64, hidden: int = 128):
        super().__init__()
        self.embed = torch.nn.Embedding(256, embed)
        self.lstm = torch.nn.LSTM(embed, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))
        return self.head(out)


class ByteTransformer(torch.nn.Module):
    """A small byte-level causal transformer: Embedding(256, embed) plus learned positions ->
    ``layers`` pre-norm encoder layers (4 heads, feed-forward 4·embed, causal mask) ->
    LayerNorm -> Linear(embed, 256). At embed 128 and 2 layers: 0.53M parameters."""

    def __init__(self, embed: int = 128, layers: int = 2, max_len: int = 512):
        super().__init__()
        self.embed = torch.nn.Embedding(256, embed)
        self.position = torch.nn.Embedding(max_len, embed)
        layer = torch.nn.TransformerEncoderLayer(embed, 4, 4 * embed, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(embed)
        self.head = torch.nn.Linear(embed, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.embed(x) + self.position(torch.arange(n, device=x.device))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


def build_model(kind: str, embed: int, hidden: int) -> torch.nn.Module:
    """``"lstm"``: :class:`ByteLSTM` (embed, hidden); ``"transformer"``: :class:`ByteTransformer`
    of width ``embed`` and 2 layers."""
    if kind == "transformer":
        return ByteTransformer(embed, layers=2)
    if kind == "lstm":
        return ByteLSTM(embed, hidden)
    raise ValueError(f"model={kind!r}: allowed: 'lstm', 'transformer'")


def sample_batch(train: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> tuple:
    """``batch`` random windows of the training text: inputs and next-byte targets, (batch, seq_len)."""
    starts = torch.randint(0, len(train) - seq_len - 1, (batch,), generator=gen)
    windows = torch.stack([train[s:s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy, in nats."""
    return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))


def validation_bits_per_byte(model: torch.nn.Module, val: torch.Tensor, seq_len: int,
                             val_bytes: int, name: str = "lm.val") -> float:
    """Bits per byte on the first ``val_bytes`` of ``val``, cut into non-overlapping windows of
    ``seq_len`` predicted bytes (each window starts without context). The windows are shared
    out over the ranks and the summed cross-entropy allreduced (``name``: the collective's), so
    every rank returns the same number."""
    if val_bytes < seq_len + 1:
        raise ValueError(f"val_bytes={val_bytes}: allowed: at least seq_len + 1 = {seq_len + 1}")
    n = (min(val_bytes, len(val)) - 1) // seq_len
    mine = torch.arange(hvd.rank(), n, hvd.size())
    totals = torch.zeros(2, dtype=torch.float64)  # summed nats, predicted bytes
    if len(mine):
        idx = mine[:, None] * seq_len + torch.arange(seq_len + 1)
        windows = val[idx]
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(windows[:, :-1]).reshape(-1, 256)
            totals[0] = F.cross_entropy(logits, windows[:, 1:].reshape(-1), reduction="sum").double()
        model.train(was_training)
        totals[1] = windows[:, 1:].numel()
    totals = hvd.allreduce(totals, op=hvd.Sum, name=name)
    return float(totals[0] / totals[1]) / math.log(2.0)


def parameter_checksum(model: torch.nn.Module) -> float:
    """Sum of all parameters in float64: equal on every rank when the ranks stay in sync."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compression_arguments(parser)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--epoch-steps", type=int, default=25,
                        help="steps per epoch (warm-up unit and validation interval)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per rank and step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--model", choices=("lstm", "transformer"), default="lstm",
                        help="lstm: ByteLSTM (default); transformer: a 2-layer causal ByteTransformer")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                        help="sgd: SGD with --momentum (default); adamw: AdamW with --weight-decay")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's weight decay")
    parser.add_argument("--nesterov", action="store_true",
                        help="Nesterov momentum: recommended with DGC and error feedback + momentum "
                             "(benchmarks/README.md, section 6)")
    parser.add_argument("--clip", type=float, default=0.25,
                        help="clip_grad_norm of the optimizer (0: no clipping)")
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--val-bytes", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    for flag in ("steps", "epoch_steps", "batch_size", "seq_len", "embed", "hidden"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: allowed: an integer >= 1")
    if args.clip < 0:
        parser.error(f"--clip {args.clip}: allowed: 0 (no clipping) or a number > 0")

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    train, val = load_corpus()
    model = build_model(args.model, args.embed, args.hidden)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = compression_from_args(parser, args)
    if args.optimizer == "adamw":
        base = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                               nesterov=args.nesterov)
    opt = hvc.DistributedOptimizer(
        base,
        named_parameters=model.named_parameters(), compression=compression,
        clip_grad_norm=args.clip or None, fusion=args.fusion)
    warmup = hvc.SparsityScheduler(opt)
    gen = torch.Generator().manual_seed(args.seed + 1 + hvd.rank())
    curve = [(0, validation_bits_per_byte(model, val, args.seq_len, args.val_bytes))]
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = sample_batch(train, args.batch_size, args.seq_len, gen)
        opt.zero_grad()
        lm_loss(model, x, y).backward()
        opt.step()
        if step % args.epoch_steps == 0 or step == args.steps:
            curve.append((step, validation_bits_per_byte(model, val, args.seq_len, args.val_bytes)))
            if hvd.rank() == 0:
                print(f"{args.compression}: step {step}/{args.steps} validation "
                      f"{curve[-1][1]:.3f} bits/byte"
                      f"{figures_text(compression_figures(opt.total_bytes, warmup.get_sparsity()))}",
                      flush=True)
        if step % args.epoch_steps == 0:
            warmup.step()
    write_result(hvd.rank(), {
        "compression": args.compression, "curve": curve, "initial_bpb": curve[0][1],
        "final_bpb": curve[-1][1], "seconds": time.perf_counter() - start,
        "dense_bytes": opt.last_step_bytes.dense, "sent_bytes": opt.last_step_bytes.sent,
        "param_checksum": parameter_checksum(model)})


if __name__ == "__main__":
    main()
