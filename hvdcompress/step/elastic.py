"""What the elastic states of every front end share (:class:`SyncEveryReset`).

Horovod skips the state sync of a reset whose host update was a removal only: the ranks that
stay hold the same state already. But the removal and the reset's rendezvous are not one event:
a host that discovery misses once (a slow or failing discovery script, a hosts file read while
it is rewritten) and finds again a moment later is reported as removed, and by the time the
ranks meet at the rendezvous the driver has added a rank for it. That new rank syncs (a
broadcast from rank 0) while the others skipped the sync and step (horovod/horovod#3494): every
rank then waits forever. hvdcompress's states sync at every reset instead: one broadcast of the
model and the optimizer state per removal, against a job that hangs.
"""
from __future__ import annotations

from horovod.common.exceptions import HostsUpdatedInterrupt


class SyncEveryReset:
    """Mixin for a ``horovod.common.elastic.State``: a host update never skips the sync of the
    reset it starts (module doc). ``check_host_updates`` (also run by ``commit()``) is Horovod's,
    whose decision is already the same on every rank; only the skip is dropped."""

    def check_host_updates(self) -> None:
        try:
            super().check_host_updates()  # type: ignore[misc]
        except HostsUpdatedInterrupt:
            raise HostsUpdatedInterrupt(skip_sync=False) from None
