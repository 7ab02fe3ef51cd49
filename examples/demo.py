"""`make demo`: dense vs DGC on scikit-learn's digits, 2 Horovod workers, one table.

Runs examples/pytorch_train.py under ``horovodrun -np 2 -H localhost:2 --gloo`` once per
compression and prints test accuracy, mean step time and the gradient bytes one rank sends per
step once warm-up is over. Extra arguments go to the training script (e.g. ``--epochs 5``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUNS = ["dense", "dgc"]


def run(compression: str, extra: list) -> dict:
    horovodrun = Path(sys.executable).parent / "horovodrun"
    cmd = [str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
           str(HERE / "pytorch_train.py"), "--compression", compression, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env)
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
               if "RESULT " in line]
    if proc.returncode != 0 or len(results) != 2:
        sys.exit(f"demo: '{' '.join(cmd)}' failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    if results[0]["param_checksum"] != results[1]["param_checksum"]:
        sys.exit(f"demo: ranks ended with different parameters in the {compression} run")
    return min(results, key=lambda r: r["rank"])


def main() -> None:
    rows = [run(c, sys.argv[1:]) for c in RUNS]
    dense = rows[0]
    print("\n2 workers, scikit-learn digits, MLP 64-2048-2048-10 (4.3M parameters), SGD momentum 0.9")
    print(f"{'compression':<12}{'test acc':>10}{'step ms':>10}{'grad bytes/step':>18}{'vs dense':>10}")
    for r in rows:
        print(f"{r['compression']:<12}{100 * r['accuracy']:>9.2f}%{r['step_ms']:>10.1f}"
              f"{r['sent_bytes']:>18,}{dense['sent_bytes'] / r['sent_bytes']:>9.0f}x")
    gap = 100 * (dense["accuracy"] - rows[-1]["accuracy"])
    print(f"\nDGC accuracy gap to dense: {gap:+.2f} points; "
          f"bytes sent per step: {dense['sent_bytes'] / rows[-1]['sent_bytes']:.0f}x fewer")


if __name__ == "__main__":
    main()
