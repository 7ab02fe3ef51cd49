"""DiLoCo on the language model: bits/byte and bytes against data-parallel AdamW, same tokens.

The LM task of ``convergence.py --task lm`` (examples/lm_train.py's model, text, batches and
validation), trained with AdamW at betas (0.9, 0.95) on 2 ranks (``--sites N``: N), each rank a site, under
``horovodrun --gloo`` on localhost, all methods in one launch::

    .venv/bin/python benchmarks/diloco.py --model transformer --steps 200 --sync-every 25 \
        --methods dp,diloco-dense,diloco-topk,diloco-int8-ef --val-bytes 16384

Methods: ``dp``, data-parallel AdamW (``convergence.py``'s ``hvd-dense``: Horovod's dense
allreduce every step, its clipping pattern); ``diloco-<compression>``, ``hvdcompress.torch.DiLoCo``
around the same AdamW with each site clipping its own gradients to ``--clip``, where
``<compression>`` is one of :data:`COMPRESSIONS`; a method may end in ``@H=N`` (sync_every),
``@outer_lr=X`` and ``@mu=X`` (outer_momentum). Each rank draws the batches ``convergence.py`` draws, so every method sees the
same tokens. A DiLoCo curve is measured after each sync (between syncs the sites differ); the
run ends on a sync. The LM flags are ``convergence.py --task lm``'s (``--lr``, ``--clip``,
``--model``, ``--embed``, ``--steps``, ``--schedule``, ``--val-bytes``, ...), with its defaults
but AdamW, betas 0.9,0.95, lr 0.002, clip 0.5. Writes ``results/diloco.json`` (``--json``) and
prints final bits/byte, the difference to ``dp``, bytes sent over the run, the ratio to
``dp``'s, and whether both ranks ended on the same parameters.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))  # lm_train, hvdrun
import convergence  # noqa: E402  (benchmarks/: the LM task and its dense baseline)
from hvdrun import LaunchError, run_script, write_result  # noqa: E402

#: diloco-<name>: the outer compression (``int8-ef`` is DiLoCo's default)
COMPRESSIONS = {"dense": {"compressor": "none"}, "int8": {"compressor": "int8"},
                "int8-ef": {"compressor": "int8", "ef": "vanilla"},
                "topk": {"compressor": "topk", "k": 0.03, "ef": "vanilla"},
                "topk1": {"compressor": "topk", "k": 0.01, "ef": "vanilla"}}
LM_DEFAULTS = ["--task", "lm", "--optimizer", "adamw", "--betas", "0.9,0.95", "--lr", "0.002", "--clip", "0.5"]


def method_settings(method: str, args) -> tuple:
    """``'diloco-topk@H=100@outer_lr=0.5@mu=0'`` -> ``('topk', {'sync_every': 100, 'outer_lr': 0.5,
    'outer_momentum': 0.0})`` (unset: ``--sync-every``, ``--outer-lr``, ``--outer-momentum``)."""
    name, *overrides = method.split("@")
    kind = name.removeprefix("diloco-")
    if not name.startswith("diloco-") or kind not in COMPRESSIONS:
        raise SystemExit(f"diloco: method {method!r}: allowed: dp or diloco-<{'|'.join(COMPRESSIONS)}>[@H=N][@outer_lr=X][@mu=X]")
    settings = {"sync_every": args.sync_every, "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum}
    for text in overrides:
        key, _, value = text.partition("=")
        if key == "H":
            settings["sync_every"] = int(value)
        elif key == "outer_lr":
            settings["outer_lr"] = float(value)
        elif key == "mu":
            settings["outer_momentum"] = float(value)
        else:
            raise SystemExit(f"diloco: method {method!r}: override {text!r}: allowed: H=N, outer_lr=X, mu=X")
    return kind, settings


def train_diloco(method: str, args, data) -> dict:
    """One DiLoCo run of the LM task (module doc)."""
    import horovod.torch as hvd
    import torch
    from lm_train import build_model, lm_loss, parameter_checksum, sample_batch, validation_bits_per_byte

    import hvdcompress.torch as hvc

    kind, settings = method_settings(method, args)
    train_text, val_text = data
    torch.manual_seed(args.seed)
    model = build_model(args.model, args.embed, args.hidden)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                              betas=convergence.parse_betas(args.betas))
    opt = hvc.DiLoCo(inner, named_parameters=[(f"{method}.{n}", p) for n, p in model.named_parameters()],
                     compression=COMPRESSIONS[kind], **settings)
    gen = torch.Generator().manual_seed(args.seed + 1 + hvd.rank())  # convergence.py's batches
    evaluate = lambda: validation_bits_per_byte(model, val_text, args.seq_len, args.val_bytes)
    curve, start = [(0, evaluate())], time.perf_counter()
    for step in range(1, args.steps + 1):
        if args.schedule == "cosine":
            for group in inner.param_groups:
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / args.steps))
        x, y = sample_batch(train_text, args.batch, args.seq_len, gen)
        opt.zero_grad()
        lm_loss(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)   # each site its own
        opt.step()
        if step == args.steps and step % opt.sync_every:
            opt.sync()   # end on a sync: the sites' parameters are one model again
        if step % opt.sync_every == 0 or step == args.steps:
            curve.append((step, evaluate()))
    return {"method": method, "curve": curve, "final_bpb": curve[-1][1], "seconds": time.perf_counter() - start,
            "sync_every": opt.sync_every, "bytes": opt.total_bytes.as_dict(),
            "checksum": parameter_checksum(model)}


def worker(args) -> None:
    """In each Horovod rank: every method in turn; every rank reports each (its checksum)."""
    import horovod.torch as hvd
    import torch
    from lm_train import load_corpus
    torch.set_num_threads(1)
    hvd.init()
    data = load_corpus()
    for method in args.methods:
        if method == "dp":
            res = {**convergence.train_lm("hvd-dense", args, data), "method": "dp", "checksum": None}
        else:
            res = train_diloco(method, args, data)
        write_result(hvd.rank(), res)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=False)
    ap.add_argument("--methods", type=lambda s: s.split(","), default=["dp", "diloco-dense", "diloco-int8-ef"])
    ap.add_argument("--sites", type=int, default=2, help="ranks, each a site (horovodrun -np)")
    ap.add_argument("--sync-every", type=int, default=50)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--json", default=str(HERE / "results" / "diloco.json"))
    ap.add_argument("--timeout", type=float, default=3600.0, help="for the launch")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ours, rest = ap.parse_known_args(argv)
    lm = convergence.parse_args([*LM_DEFAULTS, *rest])
    return argparse.Namespace(**{**vars(lm), **vars(ours)}), rest


def print_table(rows: dict, dense_per_step: float) -> None:
    dp = rows.get("dp")
    print(f"\n{'method':<28}{'H':>5}{'bpb':>8}{'vs dp':>9}{'sent MB':>10}{'fewer':>9}  ranks equal")
    for m, per_rank in rows.items():
        r = per_rank[0]
        sent = r["bytes"]["sent"] if r["bytes"] else dense_per_step * r["curve"][-1][0]
        diff = f"{r['final_bpb'] - dp[0]['final_bpb']:+9.3f}" if dp else f"{'-':>9}"
        same = "-" if r["checksum"] is None else str(len({q["checksum"] for q in per_rank}) == 1)
        print(f"{m:<28}{r.get('sync_every') or 1:>5}{r['final_bpb']:>8.3f}{diff}{sent / 1e6:>10.2f}"
              f"{dense_per_step * r['curve'][-1][0] / sent:>9.0f}  {same}")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args, rest = parse_args(argv)
    if args.worker:
        worker(args)
        return
    flags = ["--worker", "--methods", ",".join(args.methods), "--sync-every", str(args.sync_every),
             "--outer-lr", str(args.outer_lr), "--outer-momentum", str(args.outer_momentum), *rest]
    try:
        launch = run_script(Path(__file__), np=args.sites, args=flags, timeout=args.timeout)
    except LaunchError as e:
        raise SystemExit(f"diloco: {e}")
    rows = {r["method"]: list(per_rank) for per_rank in zip(*launch.results) for r in per_rank[:1]}
    dense_per_step = next(r[0]["bytes"]["dense"] / r[0]["bytes"]["steps"] for m, r in rows.items() if m != "dp")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"argv": argv, "dense_bytes_per_step": dense_per_step, "rows": rows}, indent=1))
    print_table(rows, dense_per_step)
    print(f"diloco: wrote {out}")


if __name__ == "__main__":
    main()
