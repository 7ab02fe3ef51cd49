"""End-to-end step time on emulated links: Horovod dense/fp16, DDP and its hooks, hvdcompress.

For every model, rank count and link rate, one launch (:mod:`netem`) runs every method in the
same processes, one after the other, so ratios come from one run on a shared, noisy machine::

    sudo .venv/bin/python benchmarks/e2e.py                          # full sweep
    sudo .venv/bin/python benchmarks/e2e.py --models mlp --nps 2 --rates 100mbit \\
        --methods nocomm,hvd-dense,dgc
    sudo .venv/bin/python benchmarks/e2e.py --models mlp-s --nps 2,4,8 --hosts-slots 2x2,4x4 \\
        --rates 100mbit --methods nocomm,hvd-dense,int8-ag,int8-a2a,dgc-2l \\
        --json benchmarks/results/e2e_scale.json --scale-plots      # ranks / hosts x slots sweep

Methods (``--methods``, comma separated):
  nocomm        forward, backward and SGD step with no communication: the floor
  hvd-dense     horovod.torch.DistributedOptimizer, fp32
  hvd-fp16      the same with hvd.Compression.fp16
  ddp-dense     torch DistributedDataParallel (gloo, same links), no comm hook: fp32 allreduce
  ddp-fp16      the same with DDP's fp16_compress_hook
  ddp-powersgd  the same with DDP's PowerSGD comm hook
  ddp:<method>  the same with hvdcompress's hook (:mod:`hvdcompress.torch.ddp`) compressing as
                the hvdcompress method after ``ddp:`` does (``ddp:dgc``, ``ddp:topk:k=0.001``,
                ``ddp:int8@collective=alltoall``; two-level on hosts x slots takes its ranks
                per node from Horovod)
  anything else an hvdcompress compressor: a short name from :data:`HVDC_METHODS`, or
                ``compressor[:key=value...][@option=value...]``: the compressor for
                :func:`hvdcompress.from_params` (e.g. ``topk:k=0.001``), then the
                DistributedOptimizer's ``collective`` (``int8@collective=alltoall``) or
                ``intra_node`` (a compressor name: ``dgc@intra_node=fp16``, two-level, run
                only on hosts x slots with ranks per node from Horovod), run through
                hvdcompress.torch.DistributedOptimizer. Methods that from_params rejects here
                (compressor not registered yet, wrong parameter) are skipped with the reason.

``--hosts-slots HxS,...`` adds launches on H emulated hosts of S ranks each (loopback inside a
host, the rate-limited link between hosts); there the measured wire bytes are the host link's
(inter-node traffic) divided by S.

Per method: step time (wall time of the timed steps / steps, all ranks aligned by a barrier),
the split of a step (forward+backward incl. compression in the hooks, synchronize+update),
codec time (compress + decompress per step, measured by wrapping the compressor), bytes per step
per rank by the compressor's accounting and as counted on the rank's interface. The DDP methods
communicate in the backward pass (fwd+bwd); inside DDP's own fp16 and PowerSGD hooks no codec
time is measured. Results go to stdout, ``benchmarks/results/e2e.json`` (merged with earlier
runs, keyed by model/np/rate/method) and ``benchmarks/results/e2e_<model>.png``.
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))  # hvdrun: each rank's results
RESULTS = HERE / "results"
DDP_BUILTIN = ("ddp-dense", "ddp-fp16", "ddp-powersgd")  # DDP alone and with its own hooks
BUILTIN = ("nocomm", "hvd-dense", "hvd-fp16", *DDP_BUILTIN)
DDP_HOOK = "ddp:"  # prefix: an hvdcompress method through hvdcompress.torch.ddp's comm hook
UNTIMED = ("ddp-fp16", "ddp-powersgd")  # codecs inside torch's hooks: no codec time
HVDC_METHODS = {  # short names for hvdcompress configurations (also used by convergence.py)
    "fp16": "fp16",
    "bf16": "bf16",
    "dgc": "dgc:sparsity=0.999",
    "dgc-warmup": "dgc:sparsity=0.999:warmup=4",
    "topk": "topk:k=0.01",
    "topk-ef": "topk:k=0.01:ef=vanilla",
    "onebit": "onebit",
    "onebit-ef": "onebit:ef=vanilla",
    "int8": "int8",
    "randomk": "randomk:k=0.01",
    "randomk-ef": "randomk:k=0.01:ef=vanilla",
    "powersgd": "powersgd:rank=4",
    # error feedback with the optimizer's momentum moved before compression (memory.Momentum)
    "topk-ef-mom": "topk:k=0.01:ef=vanilla:momentum=plain",
    "onebit-ef-mom": "onebit:ef=vanilla:momentum=plain",
    "randomk-ef-mom": "randomk:k=0.01:ef=vanilla:momentum=plain",
    # issue 20: the Adam take-over (FrozenAdam) around compressors without momentum
    "onebit-ef-adam": "onebit:ef=vanilla:adam=frozen",
    "topk-ef-adam": "topk:k=0.01:ef=vanilla:adam=frozen",
    "randomk-ef-adam": "randomk:k=0.01:ef=vanilla:adam=frozen",
    "int8-adam": "int8:adam=frozen",
    "powersgd-adam": "powersgd:rank=4:adam=frozen",
    "powersgd-adam-p": "powersgd:rank=4:adam=frozen:adam_send=preconditioned",   # in Adam's update space
    # the take-over sending each rank's momentum (1-bit Adam's placement) instead of its gradient
    "onebit-ef-adam-m": "onebit:ef=vanilla:adam=frozen:adam_send=momentum",
    "topk-ef-adam-m": "topk:k=0.01:ef=vanilla:adam=frozen:adam_send=momentum",
    "powersgd-adam-m": "powersgd:rank=4:adam=frozen:adam_send=momentum",
    "onebit-ef-adam-ag": "onebit:ef=vanilla:adam=frozen@collective=allgather",
    "int8-adam-ag": "int8:adam=frozen@collective=allgather",
    # issue 12: the collective forced, CSC, two-level
    "int8-ag": "int8@collective=allgather",
    "int8-a2a": "int8@collective=alltoall",
    "onebit-ef-ag": "onebit:ef=vanilla@collective=allgather",
    "onebit-ef-a2a": "onebit:ef=vanilla@collective=alltoall",
    "onebit-ef-mom-a2a": "onebit:ef=vanilla:momentum=plain@collective=alltoall",
    "csc": "csc",
    "dgc-2l": "dgc:sparsity=0.999@intra_node=fp16",
    # two-level on one machine: nodes of 4 ranks emulated (convergence.py at 8 ranks: 2 x 4)
    "dgc-2l4": "dgc:sparsity=0.999@intra_node=fp16@ranks_per_node=4",
    "dgc-warmup-2l4": "dgc:sparsity=0.999:warmup=4@intra_node=fp16@ranks_per_node=4",
}
DEFAULT_METHODS = ",".join(["nocomm", "hvd-dense", "hvd-fp16", "ddp-powersgd", "fp16", "bf16",
                            "dgc", "topk", "onebit-ef", "int8", "randomk", "powersgd"])
POWERSGD_RANK = 4
# One DDP bucket: with several, PowerSGD's second-round allreduces are issued from future
# callbacks in completion order, which differs between ranks on Gloo (collective mismatch,
# "op.preamble.length <= op.nbytes" on torch 2.13). Every DDP method gets the same buckets, so
# DDP methods differ by their hook alone.
DDP_BUCKET_MB = 1024


# ---- models -----------------------------------------------------------------------------------
MLP_WIDTH = {"mlp": 4096, "mlp-s": 1024}
DEEP = (24, 384)   # the "deep" model: blocks of Linear + LayerNorm, width


def build_model(name: str):
    """``mlp``: 4096-4096-4096-10 ReLU MLP, 33.6M parameters, input 4096; ``mlp-s`` the same at
    width 1024, 2.1M parameters (16 ranks on a few cores stay feasible).
    ``cnn``: 4 conv blocks (32-64-128-256 channels) + 2 linear layers on 3x32x32, 2.6M params.
    ``deep``: 24 blocks of Linear(384, 384) + LayerNorm + ReLU, then Linear(384, 10): 98 tensors
    of 3.6M parameters, most of them small (a transformer's many biases and norms)."""
    import torch.nn as nn
    if name == "deep":
        blocks, width = DEEP
        layers = [m for _ in range(blocks) for m in (nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU())]
        return nn.Sequential(*layers, nn.Linear(width, 10))
    if name in MLP_WIDTH:
        w = MLP_WIDTH[name]
        return nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                             nn.Linear(w, 10))
    if name == "cnn":
        blocks = []
        for cin, cout in ((3, 32), (32, 64), (64, 128), (128, 256)):
            blocks += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(256 * 2 * 2, 2048), nn.ReLU(),
                             nn.Linear(2048, 10))
    raise ValueError(f"model {name!r}: allowed: {', '.join(MLP_WIDTH)}, cnn, deep")


def model_input_shape(name: str) -> tuple:
    """Shape of one input sample of :func:`build_model`'s model."""
    if name == "deep":
        return (DEEP[1],)
    return (MLP_WIDTH[name],) if name in MLP_WIDTH else (3, 32, 32)


# ---- methods ------------------------------------------------------------------------------------
def uses_ddp(method: str) -> bool:
    """Whether ``method`` runs torch DistributedDataParallel (needs torch.distributed)."""
    return method in DDP_BUILTIN or method.startswith(DDP_HOOK)


def hvdc_spec(method: str) -> str:
    """The hvdcompress spec of a method that is not built in: ``ddp:`` dropped, a short name
    from HVDC_METHODS expanded (``'ddp:dgc'`` -> ``'dgc:sparsity=0.999'``)."""
    hooked = method.startswith(DDP_HOOK)
    name = method.removeprefix(DDP_HOOK)
    if not hooked and name.startswith("ddp-"):
        raise ValueError(f"method {method!r}: DDP's own methods: {', '.join(DDP_BUILTIN)}; an "
                         f"hvdcompress method through the DDP hook: {DDP_HOOK}<method>")
    if hooked and (not name or name in BUILTIN or name.startswith(("ddp-", DDP_HOOK))):
        raise ValueError(f"method {method!r}: after {DDP_HOOK!r} an hvdcompress method (a short "
                         "name from HVDC_METHODS or compressor[:key=value...][@option=value...]); "
                         f"DDP alone and with its own hooks: {', '.join(DDP_BUILTIN)}")
    return HVDC_METHODS.get(name, name)


def hvdc_params(method: str) -> dict:
    """``'topk:k=0.01'`` (or a short name from HVDC_METHODS, or either after ``ddp:``) ->
    from_params dict. ``warmup=E`` becomes an :class:`~hvdcompress.ExponentialWarmup` over E
    epochs."""
    from hvdcompress import ExponentialWarmup
    name, *pairs = hvdc_spec(method).split("@")[0].split(":")
    params = {"compressor": name, **dict(p.split("=", 1) for p in pairs)}
    if "warmup" in params:
        params["warmup"] = ExponentialWarmup(int(params["warmup"]), unit="epoch")
    return params


def optimizer_options(method: str) -> dict:
    """The DistributedOptimizer (or DDP hook state) keywords after ``@`` in a method:
    ``collective`` as given, ``intra_node`` as a compressor (``@intra_node=fp16`` ->
    ``from_params({"compressor": "fp16"})``), ``ranks_per_node`` as an int (nodes emulated on one
    machine), ``fusion`` as bytes or ``true`` (fused compression, :mod:`hvdcompress.engines.fusion`)."""
    import hvdcompress
    _, *pairs = hvdc_spec(method).split("@")
    options = dict(p.split("=", 1) for p in pairs)
    unknown = set(options) - {"collective", "intra_node", "ranks_per_node", "fusion"}
    if unknown:
        raise ValueError(f"method {method!r}: optimizer option(s) {sorted(unknown)}: allowed: "
                         "collective, intra_node, ranks_per_node, fusion")
    if "fusion" in options:
        options["fusion"] = True if options["fusion"] == "true" else int(options["fusion"])
    if "intra_node" in options:
        options["intra_node"] = hvdcompress.from_params({"compressor": options["intra_node"]})
    if "ranks_per_node" in options:
        options["ranks_per_node"] = int(options["ranks_per_node"])
    return options


def two_level(method: str) -> bool:
    """Whether ``method`` runs the two-level exchange (needs hosts x slots)."""
    return method not in BUILTIN and "intra_node" in hvdc_spec(method)


def method_problem(method: str) -> Optional[str]:
    """Why ``method`` cannot run here (its compressor is not registered, or from_params rejects
    its parameters), or None when it can."""
    if method in BUILTIN:
        return None
    import hvdcompress
    try:
        hvdcompress.from_params(hvdc_params(method))
        optimizer_options(method)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def runnable(methods: list, prog: str) -> list:
    """``methods`` without those that cannot run here (see :func:`method_problem`), saying why."""
    problems = {m: method_problem(m) for m in methods}
    for m, why in problems.items():
        if why is not None:
            print(f"{prog}: skipping {m}: {why}")
    return [m for m in methods if problems[m] is None]


class CodecTimer:
    """Accumulates the wall time spent in wrapped compress/decompress calls."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, fn: Callable) -> Callable:
        """``fn`` timed; a returned hvdcompress Packet's ``resume`` (PowerSGD's second round) too."""
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            if getattr(out, "resume", None) is not None:
                out.resume = self.wrap(out.resume)
            return out
        return timed

    def timed_class(self, cls: type, names: tuple) -> type:
        """A subclass of ``cls`` (same name) whose methods ``names`` are timed."""
        attrs = {}
        for name in names:
            if hasattr(cls, name):
                static = isinstance(inspect.getattr_static(cls, name), staticmethod)
                fn = self.wrap(getattr(cls, name))
                attrs[name] = staticmethod(fn) if static else fn
        return type(cls.__name__, (cls,), attrs)


def timed_compressor(method: str, timer: CodecTimer):
    """``method``'s hvdcompress compressor (:func:`hvdc_params`), its codec timed by ``timer``."""
    import hvdcompress
    compressor = hvdcompress.from_params(hvdc_params(method))
    compressor.__class__ = timer.timed_class(type(compressor),
                                             ("compress", "decompress", "decompress_gathered"))
    return compressor


def make_method(method: str, model, timer: CodecTimer, lr: float = 0.01, momentum: float = 0.9,
                prefix: str = "") -> tuple:
    """``(model, optimizer, counter)`` for one method: the model is wrapped in DDP for the DDP
    methods (:func:`uses_ddp`); ``counter`` holds the hvdcompress methods' ``last_step_bytes``
    (their DistributedOptimizer, or the DDP hook's exchange), None for the built-in methods.

    Parameter names get ``prefix`` so Horovod never sees one name with two shapes or dtypes.
    """
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    named = [(prefix + n, p) for n, p in model.named_parameters()]
    if method == "nocomm":
        return model, opt, None
    if method in ("hvd-dense", "hvd-fp16"):
        import horovod.torch as hvd
        compression = hvd.Compression.none
        if method == "hvd-fp16":
            compression = timer.timed_class(hvd.Compression.fp16, ("compress", "decompress"))
        return model, hvd.DistributedOptimizer(opt, named_parameters=named,
                                               compression=compression), None
    if uses_ddp(method):
        return make_ddp(method, model, opt, timer)
    import hvdcompress.torch as hvc
    opt = hvc.DistributedOptimizer(opt, named_parameters=named,
                                   compression=timed_compressor(method, timer),
                                   **optimizer_options(method))
    return model, opt, opt


def make_ddp(method: str, model, opt, timer: CodecTimer) -> tuple:
    """:func:`make_method` for a DDP method: ``model`` in DistributedDataParallel with the
    method's comm hook (none for ``ddp-dense``); the counter is the hvdcompress hook's exchange.
    A two-level ``ddp:`` method without ``ranks_per_node`` takes Horovod's local size."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel
    wrapped = DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_MB)
    if method == "ddp-dense":
        return wrapped, opt, None
    if method == "ddp-fp16":
        wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)  # None: default group
        return wrapped, opt, None
    if method == "ddp-powersgd":
        wrapped.register_comm_hook(psgd.PowerSGDState(process_group=None,
                                                      matrix_approximation_rank=POWERSGD_RANK,
                                                      start_powerSGD_iter=2), psgd.powerSGD_hook)
        return wrapped, opt, None
    from hvdcompress.torch import ddp
    options = optimizer_options(method)
    if "intra_node" in options and "ranks_per_node" not in options:
        import horovod.torch as hvd
        options["ranks_per_node"] = hvd.local_size()
    state = ddp.CompressionState(compression=timed_compressor(method, timer), optimizer=opt,
                                 named_parameters=wrapped.named_parameters(), **options)
    wrapped.register_comm_hook(state, ddp.compression_hook)
    return wrapped, opt, state.exchange


def make_optimizer(method: str, model, timer: CodecTimer, lr: float = 0.01,
                   momentum: float = 0.9, prefix: str = "") -> tuple:
    """``(model, optimizer)`` of :func:`make_method` (convergence.py trains with them)."""
    return make_method(method, model, timer, lr, momentum, prefix)[:2]


def accounted_bytes(method: str, model, counter) -> int:
    """One rank's payload bytes per step by the method's own accounting (``counter``: see
    :func:`make_method`)."""
    dense = sum(p.numel() * 4 for p in model.parameters())
    if method == "nocomm":
        return 0
    if method in ("hvd-dense", "ddp-dense"):
        return dense
    if method in ("hvd-fp16", "ddp-fp16"):
        return dense // 2
    if method == "ddp-powersgd":  # P and Q of each matrix, vectors dense
        return sum(4 * (p.numel() if p.dim() <= 1 else
                        POWERSGD_RANK * (p.shape[0] + p.numel() // p.shape[0]))
                   for p in model.parameters())
    return counter.last_step_bytes.sent


# ---- worker (runs in each rank's namespace) -------------------------------------------------------
def iface_bytes() -> int:
    """Bytes this rank's eth0 has sent so far."""
    return int(Path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def run_method(method: str, args) -> dict:
    """Warm up, time, and measure one method in this rank; return its numbers."""
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    timer = CodecTimer()
    model, opt, counter = make_method(method, build_model(args.model), timer, prefix=f"{method}.")
    x = torch.randn(args.batch, *model_input_shape(args.model))
    y = torch.randint(0, 10, (args.batch,))
    split = {"fwd_bwd": 0.0, "sync_update": 0.0}

    def step() -> None:
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        split["fwd_bwd"] += t1 - t0
        split["sync_update"] += time.perf_counter() - t1

    def barrier(tag: str) -> None:
        hvd.allreduce(torch.zeros(1), name=f"barrier.{method}.{tag}")

    barrier("start")
    for _ in range(args.warmup):
        t0 = time.perf_counter()
        step()
        warm = time.perf_counter() - t0
    steps = hvd.broadcast_object(max(args.min_steps, min(args.steps, int(args.budget_s / warm))),
                                 root_rank=0, name=f"steps.{method}")
    barrier("timed")
    timer.seconds, split["fwd_bwd"], split["sync_update"] = 0.0, 0.0, 0.0
    tx0, t0 = iface_bytes(), time.perf_counter()
    for _ in range(steps):
        step()
    barrier("end")
    elapsed = time.perf_counter() - t0
    wire = iface_bytes() - tx0
    auto = getattr(opt, "_compression", None)   # compression="auto": its plan and re-plan check
    picked = {"auto_plan": auto.plan, "auto_checks": auto.checks} if hasattr(auto, "checks") else {}
    return {**picked, "method": method, "steps": steps, "step_s": elapsed / steps,
            "fwd_bwd_s": split["fwd_bwd"] / steps, "sync_update_s": split["sync_update"] / steps,
            "codec_s": None if method in UNTIMED else timer.seconds / steps,
            "accounted_bytes": accounted_bytes(method, model, counter),
            "wire_bytes": wire / steps,
            "params": sum(p.numel() for p in model.parameters())}


def worker(args) -> None:
    """Entry point in each rank: run every method, report one record per method."""
    import horovod.torch as hvd
    import torch
    from hvdrun import write_result
    torch.set_num_threads(args.threads)
    if any(two_level(m) for m in args.methods):
        import hvdcompress.torch as hvc
        hvd.init(process_sets=hvc.node_process_sets())
    else:
        hvd.init()
    if any(uses_ddp(m) for m in args.methods):
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
    for method in args.methods:
        res = run_method(method, args)
        write_result(hvd.rank(), res)


# ---- driver ---------------------------------------------------------------------------------------
def aggregate(rank_results: list, slots: int = 1) -> dict:
    """One row from every rank's numbers: slowest rank's times, mean bytes and codec time. With
    ``slots`` ranks per host, each rank counted its host link's bytes: the row keeps 1/slots."""
    first = rank_results[0]
    row = {k: first[k] for k in ("method", "steps", "params", "accounted_bytes", "auto_plan", "auto_checks")
           if k in first}
    for key in ("step_s", "fwd_bwd_s", "sync_update_s"):
        row[key] = max(r[key] for r in rank_results)
    row["codec_s"] = None if first["codec_s"] is None else \
        sum(r["codec_s"] for r in rank_results) / len(rank_results)
    row["wire_bytes"] = sum(r["wire_bytes"] for r in rank_results) / len(rank_results) / slots
    return row


def add_ratios(rows: list, rate_bps: int, slots: int = 1) -> None:
    """Speedup over hvd-dense, slowdown over nocomm (when they ran in the same launch), and where
    the step goes: ``compute_s`` (the nocomm step), ``codec_s``, ``wire_s`` (the bytes this rank
    sent at the link rate; with hosts x slots: what the host link carried) and ``other_s``, the
    rest: latency, waiting on peers and on Horovod's cycle, communication not overlapped, CPU
    contention."""
    by = {r["method"]: r for r in rows}
    for r in rows:
        r["speedup_vs_dense"] = by["hvd-dense"]["step_s"] / r["step_s"] if "hvd-dense" in by else None
        r["x_nocomm"] = r["step_s"] / by["nocomm"]["step_s"] if "nocomm" in by else None
        r["wire_s"] = r["wire_bytes"] * slots * 8 / rate_bps
        r["compute_s"] = by["nocomm"]["step_s"] if "nocomm" in by else None
        r["other_s"] = None if r["compute_s"] is None else \
            r["step_s"] - r["compute_s"] - (r["codec_s"] or 0.0) - r["wire_s"]


def fmt(v, spec: str) -> str:
    """``v`` formatted, or '-' when missing."""
    return "-" if v is None else format(v, spec)


def print_table(key: str, rows: list) -> None:
    """The rows of one launch as a text table on stdout."""
    print(f"\n== {key}")
    print(f"{'method':<14}{'step s':>8}{'vs dense':>9}{'x floor':>8}{'fwd+bwd':>8}{'sync':>7}"
          f"{'codec':>7}{'wire s':>7}{'other':>7}{'acct MB':>9}{'wire MB':>9}{'wire/acct':>10}")
    for r in rows:
        ratio = r["wire_bytes"] / r["accounted_bytes"] if r["accounted_bytes"] else None
        print(f"{r['method']:<14}{r['step_s']:>8.3f}{fmt(r['speedup_vs_dense'], '>8.1f')}x"
              f"{fmt(r['x_nocomm'], '>7.1f')}x{r['fwd_bwd_s']:>8.3f}{r['sync_update_s']:>7.3f}"
              f"{fmt(r['codec_s'], '>7.3f')}{r['wire_s']:>7.3f}{fmt(r['other_s'], '>7.3f')}"
              f"{r['accounted_bytes'] / 1e6:>9.2f}{r['wire_bytes'] / 1e6:>9.2f}{fmt(ratio, '>10.2f')}")


def crossover_bps(points: list) -> Optional[float]:
    """The link rate where speedup over dense falls through 1, log-interpolated between the
    measured ``(rate_bps, speedup)`` points (sorted by rate); None when it never does."""
    for (r0, s0), (r1, s1) in zip(points, points[1:]):
        if s0 >= 1.0 > s1:
            f = math.log(s0) / (math.log(s0) - math.log(s1))
            return math.exp(math.log(r0) + f * (math.log(r1) - math.log(r0)))
    return None


def print_crossovers(results: dict) -> None:
    """Per model, rank count and method: below which link rate it beats Horovod dense."""
    print("\n== crossover: compression pays below this link rate (speedup over hvd-dense = 1)")
    groups = sorted({(v["model"], v["np"]) for v in results.values()})
    for model, np_ in groups:
        runs = sorted((v for v in results.values() if v["model"] == model and v["np"] == np_),
                      key=lambda v: v["rate_bps"])
        cells = []
        for m in (r["method"] for r in runs[0]["rows"]):
            pts = [(v["rate_bps"], r["speedup_vs_dense"]) for v in runs for r in v["rows"]
                   if r["method"] == m and r["speedup_vs_dense"] is not None]
            if m in ("hvd-dense", "nocomm") or not pts:
                continue
            x = crossover_bps(pts)
            where = (f"{x / 1e9:.2f} Gbit/s" if x else
                     f"> {pts[-1][0] / 1e9:g} Gbit/s" if pts[-1][1] >= 1 else
                     f"< {pts[0][0] / 1e9:g} Gbit/s")
            cells.append(f"{m} {where}")
        print(f"{model} np{np_}: " + "; ".join(cells))


def run_sweep(args) -> dict:
    """One launch per (model, np, rate); returns and saves the merged results."""
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.netem import launch
    out = Path(args.json)
    results = json.loads(out.read_text()) if out.exists() else {}
    methods = runnable(args.methods, "e2e")
    layouts = [(np_, 1) for np_ in args.nps] + args.hosts_slots
    for model in args.models:
        for hosts, slots in layouts:
            np_ = hosts * slots
            here = [m for m in methods if slots > 1 or not two_level(m)]
            for rate in args.rates:
                key = f"{model}/np{np_}/{rate}" if slots == 1 else f"{model}/{hosts}x{slots}/{rate}"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", model,
                       "--methods", ",".join(here), *worker_flags(args)]
                res = launch(cmd, np_, rate, args.delay_ms, timeout=args.timeout, echo=args.verbose,
                             env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)), slots=slots)
                if not res.ok:
                    print(f"e2e: {key} failed (rank {res.failed_rank}):\n{res.outputs[res.failed_rank][-4000:]}")
                    continue
                rows = [aggregate(list(ranks), slots) for ranks in zip(*res.results)]
                add_ratios(rows, res.rate_bps, slots)
                print_table(key, rows)
                results[key] = {"model": model, "np": np_, "hosts": hosts, "slots": slots,
                                "rate": rate, "rate_bps": res.rate_bps,
                                "delay_ms": args.delay_ms, "batch": args.batch,
                                "threads": args.threads, "rows": rows,
                                "link_bytes": res.link_bytes, "launch_s": res.seconds}
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(results, indent=1))
    return results


def worker_flags(args) -> list:
    """The flags a worker needs from the driver's command line."""
    return ["--batch", str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps),
            "--min-steps", str(args.min_steps), "--budget-s", str(args.budget_s),
            "--threads", str(args.threads)]


def plot(results: dict, out_dir: Path, stem: str = "e2e") -> list:
    """``<stem>_<model>.png`` (the JSON file's stem): speedup over Horovod dense vs link rate,
    one panel per rank count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    for model in sorted({v["model"] for v in results.values()}):
        entries = [v for v in results.values() if v["model"] == model]
        nps = sorted({v["np"] for v in entries})
        fig, axes = plt.subplots(1, len(nps), figsize=(6 * len(nps), 4.5), squeeze=False)
        for ax, np_ in zip(axes[0], nps):
            ax.set_prop_cycle(color=plt.cm.tab20.colors)
            runs = sorted((v for v in entries if v["np"] == np_), key=lambda v: v["rate_bps"])
            methods = [r["method"] for r in runs[0]["rows"] if r["method"] != "hvd-dense"]
            for m in methods:
                pts = [(v["rate_bps"] / 1e9, r["speedup_vs_dense"]) for v in runs for r in v["rows"]
                       if r["method"] == m and r["speedup_vs_dense"] is not None]
                if pts:
                    style = "k--" if m == "nocomm" else "o-"
                    ax.plot(*zip(*pts), style, label="no comm (floor)" if m == "nocomm" else m)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set(xscale="log", yscale="log", xlabel="link rate per rank (Gbit/s)",
                   ylabel="speedup over Horovod dense fp32",
                   title=f"{model}, {np_} ranks, batch {runs[0]['batch']}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{stem}_{model}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def plot_scale(results: dict, out_dir: Path, stem: str) -> list:
    """``<stem>_<model>_bytes.png`` (wire bytes per rank per step vs ranks, log scale) and
    ``<stem>_<model>_step.png`` (step time vs ranks): flat networks as lines, hosts x slots as
    open markers (bytes: the host link's share per rank)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    for model in sorted({v["model"] for v in results.values()}):
        entries = sorted((v for v in results.values() if v["model"] == model),
                         key=lambda v: (v.get("slots", 1), v["np"]))
        methods = list(dict.fromkeys(r["method"] for v in entries for r in v["rows"]))
        for what, field, label in (("bytes", "wire_bytes", "bytes sent per rank per step"),
                                   ("step", "step_s", "step time (s)")):
            fig, ax = plt.subplots(figsize=(8, 5.5))
            colors = dict(zip(methods, plt.cm.tab10.colors + plt.cm.Dark2.colors))
            for m in methods if what == "step" else [m for m in methods if m != "nocomm"]:
                for flat in (True, False):
                    pts = [(v["np"], r[field]) for v in entries if (v.get("slots", 1) == 1) == flat
                           for r in v["rows"] if r["method"] == m and (r[field] or what == "step")]
                    if pts:
                        ax.plot(*zip(*pts), "o-" if flat else "s--", color=colors[m],
                                mfc=None if flat else "none",
                                label=m if flat else f"{m} (hosts x slots)")
            ax.set(xscale="log", yscale="log", xlabel="ranks P", ylabel=label,
                   title=f"{model}, {entries[0]['rate']} links; open squares: "
                         + ", ".join(sorted({f"{v['hosts']}x{v['slots']}" for v in entries
                                             if v.get("slots", 1) > 1})))
            ax.set_xticks(sorted({v["np"] for v in entries}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
            fig.tight_layout()
            path = out_dir / f"{stem}_{model}_{what}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            files.append(path)
    return files


def layout(text: str) -> tuple:
    """``'4x4'`` -> ``(4, 4)``: hosts x slots."""
    try:
        hosts, slots = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: HOSTSxSLOTS, e.g. 2x2") from None
    if hosts < 1 or slots < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: hosts >= 1 and slots >= 2 "
                                         "(one slot per host: use --nps)")
    return hosts, slots


def comma_list(text: str) -> list:
    """``'a,b,,c'`` -> ``['a', 'b', 'c']``."""
    return [x for x in text.split(",") if x]


def shared_parser(doc: str, methods: str, nps: list, json_path: Path) -> argparse.ArgumentParser:
    """The options e2e.py and convergence.py share: ranks, methods, output, timeout, --worker."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nps", type=lambda s: [int(x) for x in comma_list(s)], default=nps)
    ap.add_argument("--methods", type=comma_list, default=comma_list(methods))
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per launch")
    ap.add_argument("--json", default=str(json_path))
    ap.add_argument("--report", action="store_true",
                    help="no runs: print the tables and redraw the PNGs from --json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap


def parse_args(argv=None):
    """Command line of both the driver and the worker (``--worker``)."""
    ap = shared_parser(__doc__, DEFAULT_METHODS, [2, 4], RESULTS / "e2e.json")
    ap.add_argument("--models", type=comma_list, default=["mlp", "cnn"])
    ap.add_argument("--hosts-slots", type=lambda s: [layout(x) for x in comma_list(s)], default=[],
                    help="also launch on emulated hosts x slots, e.g. 2x2,4x4")
    ap.add_argument("--scale-plots", action="store_true",
                    help="plot bytes and step time vs ranks instead of speedup vs link rate")
    ap.add_argument("--rates", type=comma_list, default=["100mbit", "1gbit", "10gbit"])
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay on each link end")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps (DDP PowerSGD needs >= 2)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps (at most)")
    ap.add_argument("--min-steps", type=int, default=2, help="timed steps (at least)")
    ap.add_argument("--budget-s", type=float, default=30.0,
                    help="fewer timed steps (not under --min-steps) when the last warm-up step "
                         "says --steps would take longer than this")
    ap.add_argument("--verbose", action="store_true", help="echo the ranks' output")
    ap.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    """Driver: sweep, print, save JSON and plots (or run as a worker with --worker)."""
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.warmup < 1 or ("ddp-powersgd" in args.methods and args.warmup < 2):
        raise SystemExit("e2e: use --warmup >= 1 (>= 2 with ddp-powersgd, which compresses from "
                         "its 3rd step on)")
    if args.report:
        results = json.loads(Path(args.json).read_text())
        for key, entry in results.items():
            add_ratios(entry["rows"], entry["rate_bps"], entry.get("slots", 1))
            print_table(key, entry["rows"])
    else:
        results = run_sweep(args)
    out = Path(args.json)
    if args.scale_plots:
        files = plot_scale(results, out.parent, out.stem)
    else:
        print_crossovers(results)
        files = plot(results, out.parent, out.stem)
    for path in files:
        print(f"e2e: wrote {path}")


if __name__ == "__main__":
    main()
