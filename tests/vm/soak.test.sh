#!/usr/bin/env bash
# The soak with real guests: two guests with the virtio-rdma device run every RDMA tool, round
# after round, in both directions, with RC loss between their daemons, for VUR_SOAK_SECS
# seconds (default 120); the daemons' memory and fds must stay flat and every tool run succeed.
# See tests/vm/guest-pair.test.sh (mode soak).
#
#   sudo tests/vm/soak.test.sh [TOOL...]
#   sudo VUR_SOAK_SECS=3600 tests/vm/soak.test.sh
exec "$(dirname "${BASH_SOURCE[0]}")/guest-pair.test.sh" soak "$@"
