"""What a rank forked by tests/zygote.py sees (tests/test_zygote.py): its argv, environment,
session, thread count and hash seed, as a fresh process would; exits with argv[1]'s code."""
import os
import sys

import horovod.torch as hvd
import torch
from common import result

hvd.init()
result(hvd.rank(), argv=sys.argv[1:], main=__name__, rank_env=os.environ["HOROVOD_RANK"],
       own_session=os.getsid(0) == os.getpid(), threads=torch.get_num_threads(),
       hash=hash("hvdcompress"), probe=os.environ.get("HVDC_PROBE"), path=sys.path,
       forked="torch._dynamo" in sys.modules, total=hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
hvd.shutdown()
sys.exit(int(sys.argv[1]))
