"""FSDP with compression on an emulated slow link (issue 37): step time, bytes and convergence.

    python benchmarks/fsdp_bench.py --nps 2,4 --rate 100mbit --steps 300 [--json benchmarks/results/fsdp.json]

For each rank count, one launch (:mod:`benchmarks.netem`: each rank in its own network namespace
on a ``--rate`` link, torch.distributed over Gloo) trains examples/lm_train.py's byte-level LSTM
under FSDP2 (``fully_shard`` on each child module and on the model) with SGD (lr 1, momentum
0.9, clip 0.25: the LM benchmark's settings; ``--adamw``: AdamW as under ``--hsdp``), once per method, in turn:

* ``dense``: FSDP's own reduce-scatter (float32);
* ``bf16``: FSDP's bf16 communication (``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``,
  FSDP2's form of the ``bf16_compress_hook``);
* ``int8``, ``onebit_ef``, ``topk_ef`` (5%): :func:`hvdcompress.torch.fsdp.compress`;
* ``int8_ag``: int8 on the reduce-scatter and on the parameters' all-gathers
  (``fsdp.compress(..., all_gather=Int8())``); its bytes are every collective's;
* ``int8_ef``, ``int8_ef_ag``: the same with error feedback on the reduce-scatter
  (``ErrorFeedback(Int8())``; under ``--hsdp``, ``int8_ef`` on the replicate all-reduce).

``--hsdp`` (issue 54): HSDP instead, 2 replicas x P/2 shards (``fully_shard(..., mesh=(replicate,
shard))``), AdamW (lr 0.002, betas 0.9 and ``--beta2``, no clip; ``--schedule cosine``: the learning rate
decays as convergence.py's, else it stays constant), methods ``dense`` (FSDP's own HSDP), ``int8``,
``int8_adam``, ``onebit_ef_adam`` and ``topk_ef_adam`` (1%; the last three with FrozenAdam): the replicate all-reduce compressed
(:mod:`hvdcompress.torch.hsdp`); bytes are those across the replicate dimension
(``state.cross_node_bytes``; dense HSDP's measured with ``set_all_reduce_hook``). A method with
``_serial`` appended (``int8_serial``, ...) is the same method with every shard's exchange
launched at the end of the backward pass instead of as FSDP assigns its gradient (:func:`serialise`):
side by side, the step time the overlap with the backward pass saves.

Every rank reports its median step time (after 5 warm-up steps), the bytes its reduce-scatter
sent (dense from the gradients' size for FSDP's own, ``state.total_bytes`` for ours), and the
validation bits per byte at the end, and the memory it holds after the last step (the bytes of
every live tensor storage, :func:`held_bytes`, less those held before the first method: parameters,
gradients, optimizer and compression state, not the transient buffers of a collective); the table
gives each method's step time, bytes, bits/byte and memory against dense's of the same launch, and
the bytes that crossed the rank's link.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "examples")]
METHODS = ("dense", "bf16", "int8", "int8_ag", "int8_ef", "int8_ef_ag", "onebit_ef", "topk_ef")
HSDP_METHODS = ("dense", "int8", "int8_ef", "int8_adam", "onebit_ef_adam", "topk_ef_adam")
SERIAL = "_serial"   # an HSDP method's suffix: its exchanges launched at the backward pass's end


def compression(method: str, chunk: int = 2048):
    """``method``'s compressor (None: FSDP's own); ``chunk``: the int8 methods' (``Int8(chunk=)``)."""
    import hvdcompress as hc
    method = method[:-len(SERIAL)] if method.endswith(SERIAL) else method
    int8 = hc.Int8(chunk=chunk)
    return {"int8": int8, "int8_ag": int8, "int8_ef": hc.ErrorFeedback(int8),
            "int8_ef_ag": hc.ErrorFeedback(int8), "onebit_ef": hc.ErrorFeedback(hc.OneBit()),
            "topk_ef": hc.ErrorFeedback(hc.TopK(0.05)),
            "int8_adam": {"compressor": "int8", "chunk": str(chunk), "adam": "frozen"},
            "onebit_ef_adam": {"compressor": "onebit", "ef": "vanilla", "adam": "frozen"},
            "topk_ef_adam": {"compressor": "topk", "k": "0.01", "ef": "vanilla", "adam": "frozen"}}.get(method)


def held_bytes() -> int:
    """Bytes of the distinct tensor storages alive in this process (gc's view: every tensor with a
    Python object; a DTensor through its local shard), after collecting until nothing more is
    freed (a cycle held through a finalizer goes on a later pass)."""
    import torch
    while gc.collect():
        pass
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def hsdp_run(model, method: str, args):
    """(optimizer, state or None, the bytes FSDP's own replicate all-reduce sends, appended per call)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hvdcompress.torch import fsdp
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    for child in model.children():
        fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.adam_lr, betas=(0.9, args.beta2))
    sizes: list = []
    made = compression(method, args.int8_chunk)
    if made is None:
        for m in [model, *model.children()]:
            m.set_all_reduce_hook(lambda out: sizes.append(out.numel() * out.element_size()))
        return opt, None, sizes
    state = fsdp.compress(model, compression=made, optimizer=opt)
    if method.endswith(SERIAL):
        serialise(state)
    return opt, state, sizes


def serialise(state) -> None:
    """The ablation of ``_serial`` methods: ``state``'s per-parameter launches (its
    post-accumulate-grad hook, ``HSDPState._accumulated``) held back to the end of the backward
    pass, then run in the order FSDP assigned the gradients; the exchanges, bytes and results are
    the same, only when they start differs."""
    import torch
    launch, held = state._accumulated, []

    def flush() -> None:
        for p in held:
            launch(p)
        held.clear()
        state._end_backward()   # what launch queued runs after this, on an ended step: a no-op

    def hold(p) -> None:
        if not held:
            torch.autograd.Variable._execution_engine.queue_callback(flush)
        held.append(p)

    state._accumulated = hold


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from hvdrun import write_result
    from lm_train import build_model, lm_loss, load_corpus, sample_batch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import hvdcompress as hc
    from hvdcompress.torch import fsdp

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    train, val = load_corpus()
    windows = val[:args.val_bytes - (args.val_bytes - 1) % args.seq_len]
    windows = windows[torch.arange((len(windows) - 1) // args.seq_len)[:, None] * args.seq_len
                      + torch.arange(args.seq_len + 1)]
    baseline = held_bytes()
    for method in args.methods.split(","):
        model = opt = state = None   # the previous method's, before this one's memory is counted
        torch.manual_seed(args.seed)
        model = build_model("lstm", args.embed, args.hidden)
        if args.hsdp:
            opt, state, hsdp_sizes = hsdp_run(model, method, args)
        else:
            policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if method == "bf16" else None)
            for child in model.children():
                fully_shard(child, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
            gather = {"all_gather": hc.Int8()} if method.endswith("_ag") else {}
            made = compression(method, args.int8_chunk)
            state = fsdp.compress(model, compression=made, block=args.block, **gather) if made else None
            opt = torch.optim.AdamW(model.parameters(), lr=args.adam_lr, betas=(0.9, args.beta2)) \
                if args.adamw else torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        gen = torch.Generator().manual_seed(args.seed + rank)
        dense_step = 4 * sum(p.numel() for p in model.parameters())   # the unsharded gradients (DTensor: global numel)
        times, lr = [], opt.param_groups[0]["lr"]
        for step in range(args.steps):
            if args.schedule == "cosine":   # convergence.py's: lr·(1 + cos(π·t/T))/2
                for group in opt.param_groups:
                    group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
            x, y = sample_batch(train, args.batch, args.seq_len, gen)
            begin = time.perf_counter()
            opt.zero_grad()
            loss = lm_loss(model, x, y)
            loss.backward()
            if not args.hsdp and not args.adamw:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            times.append(time.perf_counter() - begin)
        del loss
        held = held_bytes() - baseline
        with torch.no_grad():
            logits = model(windows[:, :-1]).reshape(-1, 256)
            bits = F.cross_entropy(logits, windows[:, 1:].reshape(-1)).item() / math.log(2.0)
        del logits   # 16 MB: else counted in the next method's memory
        counted = state.total_bytes if state is not None else None
        if args.hsdp:   # across the replicate dimension
            counted = state.cross_node_bytes if state is not None else None
            dense_step = sum(hsdp_sizes) // args.steps
        dense = counted.dense if counted else dense_step * args.steps
        sent = counted.sent if counted else dense // (2 if method == "bf16" else 1)
        write_result(rank, {"method": method, "step_s": statistics.median(times[5:]), "bits_per_byte": bits,
                            "dense_bytes": dense, "sent_bytes": sent, "held_bytes": held})
        dist.barrier()
    dist.destroy_process_group()


def sweep(args) -> dict:
    from benchmarks.netem import launch
    out = {}
    for np_ in args.nps:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--methods", args.methods,
               "--steps", str(args.steps), "--seed", str(args.seed), "--block", str(args.block),
               "--int8-chunk", str(args.int8_chunk)] + \
            ["--beta2", str(args.beta2), "--schedule", args.schedule] + (["--hsdp"] if args.hsdp else []) + (["--adamw"] if args.adamw else [])
        res = launch(cmd, np_, args.rate, timeout=args.timeout, echo=False, env=dict(os.environ, OMP_NUM_THREADS="1"),
                     slots=args.slots)
        if not res.ok:
            raise SystemExit(f"fsdp_bench: np {np_} failed:\n{res.outputs[res.failed_rank][-4000:]}")
        rows = {r["method"]: r for r in res.results[0]}
        dense = rows["dense"]
        print(f"np {np_} ({args.slots} per host), {args.rate}: method, step s (x dense), bytes fewer than dense, bits/byte (- dense), "
              "MB held by rank 0 (x dense)")
        for method in args.methods.split(","):
            r = rows[method]
            print(f"  {method:10s} {r['step_s']:.3f} ({r['step_s'] / dense['step_s']:.2f}x)  "
                  f"{r['dense_bytes'] / r['sent_bytes']:.1f}x  {r['bits_per_byte']:.3f} "
                  f"({r['bits_per_byte'] - dense['bits_per_byte']:+.3f})  "
                  f"{r['held_bytes'] / 2 ** 20:.2f} ({r['held_bytes'] / dense['held_bytes']:.2f}x)")
        out[f"np{np_}/{args.rate}"] = {"rows": rows, "link_bytes": res.link_bytes, "seconds": res.seconds,
                                       "steps": args.steps}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--methods", default=None, help="comma-separated, from " + ",".join(METHODS)
                    + "; with --hsdp from " + ",".join(HSDP_METHODS) + f" (each but dense also with {SERIAL})")
    ap.add_argument("--hsdp", action="store_true", help="HSDP, 2 replicas x P/2 shards, AdamW (module doc)")
    ap.add_argument("--adamw", action="store_true",
                    help="FULL_SHARD with AdamW (lr 0.002, betas 0.9 and --beta2, no clip) instead of SGD")
    ap.add_argument("--beta2", type=float, default=0.95, help="AdamW's beta2 under --hsdp or --adamw (beta1 0.9)")
    ap.add_argument("--schedule", choices=("constant", "cosine"), default="constant",
                    help="the learning rate: constant, or convergence.py's cosine decay over --steps")
    ap.add_argument("--block", type=int, default=4096, help="elements per compressed block (fsdp.compress's block=)")
    ap.add_argument("--int8-chunk", type=int, default=2048,
                    help="the int8 methods' chunk on the gradients (Int8(chunk=); the all-gather's stays Int8()'s)")
    ap.add_argument("--nps", default="2,4", type=lambda s: [int(v) for v in s.split(",")])
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--slots", type=int, default=1,
                    help="ranks per emulated host (benchmarks.netem): the links between hosts run at --rate, "
                         "those inside one are the host's own; --hsdp --slots P/2: each replica on one host")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    # the LM benchmark's LSTM and SGD settings (benchmarks/convergence.py --task lm)
    args.batch, args.seq_len, args.embed, args.hidden, args.lr, args.clip, args.val_bytes = 16, 64, 64, 128, 1.0, 0.25, 16384
    args.adam_lr = 0.002   # the LM benchmark's AdamW lr (benchmarks/README.md, section 8)
    args.methods = args.methods or ",".join(HSDP_METHODS if args.hsdp else METHODS)
    if args.worker:
        worker(args)
        return
    results = sweep(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
