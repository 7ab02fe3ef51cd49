"""Argument checks of hvdcompress.torch.DistributedOptimizer (one process: no communication
is involved, only the errors and the single-rank behaviour)."""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()


def sgd(model, **kw):
    return torch.optim.SGD(model.parameters(), lr=0.1, **kw)


@pytest.fixture
def model():
    return torch.nn.Linear(3, 2)


@pytest.mark.parametrize("kwargs,error,message", [
    ({"compression": "dgc"}, TypeError, "compression='dgc' is not supported"),
    ({"op": hvd.Adasum}, ValueError, "Adasum, Min, Max and Product do not combine"),
    ({"op": hvd.Sum, "gradient_predivide_factor": 2.0}, ValueError, "needs op=hvd.Average"),
    ({"gradient_predivide_factor": 0.0}, ValueError, "gradient_predivide_factor=0.0"),
    ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step=0: allowed: an integer >= 1"),
    ({"groups": "x"}, ValueError, "groups='x': allowed"),
    ({"compression": {"compressor": "topk", "k": "-1"}}, ValueError, "k=-1 is out of range"),
    ({"clip_grad_norm": 0.0}, ValueError, "clip_grad_norm=0.0: allowed: None or a finite number > 0"),
    ({"clip_grad_norm": float("inf")}, ValueError, "clip_grad_norm=inf: allowed"),
    ({"clip_grad_norm": "1"}, ValueError, "clip_grad_norm='1': allowed"),
    ({"clip_grad_norm": 1.0, "compression": hc.DGC(0.99, clip_norm=2.0)}, ValueError,
     "clip_grad_norm=1.0 and the compressor's clip_norm=2.0 both clip"),
])
def test_bad_arguments(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        hvc.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), **kwargs)


def test_bad_named_parameters(model):
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="duplicates: weight"):
        hvc.DistributedOptimizer(sgd(model), named_parameters=[named[0], named[0]])
    with pytest.raises(ValueError, match="1 optimizer parameter.* not in it"):
        hvc.DistributedOptimizer(sgd(model), named_parameters=named[:1])
    with pytest.raises(ValueError, match="sequence of \\(name, parameter\\) tuples"):
        hvc.DistributedOptimizer(sgd(model), named_parameters=[p for _, p in named])


def test_momentum_applied_twice_is_refused(model):
    with pytest.raises(ValueError, match="momentum would be applied twice"):
        hvc.DistributedOptimizer(sgd(model, momentum=0.9), named_parameters=model.named_parameters(),
                                 compression=hc.DGC(0.99, momentum=0.9))
    with pytest.raises(ValueError, match="dampening=0.1"):
        hvc.DistributedOptimizer(sgd(model, momentum=0.9, dampening=0.1),
                                 named_parameters=model.named_parameters(), compression=hc.DGC(0.99))


def test_taken_over_momentum_is_restored_after_step(model):
    """The wrapped step runs with momentum 0; param_groups keep the user's values."""
    opt = hvc.DistributedOptimizer(sgd(model, momentum=0.9, weight_decay=1e-4, nesterov=True),
                                   named_parameters=model.named_parameters(),
                                   compression=hc.DGC(0.9, min_numel=0))
    before = model.weight.detach().clone()
    model(torch.ones(3)).sum().backward()
    opt.step()
    group = opt.param_groups[0]
    assert (group["momentum"], group["nesterov"], group["weight_decay"]) == (0.9, True, 1e-4)
    assert "momentum_buffer" not in opt.state[model.weight] or opt.state[model.weight]["momentum_buffer"] is None
    assert not torch.equal(before, model.weight)
    assert opt.last_step_bytes.sent < opt.last_step_bytes.dense


def test_old_optimizer_hooks_go_quiet(model):
    """Wrapping the same parameters again leaves the first wrapper's hooks inert."""
    for _ in range(2):
        opt = hvc.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                       compression=hc.TopK(1))
    model(torch.ones(3)).sum().backward()
    opt.step()
    assert opt.total_bytes.steps == 1


def test_multi_round_payloads_are_counted():
    """PowerSGD sends P (rows x r), then Q (cols x r); a 1-D bias goes dense."""
    model = torch.nn.Linear(30, 20)
    opt = hvc.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   compression=hc.PowerSGD(rank=2))
    model(torch.ones(30)).sum().backward()
    opt.step()
    assert opt.last_step_bytes.sent == 4 * (2 * (20 + 30) + 20)
    assert opt.last_step_bytes.dense == 4 * (20 * 30 + 20)
