"""compression="auto" on the torch optimizer under horovodrun: two cases in one launch.

* ``given``: the link given (100 Mbit/s, 50 us), codec time left out (from_params dict): the
  plan is a function of the shapes alone, which the test recomputes;
* ``measured``: compression="auto" as a string: the link measured over the ranks and this
  machine's calibration (HOME points to a fresh directory, so it is calibrated now and cached).

Each trains an MLP for 10 steps with check_replicas=1 (the replicas compared every step) and
reports the plan after the first step, the final plan, the re-plan check, the link and a hash
of the parameters.
"""
import hashlib

import horovod.torch as hvd
import torch
from common import result

import hvdcompress.torch as hvc

CASES = {"given": {"compression": {"compressor": "auto", "link": "100mbit,50us", "calibration": "none"}},
         "measured": {"compression": "auto"}}
STEPS = 10

hvd.init()
torch.set_num_threads(1)
for case, kwargs in CASES.items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), check_replicas=1, **kwargs)
    auto = opt._compression
    gen = torch.Generator().manual_seed(hvd.rank())
    first = None
    for step in range(STEPS):
        x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        first = first or auto.plan
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    result(hvd.rank(), case=case, first=first, plan=auto.plan, checks=auto.checks,
           link=[auto.network.alpha_s, auto.network.beta_bytes_per_s, auto.network.half_duplex_pairs],
           shapes={n: list(p.shape) for n, p in model.named_parameters()},
           predicted=auto.predicted_exchange_s,
           params=hashlib.sha256(params.numpy().tobytes()).hexdigest())

# the cost per tensor in a job (python -m hvdcompress.plan --calibrate-job), on this machine's
# calibration that the "measured" case cached, with few tensors and steps (what it reports, not how fast)
from hvdcompress.plan.__main__ import main as plan_main  # noqa: E402

plan_main(["--calibrate-job", "--device", "cpu", "--job-tensors", "3", "--job-steps", "2",
           "--compressors", "none", "fp16", "int8", "powersgd r4"])
hvd.barrier()   # rank 0 has saved it
from hvdcompress.plan import calibration as cal  # noqa: E402

saved = cal.load(cal.cache_path("cpu"))
result(hvd.rank(), case="job_costs", per_tensor=saved.per_tensor, per_member=saved.per_member,
       codecs=sorted(saved.codecs))
