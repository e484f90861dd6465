#!/bin/sh
# The collective watchdog ends a job with a rank that stops answering: mpirun must exit
# non-zero well before the 60 s guard, with one line naming the victim (the last rank).
# usage: expect_watchdog.sh MODE NP PROBE   (MODE: stop | recv | elsewhere | slow; see
# mpi_watchdog_probe.cpp). "slow" must instead finish normally on every rank.
set -u
mode=$1 np=$2 probe=$3
here=$(dirname "$0")
victim=$((np - 1))
export MTNLG_COLLECTIVE_TIMEOUT=${MTNLG_COLLECTIVE_TIMEOUT:-3}
[ "$mode" = slow ] && export MTNLG_COLLECTIVE_TIMEOUT=30
out=$(timeout -k 5 60 sh "$here/mpirun.sh" "$np" "$probe" "$mode" 2>&1)
rc=$?
echo "$out"
echo "exit status: $rc"
fail() { echo "FAIL: $1"; exit 1; }
if [ "$mode" = slow ]; then
  [ "$rc" -eq 0 ] || fail "a slow rank (1 s, timeout 30 s) ended the job"
  [ "$(echo "$out" | grep -c 'finished')" -eq "$np" ] || fail "not every rank finished"
  echo "$out" | grep -q "did not arrive" && fail "the watchdog fired"
  echo PASS
  exit 0
fi
[ "$rc" -ne 0 ] || fail "the job exited 0"
{ [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && fail "the job hung (killed after 60 s)"
echo "$out" | grep -q "finished" && fail "a rank got through a collective its peer never joined"
echo "$out" | grep -q "^error: rank $victim (tp=0,pp=0,dp=$victim host [^)]*) did not arrive at " || fail "no line naming rank $victim"
case $mode in
  stop) echo "$out" | grep -q "did not arrive at collective #[0-9]* (all_reduce, group dp) after [0-9.]* s: it does not answer" || fail "wrong collective or reason" ;;
  recv) echo "$out" | grep -q "did not arrive at recv (rank 0 waits for it, tag 7, group world) after [0-9.]* s: it does not answer" || fail "wrong transfer or reason" ;;
  elsewhere) echo "$out" | grep -q "did not arrive at collective #[0-9]* (all_reduce, group dp) after [0-9.]* s: it is waiting in recv with rank 0 (group world)" || fail "wrong reason" ;;
esac
echo PASS
