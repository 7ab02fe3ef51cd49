"""The take-over's v-step codes against the gradient's own noise (benchmarks/README.md section 8,
issue 53 item 2): could a rule pick int8 or int4 from what the run shows?

One process trains dense AdamW on the batch of 8 ranks (``--ranks``) of a task of
``benchmarks/adamw_summary.py``; at a few steps it takes each rank's gradient g_r (its own
micro-batch) and, for the first N = 2, 4, 8 ranks, in name order over the parameters::

    noise = |std_r g_r| / sqrt(N)                      the mean's sampling noise
    int8, int4 = |mean_r D(C(g_r)) - mean_r g_r|       a v-step's code error on the mean
    int4 + server = the same after the compressed allreduce re-sends the sum, Int4(chunk=64)

(|.|: the 2-norm over every parameter), each printed over ``noise`` and over |mean_r g_r| (v's
own scale: the mean's noise is part of it, and shrinks with N). A code whose error stays
well under the noise costs the mean nothing the sampling does not already cost::

    .venv/bin/python benchmarks/warmup_codes.py --set tuning --task lstm --betas 0.999 [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "examples")]

import v_drift  # noqa: E402

#: the steps measured
STEPS = (32, 128, 256, 512)


def decoded(codec, x):
    """D(C(x)) of one flat float32 tensor with a stateless compressor."""
    from hvdcompress.contract.compressor import TensorInfo
    from hvdcompress.ops.torch_ops import TorchOps

    ops, info = TorchOps(), TensorInfo(name="g", numel=x.numel())
    packet = codec.compress(ops, x, {}, info)
    return codec.decompress(ops, packet.tensors, packet.ctx, info)


def errors(grads: list, worlds: tuple = (2, 4, 8)) -> dict:
    """{N: {code: error / noise, code + " / mean": error / |mean|}} of per-rank gradients
    ``grads`` (a list over ranks of lists of flat tensors, one per parameter in name order)."""
    import torch

    from hvdcompress.adam.frozen import SERVER_INT4_CHUNK
    from hvdcompress.compressors.int8 import Int4, Int8
    codes = {"int8": Int8(), "int4": Int4()}
    server = Int4(chunk=SERVER_INT4_CHUNK)
    out = {}
    for n in worlds:
        noise, size, err = 0.0, 0.0, dict.fromkeys([*codes, "int4 + server"], 0.0)
        for tensors in zip(*grads[:n]):
            stack = torch.stack(tensors)
            mean = stack.mean(0)
            noise += float((stack.std(0, unbiased=True) ** 2).sum()) / n
            size += float((mean ** 2).sum())
            for name, codec in codes.items():
                total = sum(decoded(codec, g) for g in tensors)
                err[name] += float(((total / n - mean) ** 2).sum())
                if name == "int4":
                    err["int4 + server"] += float(((decoded(server, total) / n - mean) ** 2).sum())
        out[n] = {**{name: math.sqrt(e / noise) for name, e in err.items()},
                  **{f"{name} / mean": math.sqrt(e / size) for name, e in err.items()}}
    return out


def measure(args: argparse.Namespace, ranks: int, steps: tuple = STEPS) -> dict:
    """{step: errors(...)} while dense AdamW trains on ``ranks`` ranks' batch (rank r's
    micro-batch: every ranks-th row of the batch)."""
    from lm_train import lm_loss
    out = {}

    def before(t, model, params, x, y):
        if t in steps:
            grads = []
            for r in range(ranks):
                model.zero_grad()
                lm_loss(model, x[r::ranks], y[r::ranks]).backward()
                grads.append([p.grad.detach().flatten().clone() for p in params])
            out[t] = errors(grads, tuple(n for n in (2, 4, 8) if n <= ranks))

    v_drift.train(args, ranks, max(steps), before=before)
    return out


def main(argv: Optional[list] = None) -> None:
    parser = v_drift.task_parser(__doc__, dict(choices=(2, 4, 8), default=8))
    parser.add_argument("--json", type=Path, help="write {step: {N: {code: error / noise}}} here")
    args, task = v_drift.parse_task(parser, argv)
    found = measure(task, args.ranks)
    print(f"{args.set} {args.task}, b2 {args.betas}: code error on the mean / the mean's sampling noise")
    for t, by_world in found.items():
        print(f"step {t}: " + "; ".join(f"N={n} " + ", ".join(f"{c} {v:.3f}" for c, v in e.items())
                                        for n, e in by_world.items()))
    if args.json:
        args.json.write_text(json.dumps({"set": args.set, "task": args.task, "beta2": args.betas, "errors": found}))


if __name__ == "__main__":
    main()
