"""Convergence: does accuracy hold under compression? scikit-learn digits, fixed budget.

Trains the same MLP (64-512-512-10, 0.30M parameters) on the digits data set that ships with
scikit-learn (1437 train / 360 test images, stratified split) for a fixed number of epochs with
momentum SGD, once per method, all methods in the same Horovod processes, for each rank count::

    .venv/bin/python benchmarks/convergence.py                       # 2 and 4 ranks, all methods
    .venv/bin/python benchmarks/convergence.py --nps 2 --methods hvd-dense,dgc,dgc-warmup

Runs plain ``horovodrun --gloo`` on localhost (no emulated network). Methods are those of
``e2e.py`` (``hvd-dense``, ``hvd-fp16``, the short names of ``e2e.HVDC_METHODS`` or
``compressor[:key=value...]``); methods whose compressor is not registered are skipped.
Writes ``benchmarks/results/convergence.json`` and ``convergence.png`` (training loss and test
accuracy per epoch), and prints final test accuracy against Horovod dense.

``--task lm``: the byte-level LSTM language model of ``examples/lm_train.py`` (its model, text,
batches and validation are imported from there), gradients clipped to ``--clip``, at 2 and 8
ranks, for ``--steps`` steps; validation bits per byte every ``--epoch-steps`` steps (also the
unit of DGC's warm-up: ``dgc-warmup`` ramps over 4 of them)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/convergence.py --task lm
    .venv/bin/python benchmarks/convergence.py --task lm --nps 2 --json benchmarks/results/lm_ablation.json \
        --methods hvd-dense,dgc-warmup,dgc-warmup@lr=0.25,dgc:sparsity=0.999:warmup=4:masking=false

``--optimizer adamw`` trains with AdamW instead of SGD (``--weight-decay``); its take-over
methods wrap their compressor in FrozenAdam (``onebit-ef-adam``, ``topk-ef-adam``, ... in
``e2e.HVDC_METHODS``, or ``...:adam=frozen:freeze_steps=N``)::

    .venv/bin/python benchmarks/convergence.py --task lm --optimizer adamw --lr 0.002 --clip 0.5 \
        --steps 1000 --nps 2 --json benchmarks/results/lm_adamw.json \
        --methods hvd-dense,int8,onebit-ef,onebit-ef-adam,topk-ef,topk-ef-adam,powersgd,powersgd-adam

``hvd-dense`` clips with Horovod's documented pattern (``opt.synchronize()``,
``clip_grad_norm_``, ``with opt.skip_synchronize(): opt.step()``), every hvdcompress method with
``DistributedOptimizer(..., clip_grad_norm=...)`` (each rank clips its local gradients to
``clip * sqrt(N)`` before compression; ``clip / sqrt(N)`` in runs made before that was fixed,
see benchmarks/README.md). A method may end in ``@lr=X`` and/or ``@clip=X`` to
override ``--lr`` / ``--clip`` for it alone, and in ``@nesterov`` for Nesterov momentum.
``ddp:<method>`` (LM task) trains through DistributedDataParallel with hvdcompress's
communication hook instead (:mod:`hvdcompress.torch.ddp`, a gloo group beside Horovod's in the
same processes; the optimizer's momentum or Adam taken over as by the Horovod optimizer), to
compare the two front ends on one task.
Writes ``results/lm_convergence.json`` and ``lm_convergence.png`` (validation bits/byte over
steps). A launch that fails or runs past ``--timeout`` keeps the methods that finished before
(each is recorded as it ends): they are written to the JSON, the others named, and the exit
status is non-zero.
"""
from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))  # lm_train, hvdrun
from e2e import (
    DDP_HOOK,
    CodecTimer,
    hvdc_params,
    make_optimizer,
    optimizer_options,
    runnable,
    shared_parser,
    two_level,
    uses_ddp,
)
from hvdrun import LaunchError, run_script, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_METHODS = ("hvd-dense,hvd-fp16,fp16,dgc,dgc-warmup,topk,topk-ef,topk-ef-mom,randomk,"
                   "randomk-ef,randomk-ef-mom,onebit,onebit-ef,onebit-ef-mom,int8,powersgd")
LM_METHODS = "hvd-dense,dgc-warmup,onebit-ef-mom,int8,powersgd,topk-ef"
TASKS = {  # --task: default methods, rank counts and results file
    "digits": (DEFAULT_METHODS, [2, 4], RESULTS / "convergence.json"),
    "lm": (LM_METHODS, [2, 8], RESULTS / "lm_convergence.json"),
}
LM_FLAGS = ("steps", "epoch_steps", "seq_len", "clip", "embed", "hidden", "val_bytes", "weight_decay",
            "schedule", "optimizer", "model", "betas", "corpus", "stop_after")


def load_digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test) as torch tensors, pixels scaled to [0, 1]."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.2, random_state=seed, stratify=y)
    f = lambda a: torch.tensor(a, dtype=torch.float32)
    return f(xtr), torch.tensor(ytr), f(xte), torch.tensor(yte)


def build_model():
    """64-512-512-10 ReLU MLP: its 512x512 and 64x512 weights are large enough to be compressed
    by every compressor (DGC sends tensors under 16384 elements dense)."""
    import torch.nn as nn
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def train(method: str, args, data) -> dict:
    """Train one method for ``args.epochs`` epochs; per-epoch mean train loss and test accuracy."""
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    from hvdcompress.torch import SparsityScheduler

    xtr, ytr, xte, yte = data
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    model, opt = make_optimizer(method, build_model(), CodecTimer(), lr=args.lr,
                                momentum=args.momentum, prefix=f"{method}.")
    warmup = SparsityScheduler(opt) if hasattr(opt, "total_bytes") else None
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    shard_x, shard_y = xtr[rank::size], ytr[rank::size]
    per_rank = len(xtr) // size  # the same on every rank, so every rank takes as many steps
    steps = -(-per_rank // args.batch)
    gen = torch.Generator().manual_seed(args.seed + rank)
    losses, accs = [], []
    for _ in range(args.epochs):
        order = torch.randperm(len(shard_x), generator=gen)[:per_rank]
        total = 0.0
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(shard_x[idx]), shard_y[idx])
            loss.backward()
            opt.step()
            total += loss.item()
        if warmup is not None:
            warmup.step()
        losses.append(hvd.allreduce(torch.tensor(total / steps), name=f"{method}.loss").item())
        with torch.no_grad():
            accs.append((model(xte).argmax(1) == yte).float().mean().item())
    sent = opt.total_bytes.as_dict() if hasattr(opt, "total_bytes") else None
    return {"method": method, "loss": losses, "acc": accs, "final_acc": accs[-1], "bytes": sent}


def lm_method(method: str) -> tuple:
    """``'dgc-warmup@lr=0.25@clip=1'`` -> ``('dgc-warmup', {'lr': 0.25, 'clip': 1.0})``: the
    method and its overrides of ``--lr`` / ``--clip``; ``@nesterov`` gives the SGD Nesterov
    momentum (``{'nesterov': True}``; DGC takes it over from the optimizer)."""
    name, *overrides = method.split("@")
    options = {}
    for text in overrides:
        if text == "nesterov":
            options["nesterov"] = True
            continue
        key, _, value = text.partition("=")
        try:
            options[key] = float(value)
        except ValueError:
            options[key] = None
        if key not in ("lr", "clip") or options[key] is None or not options[key] > 0:
            raise ValueError(f"method {method!r}: override {text!r}: allowed: lr=X or clip=X, "
                             "X > 0, or nesterov")
    return name, options


def parse_betas(text: str) -> tuple:
    """``'0.9,0.95'`` -> ``(0.9, 0.95)``: AdamW's betas (--betas)."""
    try:
        b1, b2 = (float(b) for b in text.split(","))
    except ValueError:
        raise SystemExit(f"convergence: --betas {text!r}: allowed: b1,b2 (e.g. 0.9,0.95)") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise SystemExit(f"convergence: --betas {text!r}: allowed: 0 <= b1, b2 < 1")
    return b1, b2


class TimedCurve:
    """Validation points ``(step, bits/byte)`` and, for each, the training seconds before it
    (``times``: wall-clock since the start, the evaluations themselves left out), so that runs
    with different evaluation schedules compare as loss against training time."""

    def __init__(self, evaluate):
        self.evaluate, self.points, self.times = evaluate, [], []
        self._start, self._evaluating = time.perf_counter(), 0.0
        self.record(0)

    def record(self, step: int) -> None:
        begun = time.perf_counter()
        self.times.append(begun - self._start - self._evaluating)
        self.points.append((step, self.evaluate()))
        self._evaluating += time.perf_counter() - begun


def schedule_lr(optimizer, args, lr: float, step: int) -> None:
    """The lr of step ``step`` (1-based) in every param group: with ``--schedule cosine``
    lr·(1 + cos(π·(step-1)/T))/2 over the T = ``args.steps`` steps; a constant one is left alone."""
    if args.schedule == "cosine":
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / args.steps))


def train_lm(method: str, args, data) -> dict:
    """Train the language model of ``examples/lm_train.py`` with one method for ``args.steps``
    steps (the first ``args.stop_after`` of them when set), gradients clipped; validation bits/byte
    every ``args.epoch_steps`` steps. With
    ``--schedule cosine`` the learning rate follows lr·(1 + cos(π·t/T))/2 over the T steps (with a
    constant rate this model overfits: dense bottoms out near step 800 of 3000 and rises after)."""
    import horovod.torch as hvd
    import torch
    from lm_train import build_model, lm_loss, sample_batch, validation_bits_per_byte

    import hvdcompress
    import hvdcompress.torch as hvc

    train_text, val_text = data
    name, options = lm_method(method)
    lr, clip = options.get("lr", args.lr), options.get("clip", args.clip)
    torch.manual_seed(args.seed)
    model = build_model(args.model, args.embed, args.hidden)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if args.optimizer == "adamw":
        sgd = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=args.weight_decay,
                                betas=parse_betas(args.betas))
    else:
        sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum,
                              nesterov=options.get("nesterov", False))
    named = [(f"{method}.{n}", p) for n, p in model.named_parameters()]
    dense, forward = name == "hvd-dense", model
    compression = None if dense else hvdcompress.from_params(hvdc_params(name.removeprefix(DDP_HOOK)))
    if dense:
        opt = hvd.DistributedOptimizer(sgd, named_parameters=named)
    elif name.startswith(DDP_HOOK):  # the same compressor as DistributedDataParallel's comm hook
        from torch.nn.parallel import DistributedDataParallel

        from hvdcompress.torch import ddp
        forward = DistributedDataParallel(model)
        state = ddp.CompressionState(compression=compression, optimizer=sgd, named_parameters=named,
                                     clip_grad_norm=clip)
        forward.register_comm_hook(state, ddp.compression_hook)
        opt, warmup, counter = sgd, hvc.SparsityScheduler(state.compressor), state.exchange
    else:
        opt = hvc.DistributedOptimizer(sgd, named_parameters=named, clip_grad_norm=clip,
                                       compression=compression, **optimizer_options(name))
        warmup, counter = hvc.SparsityScheduler(opt), opt
    gen = torch.Generator().manual_seed(args.seed + 1 + hvd.rank())  # same batches for every method
    curve = TimedCurve(lambda: validation_bits_per_byte(model, val_text, args.seq_len, args.val_bytes))
    start, last = time.perf_counter(), args.stop_after or args.steps
    for step in range(1, last + 1):
        schedule_lr(sgd, args, lr, step)
        x, y = sample_batch(train_text, args.batch, args.seq_len, gen)
        opt.zero_grad()
        lm_loss(forward, x, y).backward()
        if dense:  # Horovod's documented clipping pattern: clip the averaged gradient
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        if step % args.epoch_steps == 0 or step == last:
            curve.record(step)
        if step % args.epoch_steps == 0 and not dense:
            warmup.step()
    return {"method": method, "curve": curve.points, "times": curve.times, "final_bpb": curve.points[-1][1],
            "model": args.model, "optimizer": args.optimizer, "seconds": time.perf_counter() - start,
            "betas": list(parse_betas(args.betas)) if args.optimizer == "adamw" else None,
            "bytes": None if dense else counter.total_bytes.as_dict()}


def worker(args) -> None:
    """In each Horovod rank: train every method; rank 0 reports one record per method."""
    import horovod.torch as hvd
    import torch
    torch.set_num_threads(1)
    per_node = {optimizer_options(m).get("ranks_per_node") for m in args.methods if two_level(m)}
    if len(per_node) > 1:
        raise SystemExit(f"convergence: two-level methods with different ranks_per_node {per_node}: "
                         "one launch registers one set of node process sets")
    if per_node:
        import hvdcompress.torch as hvc
        hvd.init(process_sets=hvc.node_process_sets(ranks_per_node=per_node.pop()))
    else:
        hvd.init()
    if any(uses_ddp(m) for m in args.methods):  # the DDP hook's process group beside Horovod's
        import os

        import torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port),
                          RANK=str(hvd.rank()), WORLD_SIZE=str(hvd.size()))
        dist.init_process_group("gloo", init_method="env://")
    if args.task == "lm":
        from lm_train import load_corpus
        task_train, data = train_lm, load_corpus(args.corpus)
    else:
        task_train, data = train, load_digits_split(args.seed)
    for method in args.methods:
        res = task_train(method, args, data)
        if hvd.rank() == 0:
            write_result(0, res)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the DDP methods' torch.distributed rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_np(np_: int, methods: list, args) -> tuple:
    """One horovodrun with ``np_`` ranks on localhost: (rank 0's records, one per finished
    method; the LaunchError's message if the launch failed or timed out, else None). A method
    writes its record as it ends, so those finished before a failure are kept."""
    flags = ["--worker", "--methods", ",".join(methods), "--epochs", str(args.epochs),
             "--batch", str(args.batch), "--lr", str(args.lr), "--momentum", str(args.momentum),
             "--seed", str(args.seed), "--task", args.task, "--port", str(free_port())]
    if args.task == "lm":
        flags += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in LM_FLAGS]
    try:
        return run_script(Path(__file__).resolve(), np=np_, args=flags, timeout=args.timeout).results[0], None
    except LaunchError as e:
        return (e.results[0] if e.results else []), str(e)


def print_table(results: dict) -> None:
    """Final test accuracy per method and rank count, and the difference to hvd-dense."""
    nps = sorted(results, key=int)
    methods = list(dict.fromkeys(m for n in nps for m in results[n]))
    width = max(map(len, ["method", *methods])) + 2
    print(f"\n{'method':<{width}}" + "".join(f"{'np' + n + ' acc':>11}{'vs dense':>10}" for n in nps))
    for m in methods:
        cells = ""
        for n in nps:
            row, dense = results[n].get(m), results[n].get("hvd-dense")
            acc = f"{100 * row['final_acc']:>10.2f}%" if row else f"{'-':>11}"
            diff = f"{100 * (row['final_acc'] - dense['final_acc']):>+9.2f}p" if row and dense else f"{'-':>10}"
            cells += acc + diff
        print(f"{m:<{width}}{cells}")


def plot(results: dict, path: Path) -> None:
    """Training loss (log) and test accuracy per epoch; one column per rank count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nps = sorted(results, key=int)
    fig, axes = plt.subplots(2, len(nps), figsize=(6.5 * len(nps), 8), squeeze=False)
    for col, n in enumerate(nps):
        for ax in axes[:, col]:
            ax.set_prop_cycle(color=plt.cm.tab20.colors)
        for m, row in results[n].items():
            style = "k-" if m == "hvd-dense" else "-"
            epochs = range(1, len(row["loss"]) + 1)
            axes[0][col].plot(epochs, row["loss"], style, label=m, lw=1.2)
            axes[1][col].plot(epochs, [100 * a for a in row["acc"]], style, label=m, lw=1.2)
        axes[0][col].set(yscale="log", title=f"digits MLP, {n} ranks", ylabel="train loss")
        axes[1][col].set(xlabel="epoch", ylabel="test accuracy (%)", ylim=(50, 100))
        for ax in axes[:, col]:
            ax.grid(True, alpha=0.3)
        axes[1][col].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_lm_table(results: dict) -> None:
    """Final validation bits/byte per method and rank count, the difference to hvd-dense, the
    best bits/byte seen during the run and the compression ratio (dense bytes / sent bytes of one rank, over the whole run)."""
    nps = sorted(results, key=int)
    methods = list(dict.fromkeys(m for n in nps for m in results[n]))
    width = max(map(len, ["method", *methods])) + 2
    print(f"\n{'method':<{width}}" + "".join(f"{'np' + n + ' bpb':>10}{'vs dense':>10}{'best':>8}"
                                            f"{'ratio':>9}" for n in nps))
    for m in methods:
        cells = ""
        for n in nps:
            row, dense = results[n].get(m), results[n].get("hvd-dense")
            if row is None:
                cells += f"{'-':>10}{'-':>10}{'-':>8}{'-':>9}"
                continue
            diff = f"{row['final_bpb'] - dense['final_bpb']:>+10.3f}" if dense else f"{'-':>10}"
            ratio = f"{row['bytes']['ratio']:>9.1f}" if row["bytes"] else f"{1:>9.1f}"
            best = min(bpb for _, bpb in row["curve"])
            cells += f"{row['final_bpb']:>10.3f}{diff}{best:>8.3f}{ratio}"
        print(f"{m:<{width}}{cells}")


def plot_lm(results: dict, path: Path) -> None:
    """Validation bits/byte over steps, one panel per rank count (the first evaluation, ~8
    bits/byte, is off the scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nps = sorted(results, key=int)
    fig, axes = plt.subplots(1, len(nps), figsize=(6.5 * len(nps), 4.8), squeeze=False)
    for ax, n in zip(axes[0], nps):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)
        for m, row in results[n].items():
            steps, bpb = zip(*row["curve"])
            ax.plot(steps, bpb, "k-" if m == "hvd-dense" else "-", label=m, lw=1.2)
        best = min(row["final_bpb"] for row in results[n].values())
        first = next(iter(results[n].values()))
        names = {"lstm": "LSTM", "transformer": "transformer", "sgd": "SGD", "adamw": "AdamW"}
        setup = f"{names[first.get('model', 'lstm')]}, {names[first.get('optimizer', 'sgd')]}"
        ax.set(title=f"byte-level {setup}, {n} ranks, clipped", xlabel="step",
               ylabel="validation bits/byte", ylim=(best - 0.1, best + 1.5))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    """Command line of the driver and of the worker (``--worker``)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", choices=sorted(TASKS), default="digits")
    task = pre.parse_known_args(argv)[0].task
    ap = shared_parser(__doc__, *TASKS[task])
    ap.add_argument("--task", choices=sorted(TASKS), default="digits",
                    help="digits: the MLP; lm: the language model (sets the defaults of "
                         "--methods, --nps, --json, --lr, --batch)")
    ap.add_argument("--epochs", type=int, default=10, help="digits")
    ap.add_argument("--lr", type=float, default=1.0 if task == "lm" else 0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)  # the DDP methods' rendezvous
    lm = ap.add_argument_group("--task lm")
    lm.add_argument("--steps", type=int, default=400)
    lm.add_argument("--stop-after", type=int, default=0,
                    help="end after this many steps of the --steps schedule (a diagnosis of the "
                         "early steps at a run's learning rates; 0: the whole run)")
    lm.add_argument("--epoch-steps", type=int, default=25,
                    help="validation interval, and the unit of DGC's warm-up")
    lm.add_argument("--seq-len", type=int, default=64)
    lm.add_argument("--clip", type=float, default=0.25, help="gradient clipping norm (> 0)")
    lm.add_argument("--embed", type=int, default=64)
    lm.add_argument("--hidden", type=int, default=128)
    lm.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                    help="learning rate over the run")
    lm.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                    help="sgd: SGD with --momentum; adamw: torch.optim.AdamW (--betas)")
    lm.add_argument("--betas", default="0.9,0.999",
                    help="AdamW's betas b1,b2 (e.g. 0.9,0.95, the betas of most language models)")
    lm.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's weight decay")
    lm.add_argument("--model", choices=("lstm", "transformer"), default="lstm",
                    help="lstm: examples/lm_train.py's ByteLSTM; transformer: its 2-layer causal "
                         "ByteTransformer (width --embed)")
    lm.add_argument("--corpus", choices=("torch-docs", "python-docs"), default="torch-docs",
                    help="the text (examples/lm_train.py CORPORA): torch-docs, the tuning corpus of "
                         "the benchmarks; python-docs, a held-out one (benchmarks/adamw_summary.py)")
    lm.add_argument("--val-bytes", type=int, default=65536,
                    help="validation text measured (all of it: 43932 bytes with torch 2.13)")
    if task == "lm":
        ap.set_defaults(batch=16)
    args = ap.parse_args(argv)
    if task == "lm":
        parse_betas(args.betas)
        if not 0 <= args.stop_after <= args.steps:
            ap.error(f"--stop-after {args.stop_after}: allowed: 0 (the whole run) to --steps ({args.steps})")
        for k in LM_FLAGS[:-7]:
            if not getattr(args, k) > 0:
                ap.error(f"--{k.replace('_', '-')} {getattr(args, k)}: allowed: a number > 0")
    return args


def main(argv=None) -> None:
    """Driver: one horovodrun per rank count, then table, JSON (merged) and plot
    (``--report``: table and plot from the JSON only)."""
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    out = Path(args.json)
    results = json.loads(out.read_text()) if out.exists() else {}
    if args.task == "lm":
        bases = set(runnable([lm_method(m)[0] for m in args.methods], "convergence"))
        methods = [] if args.report else [m for m in args.methods if lm_method(m)[0] in bases]
    else:
        methods = [] if args.report else runnable(args.methods, "convergence")
    for np_ in [] if args.report else args.nps:
        rows, error = run_np(np_, methods, args)
        results[str(np_)] = {**results.get(str(np_), {}), **{r["method"]: r for r in rows}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
        if error:
            finished = {r["method"] for r in rows}
            lost = [m for m in methods if m not in finished]
            raise SystemExit(f"convergence: {error}\nconvergence: {len(rows)} finished method(s) "
                             f"kept in {out}; not run or unfinished at {np_} ranks: {', '.join(lost)}")
    (print_lm_table if args.task == "lm" else print_table)(results)
    (plot_lm if args.task == "lm" else plot)(results, out.with_suffix(".png"))
    print(f"convergence: wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
