"""`make demo`: dense vs DGC on scikit-learn's digits, 2 Horovod workers, one table.

Runs examples/pytorch_train.py under ``horovodrun -np 2 -H localhost:2 --gloo`` once per
compression and prints test accuracy, mean step time and the gradient bytes one rank sends per
step once warm-up is over. Extra arguments go to the training script (e.g. ``--epochs 5``).
"""
from __future__ import annotations

import sys
from pathlib import Path

from hvdrun import LaunchError, run_script

HERE = Path(__file__).parent
RUNS = ["dense", "dgc"]
TIMEOUT_S = 1800.0  # a run takes about a minute on 2 cores; a hang ends with the ranks' stderr


def run(compression: str, extra: list) -> dict:
    """One training run of 2 ranks (progress shown live); rank 0's summary."""
    try:
        launch = run_script(HERE / "pytorch_train.py", np=2, timeout=TIMEOUT_S, echo=True,
                            args=["--compression", compression, *extra],
                            env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    except LaunchError as e:
        sys.exit(f"demo: the {compression} run failed: {e}")
    results = launch.records
    if len(results) != 2:
        sys.exit(f"demo: the {compression} run reported {len(results)} results, expected one per rank")
    if results[0]["param_checksum"] != results[1]["param_checksum"]:
        sys.exit(f"demo: ranks ended with different parameters in the {compression} run")
    return results[0]


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
