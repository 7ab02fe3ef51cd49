"""Elastic training with compression: pytorch_train.py's MLP on digits under ``hvd.elastic.run``,
on as many ranks as the host discovery offers, growing and shrinking while it trains.

    echo localhost:2 > hosts.txt
    HVDCOMPRESS_HOSTS=hosts.txt horovodrun -np 2 --min-np 1 --max-np 4 --network-interface lo \
        --host-discovery-script examples/discover_hosts.sh \
        python examples/pytorch_elastic_train.py --params compressor=onebit,ef=vanilla,momentum=nesterov

then, while it trains, ``echo localhost:3 > hosts.txt.new && mv hosts.txt.new hosts.txt`` (replace
the file whole: a discovery that reads it half-written sees no host) adds a rank; ``localhost:1``
takes two away. What hvdcompress adds to Horovod's elastic recipe is one line:
:class:`hvdcompress.torch.elastic.TorchState` in place of ``hvd.elastic.TorchState``. At each
reset it re-plans the exchange for the new world and gives every rank its share of the
error-feedback residuals and momenta of the last commit, so the gradient mass not yet sent is
kept (docs/elastic.md); a joining rank gets the model, the optimizer and its share from rank 0.

Build the optimizer before any other collective (a joining rank runs the optimizer's rank
agreement in its constructor while the others run it in their reset). Each rank reads the shard
``rank::size`` of the data, re-cut at each reset; ``state.commit()`` once per epoch saves the state
a failure goes back to (and gathers the compressor state: one allgather). Each rank writes one
record per epoch with ``hvdrun.write_result`` (epoch, world size, loss, a checksum of the
parameters) and rank 0 a final one with the test accuracy.
"""
from __future__ import annotations

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from compression_cli import add_compression_arguments, compression_from_args  # examples/
from hvdrun import write_result
from pytorch_train import build_model, load_data

import hvdcompress.torch as hvc
from hvdcompress.torch.elastic import TorchState


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_compression_arguments(parser)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)   # a joining rank gets rank 0's parameters in the state's sync
    model = build_model(args.hidden)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression_from_args(parser, args), fusion=args.fusion)
    state = TorchState(model=model, optimizer=opt, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state: TorchState) -> None:
        x_tr, y_tr, _, _ = load_data(hvd.rank(), hvd.size())   # this world's shard
        steps = len(x_tr) // args.batch_size
        while state.epoch < args.epochs:
            order = torch.randperm(len(x_tr), generator=torch.Generator().manual_seed(state.epoch))
            for state.batch in range(state.batch, steps):
                idx = order[state.batch * args.batch_size:(state.batch + 1) * args.batch_size]
                opt.zero_grad()
                F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
                opt.step()
            with torch.no_grad():
                loss = F.cross_entropy(model(x_tr), y_tr).item()
            params = torch.cat([p.detach().view(-1) for p in model.parameters()])
            write_result(hvd.rank(), {"epoch": state.epoch, "world": hvd.size(), "loss": loss,
                                      "param_checksum": float(params.double().sum())})
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()   # also where a host update is noticed: the reset follows

    train(state)
    if hvd.rank() == 0:
        _, _, x_te, y_te = load_data(0, 1)
        with torch.no_grad():
            accuracy = (model(x_te).argmax(1) == y_te).float().mean().item()
        write_result(0, {"final": True, "accuracy": accuracy, "compression": args.compression})


if __name__ == "__main__":
    main()
