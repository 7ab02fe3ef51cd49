#!/bin/sh
# Horovod's host discovery for the elastic tests (tests/test_elastic.py, tests/test_tf_state_change.py):
# the hosts and slots that the test, then rank 0 of the worker, write into $HVDCOMPRESS_HOSTS.
# The first time the file asks for 3 slots, it answers no host at all, as a discovery that misses
# every host once does: Horovod then reports a removal, and the addition a second later, while
# the ranks already reset (horovod/horovod#3494: without a sync at every reset, hvdcompress/elastic.py,
# the joining rank waits in its sync for ranks that skipped theirs).
hosts="$HVDCOMPRESS_HOSTS"
if grep -q ':3$' "$hosts" && mkdir "$hosts.missed" 2>/dev/null; then
    exit 0
fi
exec cat "$hosts"
