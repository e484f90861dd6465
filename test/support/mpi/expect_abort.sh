#!/bin/sh
# Checks that a multi-rank job with a failing rank ends non-zero within 30 s.
# usage: expect_abort.sh MODE NP PROBE   (MODE: throw | die; see mpi_abort_probe.cpp)
set -u
mode=$1 np=$2 probe=$3
here=$(dirname "$0")
out=$(timeout -k 5 30 sh "$here/mpirun.sh" "$np" "$probe" "$mode" 2>&1)
rc=$?
echo "$out"
echo "exit status: $rc"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0"; exit 1; fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "FAIL: the job hung (killed after 30 s)"; exit 1; fi
if echo "$out" | grep -q "unexpectedly finished"; then echo "FAIL: a surviving rank finished"; exit 1; fi
if [ "$mode" = throw ] && ! echo "$out" | grep -q "rank 1"; then echo "FAIL: the output does not name rank 1"; exit 1; fi
echo "PASS"
