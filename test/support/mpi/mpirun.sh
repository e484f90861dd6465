#!/bin/sh
# Runs PROGRAM under `mpirun -np NP` with flags that work in a container and on a
# laptop: oversubscription (more ranks than cores), shared memory + self transports
# only (no network probing), no CPU binding, and --allow-run-as-root only as root.
# usage: test/support/mpi/mpirun.sh NP PROGRAM [ARGS...]
set -eu
np=$1
shift
flags="-np $np --oversubscribe --bind-to none"
if [ "$(id -u)" = 0 ]; then
  flags="$flags --allow-run-as-root"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
# Shared-memory transport: "vader" in Open MPI 4, "sm" in 5. The single-copy
# mechanism (CMA/ptrace) is often forbidden in containers, so use plain copies.
if mpirun --version 2>/dev/null | grep -q 'Open MPI) 4'; then
  export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
else
  export OMPI_MCA_btl=self,sm OMPI_MCA_btl_sm_single_copy_mechanism=none
fi
# Everything is on this host: never look for ssh/rsh, never probe network interfaces.
export OMPI_MCA_plm_rsh_agent=false OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl_tcp_if_include=lo
# The transport list above excludes InfiniBand/UCX components that print warnings.
export OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx
# shellcheck disable=SC2086
exec mpirun $flags "$@"
