#!/usr/bin/env bash
mkdir -p /tmp/ci4 && ln -sfn /work/shared /tmp/ci4/shared  # the clone finds the shared fixtures beside it
# usage: scripts/ci_fresh_clone.sh COMMIT [N_RUNS] [HOG_RUN]: .ci/run on a fresh clone of /work/main, N_RUNS times in a row
# (stops at the first failure), the HOG_RUN-th with a busy loop on one core; logs and summary.txt in /tmp/ci4
rev=$1; n_runs=${2:-4}; hog_run=${3:-4}
for n in $(seq 1 $n_runs); do
  rm -rf /tmp/ci4/c
  git clone -q /work/main /tmp/ci4/c && ln -s /work/shared /tmp/ci4/c/shared 2>/dev/null
  (cd /tmp/ci4/c && git checkout -q "$rev")
  hog=""
  if [ "$n" = "$hog_run" ]; then sh -c 'while :; do :; done' & hog=$!; fi
  t0=$(date +%s)
  (cd /tmp/ci4/c && CI=true bash .ci/run ${CI4_ARGS:-} > /tmp/ci4/run-$n.log 2>&1); rc=$?
  t1=$(date +%s)
  [ -n "$hog" ] && kill $hog
  echo "run $n of $rev (hog=$([ -n "$hog" ] && echo yes || echo no)), exit $rc after $((t1-t0)) s; $(tail -1 /tmp/ci4/run-$n.log)" >> /tmp/ci4/summary.txt
  [ $rc != 0 ] && break
done
