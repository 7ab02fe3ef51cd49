"""Several torch scripts in one launch (one torch and Horovod start-up instead of one per
script): each runs in turn in this process and its records carry ``script=<label>``
(:data:`common.SOURCE`); tests/conftest.py's ``run_scripts`` launches it.

argv[1]: a JSON list of ``[label, script, args, env]`` (script: a file of tests/hvd without
``.py``). ``env`` is set before the script runs; as HVDCOMPRESS_DISABLE_KERNELS is read where the
kernels are first loaded, the runner forgets the loaded kernels whenever it changes, so that one
launch can run the C++ kernels and the plain-torch fallback in turn."""
import json
import os
import runpy
import sys
from pathlib import Path

import common

from hvdcompress.ops import torch_ops as backend

HERE = Path(__file__).resolve().parent

SWITCH = "HVDCOMPRESS_DISABLE_KERNELS"

for label, name, args, env in json.loads(sys.argv[1]):
    if SWITCH in env and env[SWITCH] != os.environ.get(SWITCH, "0"):
        backend._LOADED.clear()  # the test-only switch of kernel paths (see above)
    os.environ.update(env)
    common.SOURCE = label
    sys.argv = [str(HERE / f"{name}.py"), *args]
    runpy.run_path(str(HERE / f"{name}.py"), run_name="__main__")
