"""The 2-rank cases of tests/test_tf_state_change.py in one launch (one TensorFlow start-up):
amp.py's and keras_lso.py's loss-scaling cases (Keras 2 only: they need its
LossScaleOptimizer), then ``resume.py DIR save``.

    two_ranks.py DIR
"""
import runpy
import sys
from pathlib import Path

import tensorflow as tf

HERE = Path(__file__).resolve().parent
work = sys.argv[1]
if not getattr(tf.keras, "__version__", "2").startswith("3"):   # Keras 2's LossScaleOptimizer (the tape's scaler=)
    for script in ("amp.py", "keras_lso.py"):
        sys.argv = [str(HERE / script)]
        runpy.run_path(str(HERE / script), run_name="__main__")
sys.argv = [str(HERE / "resume.py"), work, "save"]
runpy.run_path(str(HERE / "resume.py"), run_name="__main__")
