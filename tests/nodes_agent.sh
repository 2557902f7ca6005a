#!/bin/sh
# The "remote shell" tests/nodes.py gives the MPI launcher: runs a command on a fake node by
# entering that node's namespaces. Called as `nodes_agent.sh [options] HOST COMMAND...` (the
# launcher's ssh-style options are ignored); the holder PID of HOST is in
# $HPCCOMM_TEST_NODES/HOST.pid.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
pid=$(cat "$HPCCOMM_TEST_NODES/$host.pid") || exit 255
exec nsenter --target "$pid" --uts --mount -- /bin/sh -c "$*"
