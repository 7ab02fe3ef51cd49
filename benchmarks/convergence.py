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
"""
from __future__ import annotations

import json
from pathlib import Path

from e2e import CodecTimer, make_optimizer, runnable, shared_parser
from hvdcompress.launch import LaunchError, run_script, write_result

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_METHODS = ("hvd-dense,hvd-fp16,fp16,dgc,dgc-warmup,topk,topk-ef,topk-ef-mom,randomk,"
                   "randomk-ef,randomk-ef-mom,onebit,onebit-ef,onebit-ef-mom,int8,powersgd")


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


def worker(args) -> None:
    """In each Horovod rank: train every method; rank 0 reports one record per method."""
    import horovod.torch as hvd
    import torch
    torch.set_num_threads(1)
    hvd.init()
    data = load_digits_split(args.seed)
    for method in args.methods:
        res = train(method, args, data)
        if hvd.rank() == 0:
            write_result(0, res)


def run_np(np_: int, methods: list, args) -> list:
    """One horovodrun with ``np_`` ranks on localhost; rank 0's records, one per method."""
    flags = ["--worker", "--methods", ",".join(methods), "--epochs", str(args.epochs),
             "--batch", str(args.batch), "--lr", str(args.lr), "--momentum", str(args.momentum),
             "--seed", str(args.seed)]
    try:
        return run_script(Path(__file__).resolve(), np=np_, args=flags, timeout=args.timeout).results[0]
    except LaunchError as e:
        raise SystemExit(f"convergence: {e}") from None


def print_table(results: dict) -> None:
    """Final test accuracy per method and rank count, and the difference to hvd-dense."""
    nps = sorted(results, key=int)
    print(f"\n{'method':<14}" + "".join(f"{'np' + n + ' acc':>11}{'vs dense':>10}" for n in nps))
    methods = list(dict.fromkeys(m for n in nps for m in results[n]))
    for m in methods:
        cells = ""
        for n in nps:
            row, dense = results[n].get(m), results[n].get("hvd-dense")
            acc = f"{100 * row['final_acc']:>10.2f}%" if row else f"{'-':>11}"
            diff = f"{100 * (row['final_acc'] - dense['final_acc']):>+9.2f}p" if row and dense else f"{'-':>10}"
            cells += acc + diff
        print(f"{m:<14}{cells}")


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
            ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    """Command line of the driver and of the worker (``--worker``)."""
    ap = shared_parser(__doc__, DEFAULT_METHODS, [2, 4], RESULTS / "convergence.json")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    """Driver: one horovodrun per rank count, then table, JSON (merged) and plot
    (``--report``: table and plot from the JSON only)."""
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    out = Path(args.json)
    results = json.loads(out.read_text()) if out.exists() else {}
    methods = [] if args.report else runnable(args.methods, "convergence")
    for np_ in [] if args.report else args.nps:
        rows = run_np(np_, methods, args)
        results[str(np_)] = {**results.get(str(np_), {}), **{r["method"]: r for r in rows}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
    print_table(results)
    plot(results, out.with_suffix(".png"))
    print(f"convergence: wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
