"""fusion= on the torch optimizer under 2 ranks; each case reports what it saw (tests/test_fusion.py's
numpy references check the numbers in tests/test_torch_optimizer.py)."""
import horovod.torch as hvd
import torch
from common import result
from fusion_data import SIZES, grads
from torch_common import batches, mlp

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
rank = hvd.rank()


class Given(torch.nn.Module):
    """``loss = sum over tensors of sum(p * c)``: each parameter's gradient is exactly its c."""

    def __init__(self):
        super().__init__()
        self.params = torch.nn.ParameterDict({n.replace(".", "_"): torch.nn.Parameter(torch.zeros(k))
                                              for n, k in SIZES.items()})

    def forward(self, cs: dict) -> torch.Tensor:
        return sum((self.params[n.replace(".", "_")] * torch.from_numpy(c)).sum() for n, c in cs.items())


def given(label: str, compression, steps: int) -> None:
    """Exchange the known gradients of :func:`grads` for ``steps`` steps, fused into one bucket."""
    model = Given()
    named = [(n.replace("params.", "").replace("_", "."), p) for n, p in model.named_parameters()]
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), named_parameters=named,
                                   compression=compression, fusion=True)
    out = []
    for step in range(steps):
        opt.zero_grad()
        model(grads(rank, step)).backward()
        opt.step()
        out.append({n: p.grad.tolist() for n, p in sorted(named)})
    result(rank, case=label, grads=out, plan=sorted(opt._exchange.plan),
           state=sorted(opt.state_dict()["hvdcompress"]["tensors"]))


given("ef_onebit", hc.ErrorFeedback(hc.OneBit()), 2)
given("fp16", hc.FP16(), 1)


def train(label: str, make_opt, steps: int = 6) -> None:
    """A small MLP trained with a fused optimizer, the replicas compared at every step."""
    model = mlp(seed=1)
    opt = make_opt(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = [p.detach().clone() for p in model.parameters()]
    for x, y in batches(rank, steps):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    moved = max(float((p.detach() - s).abs().max()) for p, s in zip(model.parameters(), start))
    saved = opt.state_dict(gather=True)
    fresh = make_opt(mlp(seed=1))
    fresh.load_state_dict(saved)   # the same world: this rank's share is its own state again
    same = all(torch.equal(v, fresh._tensor_state[name][k]) for name, st in opt._tensor_state.items()
               for k, v in st.items() if torch.is_tensor(v))
    result(rank, case=label, moved=moved, buckets=sorted(opt._buckets), plan=sorted(opt._exchange.plan),
           reloaded_same=same, params=[p.detach().sum().item() for p in model.parameters()])


def dgc(model):
    """DGC takes the momentum and weight decay over; two param groups: two buckets."""
    groups = [{"params": [model[0].weight, model[0].bias], "weight_decay": 1e-4},
              {"params": [model[2].weight, model[2].bias], "weight_decay": 0.0}]
    return hvc.DistributedOptimizer(torch.optim.SGD(groups, lr=0.1, momentum=0.9),
                                    named_parameters=model.named_parameters(),
                                    compression=hc.DGC(0.99, min_numel=0), fusion=True, check_replicas=1)


def frozen_adam(model, **extra):
    """1-bit Adam's shape: an AdamW warm-up, then error-fed signs of the whole model in one buffer."""
    return hvc.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                    named_parameters=model.named_parameters(), check_replicas=1,
                                    compression={"compressor": "onebit", "ef": "vanilla", "adam": "frozen",
                                                 "freeze_steps": 3, **extra}, fusion=True)


train("dgc_two_groups", dgc)
train("frozen_adam_onebit", frozen_adam)
# the tensors under 4096 elements (0.bias, 2.bias, 2.weight) run live Adam: they fuse apart from 0.weight
train("frozen_adam_small", lambda model: frozen_adam(model, adam_min_numel=4096))
