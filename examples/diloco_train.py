"""Train a byte-level language model on sites that sync rarely: hvdcompress.torch.DiLoCo.

    horovodrun -np 2 -H localhost:2 --gloo python examples/diloco_train.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/diloco_train.py --sync-every 50 \
        --params compressor=none                      # dense pseudo-gradients
    horovodrun -np 2 -H localhost:2 --gloo python examples/diloco_train.py --resume-at 100

Every rank is a site: it trains examples/lm_train.py's model on its own batches of the text
that ships with torch (``torch/_torch_docs.py``) with AdamW (betas 0.9, 0.95), its gradients
clipped to ``--clip``, and sends nothing for ``--sync-every`` steps; then the sites exchange
their pseudo-gradients (compressed with ``--params``, BytePS-style key=value pairs for
``hvdcompress.from_params``; default DiLoCo's own, int8 with error feedback), take one
outer Nesterov step and restart from the same parameters. The validation bits/byte is printed
after each sync. ``--resume-at N``: a checkpoint (model + DiLoCo state) is taken at step N and
loaded back, as a restart would. At the end every rank reports (``hvdrun.write_result``) the
curve, its bytes against every-step data parallelism and a checksum of its parameters (equal
on every rank).
"""
from __future__ import annotations

import argparse
import io

import horovod.torch as hvd
import torch
from hvdrun import write_result
from lm_train import build_model, load_corpus, lm_loss, parameter_checksum, sample_batch, validation_bits_per_byte

import hvdcompress.torch as hvc
from hvdcompress.registry import parse_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sync-every", type=int, default=25, help="inner steps between two syncs (H)")
    parser.add_argument("--params", default=None, help="the outer compression, key=value,... (default: DiLoCo's)")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=0.002, help="AdamW's (the inner optimizer)")
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--model", choices=("lstm", "transformer"), default="lstm")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--val-bytes", type=int, default=8192)
    parser.add_argument("--resume-at", type=int, default=0, help="checkpoint and reload at this step (0: never)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    train, val = load_corpus()
    model = build_model(args.model, 64, 128)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    opt = hvc.DiLoCo(inner, named_parameters=model.named_parameters(), sync_every=args.sync_every,
                     compression=parse_params(args.params) if args.params else None, outer_lr=args.outer_lr)
    gen = torch.Generator().manual_seed(args.seed + 1 + hvd.rank())   # each site its own batches
    curve = [(0, validation_bits_per_byte(model, val, args.seq_len, args.val_bytes))]
    for step in range(1, args.steps + 1):
        x, y = sample_batch(train, args.batch_size, args.seq_len, gen)
        opt.zero_grad()
        lm_loss(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()   # the inner AdamW step; every --sync-every steps, the outer sync
        if step % args.sync_every == 0:
            curve.append((step, validation_bits_per_byte(model, val, args.seq_len, args.val_bytes)))
            if hvd.rank() == 0:
                print(f"step {step}: validation {curve[-1][1]:.3f} bits/byte", flush=True)
        if step == args.resume_at:
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
            buffer.seek(0)
            saved = torch.load(buffer)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
    total = opt.total_bytes
    write_result(hvd.rank(), {"curve": curve, "final_bpb": curve[-1][1], "sent_bytes": total.sent,
                              "dense_bytes": total.dense, "param_checksum": parameter_checksum(model)})


if __name__ == "__main__":
    main()
