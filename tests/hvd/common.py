"""Helpers for scripts that run under horovodrun (or the netem launcher)."""
import faulthandler
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # hvdrun
from hvdrun import write_hosts, write_result  # noqa: E402

#: epoch seconds at which a launch's test prints every rank's stacks (tests/conftest.run_elastic)
STACKS_AT_ENV = "HVDCOMPRESS_TEST_STACKS_AT"

#: the script a record comes from, where one launch runs several (torch_scripts.py)
SOURCE = None


def result(rank: int, **values) -> None:
    """Report one record to the test that launched this script (see examples/hvdrun.py),
    with ``script=`` :data:`SOURCE` when a runner set it."""
    write_result(rank, values if SOURCE is None else {"script": SOURCE, **values})


def wait_for_world(state, batch: int, rank: int, world: int, wanted: int, waited: float,
                   wait_s: float) -> None:
    """One wait of an elastic worker whose world (``world`` ranks) is not the ``wanted`` one:
    rank 0 writes the hosts file ($HVDCOMPRESS_HOSTS, read by
    tests/hvd/elastic_discovery.sh); every rank fails once ``wait_s`` seconds passed since
    ``waited`` (time.monotonic()), else sleeps briefly and asks Horovod, which raises
    HostsUpdatedInterrupt once it noticed the new hosts. The file is replaced whole
    (:func:`hvdrun.write_hosts`)."""
    if rank == 0:
        write_hosts(os.environ["HVDCOMPRESS_HOSTS"], wanted)
    if time.monotonic() - waited > wait_s:
        raise RuntimeError(f"batch {batch}: the world stayed at {world} ranks for "
                           f"{wait_s:.0f} s after asking for {wanted}")
    time.sleep(0.5)
    state.check_host_updates()


def dump_stacks_before_kill() -> None:
    """Print every thread's stack to stderr at $HVDCOMPRESS_TEST_STACKS_AT (epoch seconds, set by
    the test a little before it kills a launch that hangs), so its failure shows where each rank
    waited. Nothing when the variable is unset."""
    at = os.environ.get(STACKS_AT_ENV)
    if at:
        faulthandler.dump_traceback_later(max(1.0, float(at) - time.time()))


def save_states(path: str, tensors: dict, key: Callable[[str], str] = str) -> None:
    """Write ``{name: {field: array}}`` to one npz as ``key(name)/field`` (ints and floats, the
    step counters, left out)."""
    np.savez(path, **{f"{key(name)}/{field}": np.asarray(v) for name, st in tensors.items()
                      for field, v in st.items() if not isinstance(v, (int, float))})


def save_reset_states(out: str, batch: int, rank: int, new: dict, old_ranks: list,
                      key: Callable[[str], str] = str) -> None:
    """What an elastic worker writes on entering ``train`` after a reset: its own state as laid
    out for the new world (OUT/b<batch>.new.rank<rank>.npz) and, on rank 0, the last commit's
    gathered states of the old ranks (OUT/b<batch>.old.rank<r>.npz), for the test to check the
    delivered mass (tests/test_reshard.py)."""
    save_states(f"{out}/b{batch}.new.rank{rank}.npz", new, key)
    if rank == 0:
        for r, tensors in enumerate(old_ranks):
            save_states(f"{out}/b{batch}.old.rank{r}.npz", tensors, key)
