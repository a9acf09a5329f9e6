#!/bin/bash
# flowtrace analyze, an older checkout against this one in turns on the same traces, timed in
# CPU seconds of the whole process tree (the JVM included) through a cgroup v1 cpuacct group,
# so that load from other processes does not count (run as root):
#   benchmarks/trace_ab.sh OLD_CHECKOUT OLD_MODULE TRACES [PAIRS]
# e.g. benchmarks/trace_ab.sh /work/base apps.flowtrace.cli /tmp/synth05 2
# (OLD_MODULE: apps.flowtrace.cli before the package renames, flowtrace.cli after)
# NEW_ARGS: extra options for this checkout's side, e.g. NEW_ARGS="--engine spark" (this
# checkout's default, --engine auto, runs a local input up to 64 MiB in plain Python)
set -u
old=$1; oldmod=$2; traces=$3; pairs=${4:-2}
new=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/trace_ab.log}; : > "$out"
cg=/sys/fs/cgroup/cpuacct
for i in $(seq 1 "$pairs"); do
  for side in old new; do
    if [ $side = old ]; then d=$old; mod=$oldmod; extra=""; else d=$new; mod=flowtrace.cli; extra=${NEW_ARGS:-}; fi
    g=$cg/trace-ab-$side-$i-$$; mkdir -p $g
    s=$(date +%s.%N)
    bash -c "echo \$\$ > $g/cgroup.procs; cd $d && PYTHONPATH=$d:$d/apps:$d/directory:$d/location_service exec python3 -m $mod analyze $traces --out /tmp/trace-ab-$side-$i $extra" >/tmp/trace-ab-$side-$i.log 2>&1
    rc=$?
    e=$(date +%s.%N)
    echo "$side $i rc=$rc engine=$(grep -o 'engine [a-z]*)' /tmp/trace-ab-$side-$i.log | tr -d ')' | cut -d' ' -f2) wall=$(echo "$e - $s" | bc) cpu=$(echo "scale=1; $(cat $g/cpuacct.usage) / 1000000000" | bc) load=$(cut -d' ' -f1 /proc/loadavg)" >> "$out"
  done
done
cat "$out"
