"""How fast dense AdamW's second moment settles: the relative drift of its denominator over 16 steps
(benchmarks/README.md section 8, issue 53 item 2), on the tasks of ``benchmarks/adamw_summary.py``.

One process, torch.optim.AdamW on the batch of ``--ranks`` ranks, the task's lr schedule and clip;
at step t (a multiple of 16), with v_hat = v / (1 - b2^t) over every parameter (in name order)::

    drift_t = sum |sqrt(v_hat_t) - sqrt(v_hat_(t-16))| / sum sqrt(v_hat_t)

The question it answers: could the take-over leave its live steps when v's relative change falls
below a bound (a rule measured from the run) instead of at a step count? If drift_t carries the
task (how fast the gradients' scale still moves), the bound would pick different steps on
different tasks; if it is the sampling noise of g² that bias-corrected averaging leaves
(drift ~ c·16/t while t < 1/(1-b2), then a floor), the bound is a step count in disguise::

    .venv/bin/python benchmarks/v_drift.py --set tuning --task lstm --betas 0.999 [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "examples")]

import adamw_summary  # noqa: E402
import convergence  # noqa: E402

#: the window of the drift (steps)
WINDOW = 16


def task_args(kind: str, task: str, b2: str, seed: int) -> argparse.Namespace:
    """convergence.py's arguments for the task of ``adamw_summary``'s set ``kind``."""
    spec = adamw_summary.SETS[kind][task]
    return convergence.parse_args([*adamw_summary.COMMON, *spec.flags, "--betas", f"0.9,{b2}",
                                   "--seed", str(seed)])


def relative_drift(before, after) -> float:
    """sum |after - before| / sum after (tensors of the same shape)."""
    return ((after - before).abs().sum() / after.sum()).item()


def train(args: argparse.Namespace, ranks: int, steps: int, before: Callable = None, after: Callable = None):
    """Dense AdamW for ``steps`` steps on ``ranks`` ranks' batch with the task's lr schedule and
    clip; ``before(t, model, params, x, y)`` ahead of step t, ``after(t, opt, params)`` after it
    (``params``: the parameters in name order)."""
    import torch
    from lm_train import build_model, lm_loss, load_corpus, sample_batch

    torch.manual_seed(args.seed)
    train_text, _ = load_corpus(args.corpus)
    model = build_model(args.model, args.embed, args.hidden)
    b1, b2 = convergence.parse_betas(args.betas)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(b1, b2))
    params = [p for _, p in sorted(model.named_parameters())]
    gen = torch.Generator().manual_seed(args.seed + 1)
    for t in range(1, steps + 1):
        convergence.schedule_lr(opt, args, args.lr, t)
        x, y = sample_batch(train_text, args.batch * ranks, args.seq_len, gen)
        if before is not None:
            before(t, model, params, x, y)
        opt.zero_grad()
        lm_loss(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if after is not None:
            after(t, opt, params)


def drifts(args: argparse.Namespace, ranks: int, steps: int) -> list:
    """[(t, drift_t)] every :data:`WINDOW` steps of dense AdamW on ``ranks`` ranks' batch."""
    import torch
    b2 = convergence.parse_betas(args.betas)[1]
    last, out = [], []

    def after(t, opt, params):
        if t % WINDOW == 0:
            scale = torch.cat([opt.state[p]["exp_avg_sq"].flatten() for p in params]).div(1 - b2 ** t).sqrt()
            if last:
                out.append((t, relative_drift(last[0], scale)))
            last[:] = [scale]

    train(args, ranks, steps, after=after)
    return out


def task_parser(doc: str, ranks: dict) -> argparse.ArgumentParser:
    """The command line of a dense-AdamW measurement on a task of adamw_summary's sets
    (``ranks``: the keyword arguments of ``--ranks``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(adamw_summary.SETS), default="tuning")
    parser.add_argument("--task", default="lstm", help="a task of the set (adamw_summary.py)")
    parser.add_argument("--betas", choices=("0.95", "0.999"), default="0.999", help="b2")
    parser.add_argument("--ranks", type=int, **ranks)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def parse_task(parser: argparse.ArgumentParser, argv: Optional[list]) -> tuple:
    """(the arguments, convergence.py's for the task); one thread, as a rank of the launches has."""
    import torch
    args = parser.parse_args(argv)
    if args.task not in adamw_summary.SETS[args.set]:
        parser.error(f"--task {args.task!r}: allowed for {args.set}: {', '.join(adamw_summary.SETS[args.set])}")
    torch.set_num_threads(1)
    return args, task_args(args.set, args.task, args.betas, args.seed)


def main(argv: Optional[list] = None) -> None:
    parser = task_parser(__doc__, dict(default=2, help="the batch is this many ranks'"))
    parser.add_argument("--steps", type=int, default=640)
    parser.add_argument("--json", type=Path, help="write [(t, drift)] here")
    args, task = parse_task(parser, argv)
    found = drifts(task, args.ranks, args.steps)
    print(f"{args.set} {args.task}, b2 {args.betas}: step, drift of sqrt(v_hat) over {WINDOW} steps, drift * t / {WINDOW}")
    for t, d in found:
        if t in (32, 64, 128, 256, 384, 512) or t == found[-1][0]:
            print(f"{t:5d}  {d:.3f}  {d * t / WINDOW:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"set": args.set, "task": args.task, "beta2": args.betas,
                                         "ranks": args.ranks, "drift": found}))


if __name__ == "__main__":
    main()
