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
``dp``'s, and whether both ranks ended on the same parameters. ``dp-<method>`` is data-parallel
AdamW with one of ``convergence.py``'s compressed methods every step (``dp-onebit-ef-adam``: onebit
+ error feedback with the Adam take-over).

**Time to the same loss** (``--rate 100mbit``; root): every rank in its own network namespace on a
shaped link (:mod:`benchmarks.netem`), one site per emulated host. Every curve point carries the
training seconds before it (evaluations left out, ``convergence.TimedCurve``); the table gives each
method's seconds to reach the highest final bits/byte of the methods (the loss every one of them
reaches) and any of ``--targets``, linear between the two points around it, and
``--plot PATH`` draws bits/byte against training seconds per method. ``--slots S``: sites of S
ranks (one emulated host each), data parallel inside a site with Horovod's dense allreduce over
the site's process set, DiLoCo across the sites over the ranks of one local index::

    .venv/bin/python benchmarks/diloco.py --model transformer --steps 1000 --rate 100mbit \
        --methods dp,dp-onebit-ef-adam,diloco-int8-ef --plot benchmarks/results/diloco_100mbit.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
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
    named = [(f"{method}.{n}", p) for n, p in model.named_parameters()]
    site, across = site_sets(args.slots)
    if site is not None:   # data parallel inside the site (dense), DiLoCo across the sites
        inner = hvd.DistributedOptimizer(inner, named_parameters=named, process_set=site)
    opt = hvc.DiLoCo(inner, named_parameters=named, compression=COMPRESSIONS[kind], process_set=across, **settings)
    gen = torch.Generator().manual_seed(args.seed + 1 + hvd.rank())  # convergence.py's batches
    curve = convergence.TimedCurve(lambda: validation_bits_per_byte(model, val_text, args.seq_len, args.val_bytes))
    for step in range(1, args.steps + 1):
        convergence.schedule_lr(inner, args, args.lr, step)
        x, y = sample_batch(train_text, args.batch, args.seq_len, gen)
        opt.zero_grad()
        lm_loss(model, x, y).backward()
        if site is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)   # each site its own
            opt.step()
        else:   # Horovod's clipping pattern inside the site: clip the site's mean gradient
            inner.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            with inner.skip_synchronize():
                opt.step()
        if step == args.steps and step % opt.sync_every:
            opt.sync()   # end on a sync: the sites' parameters are one model again
        if step % opt.sync_every == 0 or step == args.steps:
            curve.record(step)
    return {"method": method, "curve": curve.points, "times": curve.times, "final_bpb": curve.points[-1][1],
            "sync_every": opt.sync_every, "bytes": opt.total_bytes.as_dict(),
            "checksum": parameter_checksum(model)}


def site_sets(slots: int) -> tuple:
    """(this rank's site, this rank's ranks of the same local index across the sites) as Horovod
    process sets, with sites of ``slots`` consecutive ranks (the netem launcher's hosts); (None,
    None) for sites of one rank."""
    import horovod.torch as hvd
    if slots == 1:
        return None, None
    world, rank = hvd.size(), hvd.rank()
    sets = {tuple(ps.ranks): ps for ps in SITE_SETS}
    site = tuple(range(rank - rank % slots, rank - rank % slots + slots))
    return sets[site], sets[tuple(range(rank % slots, world, slots))]


SITE_SETS: list = []   # the process sets of --slots > 1, registered at hvd.init


def worker(args) -> None:
    """In each Horovod rank: every method in turn; every rank reports each (its checksum)."""
    import horovod.torch as hvd
    import torch
    from lm_train import load_corpus
    torch.set_num_threads(1)
    world = int(os.environ["HOROVOD_SIZE"])
    if args.slots > 1:
        SITE_SETS.extend(hvd.ProcessSet(list(range(h, h + args.slots))) for h in range(0, world, args.slots))
        SITE_SETS.extend(hvd.ProcessSet(list(range(i, world, args.slots))) for i in range(args.slots))
    hvd.init(process_sets=SITE_SETS or None)
    data = load_corpus()
    for method in args.methods:
        if method == "dp" or method.startswith("dp-"):
            name = "hvd-dense" if method == "dp" else method.removeprefix("dp-")
            res = {**convergence.train_lm(name, args, data), "method": method, "checksum": None}
        else:
            res = train_diloco(method, args, data)
        write_result(hvd.rank(), res)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=False)
    ap.add_argument("--methods", type=lambda s: s.split(","), default=["dp", "diloco-dense", "diloco-int8-ef"])
    ap.add_argument("--sites", type=int, default=2, help="sites (emulated hosts with --rate)")
    ap.add_argument("--slots", type=int, default=1, help="ranks per site (data parallel inside it, dense)")
    ap.add_argument("--sync-every", type=int, default=50)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--rate", default=None, help="each site on an emulated link of this rate (benchmarks.netem: "
                    "e.g. 100mbit, 1gbit; needs root); default: horovodrun on localhost")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="with --rate: the links' one-way delay")
    ap.add_argument("--targets", type=lambda t: [float(v) for v in t.split(",")], default=[],
                    help="bits/byte for time-to-loss columns, comma-separated, besides the highest final value")
    ap.add_argument("--plot", default=None, help="PNG: validation bits/byte against training seconds")
    ap.add_argument("--report", default=None, help="a --json file of an earlier launch: its table and plot again")
    ap.add_argument("--json", default=str(HERE / "results" / "diloco.json"))
    ap.add_argument("--timeout", type=float, default=3600.0, help="for the launch")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ours, rest = ap.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:   # this script's options, then the LM task's (and exit)
        ap.print_help()
        print("\nThe LM task's options (convergence.py --task lm):")
    lm = convergence.parse_args([*LM_DEFAULTS, *rest])
    return argparse.Namespace(**{**vars(lm), **vars(ours)}), rest


def seconds_to(times: list, curve: list, target: float):
    """Training seconds at which ``curve`` first reaches ``target`` bits/byte, linear between the
    two points around it; None if it never does."""
    before = None
    for t, (_, bpb) in zip(times, curve):
        if bpb <= target:
            if before is None:
                return t
            return before[0] + (t - before[0]) * (before[1] - target) / (before[1] - bpb)
        before = (t, bpb)
    return None


def print_table(rows: dict, dense_per_step: float, targets: list) -> None:
    dp = rows.get("dp")
    print(f"\n{'method':<28}{'H':>5}{'bpb':>8}{'vs dp':>9}{'sent MB':>10}{'fewer':>9}{'train s':>9}"
          + "".join(f"{f's to {t:.3f}':>12}" for t in targets) + "  ranks equal")
    for m, per_rank in rows.items():
        r = per_rank[0]
        sent = r["bytes"]["sent"] if r["bytes"] else dense_per_step * r["curve"][-1][0]
        diff = f"{r['final_bpb'] - dp[0]['final_bpb']:+9.3f}" if dp else f"{'-':>9}"
        same = "-" if r["checksum"] is None else str(len({q["checksum"] for q in per_rank}) == 1)
        reach = [seconds_to(r["times"], r["curve"], t) for t in targets]
        print(f"{m:<28}{r.get('sync_every') or 1:>5}{r['final_bpb']:>8.3f}{diff}{sent / 1e6:>10.2f}"
              f"{dense_per_step * r['curve'][-1][0] / sent:>9.0f}{r['times'][-1]:>9.1f}"
              + "".join(f"{'-' if s is None else f'{s:.1f}':>12}" for s in reach) + f"  {same}")


def plot(rows: dict, target: float, title: str, path: str) -> None:
    """Validation bits/byte against training seconds, one line per method (rank 0's clock)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, per_rank in rows.items():
        r = per_rank[0]
        ax.plot(r["times"], [bpb for _, bpb in r["curve"]], "k-" if m == "dp" else "-", label=m, lw=1.2)
    ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.3f}")
    lowest = min(bpb for per_rank in rows.values() for _, bpb in per_rank[0]["curve"])
    ax.set_ylim(lowest - 0.05, target + 0.8)
    ax.set(xlabel="training seconds (evaluation excluded)", ylabel="validation bits/byte", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def launch_ranks(args, flags: list) -> list:
    """Every rank's records: ``horovodrun`` on localhost, or with ``--rate`` one emulated host per
    site (:func:`benchmarks.netem.launch`)."""
    if args.rate is None:
        try:
            return run_script(Path(__file__), np=args.sites * args.slots, args=flags, timeout=args.timeout).results
        except LaunchError as e:
            raise SystemExit(f"diloco: {e}")
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.netem import launch
    res = launch([sys.executable, str(Path(__file__).resolve()), *flags], args.sites * args.slots, args.rate,
                 args.delay_ms, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=args.timeout, echo=False,
                 slots=args.slots)
    if not res.ok:
        raise SystemExit(f"diloco: rank {res.failed_rank} failed:\n{res.outputs[res.failed_rank][-4000:]}")
    return res.results


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args, rest = parse_args(argv)
    if args.worker:
        worker(args)
        return
    flags = ["--worker", "--methods", ",".join(args.methods), "--slots", str(args.slots), "--sync-every", str(args.sync_every),
             "--outer-lr", str(args.outer_lr), "--outer-momentum", str(args.outer_momentum), *rest]
    if args.report:
        rows = json.loads(Path(args.report).read_text())["rows"]
    else:
        results = launch_ranks(args, flags)
        rows = {r["method"]: list(per_rank) for per_rank in zip(*results) for r in per_rank[:1]}
    dense_per_step = next(r[0]["bytes"]["dense"] / r[0]["bytes"]["steps"] for r in rows.values() if r[0]["bytes"])
    target = max(r[0]["final_bpb"] for r in rows.values())   # the loss every method reaches
    out = Path(args.json)
    if not args.report:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"argv": argv, "dense_bytes_per_step": dense_per_step, "target": target,
                                   "rows": rows}, indent=1))
        print(f"diloco: wrote {out}")
    print_table(rows, dense_per_step, [*args.targets, target])
    if args.plot:
        plot(rows, target, f"{args.model}, {args.sites} sites of {args.slots} rank(s), {args.rate or 'localhost'}",
             args.plot)
        print(f"diloco: wrote {args.plot}")


if __name__ == "__main__":
    main()
