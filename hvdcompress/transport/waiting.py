"""Waiting for a collective without burning a core: poll, sleeping between polls with backoff.

Horovod's torch ``synchronize(handle)`` waits in a loop that keeps a core busy: a rank that
waits 8 s for a slower one burns 11 s of CPU (2 ranks, gloo, Horovod 0.28.1;
``benchmarks/wait_cpu.py``). Where ranks share cores (CPU training, more ranks than cores,
data-loading workers beside a GPU rank) the waiting ranks take the cores the others compute on,
so the wait itself makes the slow rank slower. Here the engine polls the handle instead,
sleeping between polls for a share of the time waited so far, within bounds::

    pause = min(cap, max(FIRST_PAUSE_S, SHARE · waited));   done once poll() is true

and only then calls the framework's wait, which returns at once. The trade-off: a collective
that completes while the rank sleeps is seen up to one pause late, at most ``SHARE`` (1/4) of the
wait later for waits over ``FIRST_PAUSE_S / SHARE`` and at most ``cap`` for long ones; a handle
already complete (the usual case after a backward pass that overlapped its collectives) costs
one poll and no sleep. Doubling pauses instead would be up to 100% late on short waits.
``HVDCOMPRESS_WAIT_PAUSE_US`` sets the cap in microseconds (default :data:`DEFAULT_CAP_US`);
0 waits as the framework does (spinning).
"""
from __future__ import annotations

import time
from typing import Callable

from ..contract.validation import env_number

VARIABLE = "HVDCOMPRESS_WAIT_PAUSE_US"
DEFAULT_CAP_US = 1000
FIRST_PAUSE_S = 20e-6
SHARE = 0.25


def pause_cap_seconds() -> float:
    """The longest pause between two polls, from ``HVDCOMPRESS_WAIT_PAUSE_US`` (0: spin)."""
    return 1e-6 * env_number(VARIABLE, DEFAULT_CAP_US, int, "an integer number of microseconds >= 0 "
                             "(0 waits as the framework does, spinning)")


def wait_politely(done: Callable[[], bool], sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> None:
    """Return once ``done()`` is true, sleeping between its calls (module doc); at once when
    the cap is 0 (the caller's own wait then spins). ``sleep`` and ``clock``: for tests."""
    cap = pause_cap_seconds()
    if cap == 0:
        return
    began = clock()
    while not done():
        sleep(min(cap, max(FIRST_PAUSE_S, SHARE * (clock() - began))))
