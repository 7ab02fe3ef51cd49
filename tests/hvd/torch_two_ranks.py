"""The 2-rank torch optimizer scripts of tests/test_torch_optimizer.py in one launch (one torch
and Horovod start-up instead of five): each script runs in turn in this process and its
records carry ``script=<name>`` (:data:`common.SOURCE`). The agreement errors of
torch_mismatch.py run last."""
import runpy
import sys
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
SCRIPTS = ("torch_aggregate", "torch_dgc_equivalence", "torch_ef_conservation", "torch_edge",
           "torch_mismatch")

for name in SCRIPTS:
    common.SOURCE = name
    sys.argv = [str(HERE / f"{name}.py")]
    runpy.run_path(str(HERE / f"{name}.py"), run_name="__main__")
