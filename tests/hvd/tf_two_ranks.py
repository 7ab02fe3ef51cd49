"""The 2-rank TensorFlow scripts of tests/test_tf_horovod.py that need no process set of their
own, in one launch (one TensorFlow and Horovod start-up instead of five): each runs in turn in
this process and its records carry ``script=<name>`` (:data:`common.SOURCE`).

    tf_two_ranks.py CHECKPOINT_DIR      (tf_state.py's --dir)
"""
import runpy
import sys
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
SCRIPTS = {"tf_sparse_sum": [], "tf_warmup": [], "tf_state": ["--dir", sys.argv[1]], "tf_front_end": [], "tf_fusion": []}

for name, args in SCRIPTS.items():
    common.SOURCE = name
    sys.argv = [str(HERE / f"{name}.py"), *args]
    runpy.run_path(str(HERE / f"{name}.py"), run_name="__main__")
