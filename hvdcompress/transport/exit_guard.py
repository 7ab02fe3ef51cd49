"""Keep a finished rank from shutting Horovod down under ranks that still exchange.

Horovod shuts every rank down when one rank shuts down (its ``atexit`` handler): an operation
still in flight on another rank then fails with "Horovod has been shut down", and one not yet
started with "Process set provided does not exist". With one global process set this cannot
bite at the end of training: no rank finishes a global collective before every rank has joined
it. With two-level compression the last operations of a step run inside each node's process
set, so the ranks of one node can finish their last step, exit, and kill the last all-gather of a
slower node (seen at 2 x 2 ranks on a loaded machine: ranks 2 and 3 exited cleanly, ranks 0 and
1 failed).

:func:`guard_exit` registers, once per process, an ``atexit`` handler that runs before Horovod's
(handlers run last-registered first, and Horovod registers its own at ``hvd.init``): a global
allreduce of one zero, i.e. a barrier, so no rank shuts down before every rank has finished its
script. It is bounded: after ``HVDCOMPRESS_EXIT_WAIT_SECONDS`` (default 120; 0 turns the guard
off) a rank logs a warning and exits anyway, as it would without the guard. A rank that exits
on an uncaught exception skips the barrier, so Horovod's shutdown still stops the other ranks at
once instead of leaving them to wait. A script that calls ``hvd.shutdown()`` itself shuts down
before this handler runs: call ``hvd.barrier()`` (torch) or an allreduce first.
"""
from __future__ import annotations

import atexit
import logging
import sys
import threading
from typing import Any

from ..contract.validation import env_number
from .collectives import Collectives

log = logging.getLogger("hvdcompress")
WAIT_VARIABLE = "HVDCOMPRESS_EXIT_WAIT_SECONDS"
DEFAULT_WAIT = 120.0
_guarded = False


def exit_wait_seconds() -> float:
    """The bound on the exit barrier, from ``HVDCOMPRESS_EXIT_WAIT_SECONDS`` (>= 0)."""
    return env_number(WAIT_VARIABLE, DEFAULT_WAIT, float,
                      "a number of seconds >= 0 (0 turns the exit barrier off)")


def guard_exit(everyone: Collectives, token: Any) -> None:
    """Register the exit barrier over ``everyone`` (the global process set's collectives),
    allreducing ``token`` (a one-element zero tensor of the framework). Once per process."""
    global _guarded
    if _guarded:  # called at each tensor's first step: register (and read the variable) once
        return
    seconds = exit_wait_seconds()
    _guarded = True
    if seconds == 0:
        return
    atexit.register(_wait_for_every_rank, everyone, token, seconds)


def _wait_for_every_rank(everyone: Collectives, token: Any, seconds: float) -> None:
    if hasattr(sys, "last_value"):  # exiting on an uncaught exception: let Horovod stop the others
        return
    done = threading.Event()

    def barrier() -> None:
        try:
            everyone.wait(everyone.allreduce([token], "hvdcompress.exit_barrier"))
        except Exception:  # Horovod already shut down (hvd.shutdown(), or another rank crashed)
            pass
        finally:
            done.set()

    threading.Thread(target=barrier, name="hvdcompress-exit-barrier", daemon=True).start()
    if not done.wait(seconds):
        log.warning("hvdcompress: gave up waiting %.0f s at exit for the other ranks to finish "
                    "(%s); exiting anyway, which shuts Horovod down on every rank",
                    seconds, WAIT_VARIABLE)
