#!/usr/bin/env bash
# tools/stage.sh LABEL COMMAND...: run COMMAND, then print how long it took: its wall time and the
# CPU seconds the whole machine was busy meanwhile (/proc/stat; a neighbour's work counts too), so
# that a CI log says where its time goes (issue 29 asks the whole run in 15 minutes). Exits with
# COMMAND's status.
label=$1
shift
busy() {  # the machine's busy clock ticks so far (all but idle and iowait), or 0 off Linux
    if [ -r /proc/stat ]; then
        read -r _ user nice system _idle _iowait irq softirq steal _ < /proc/stat
        echo $((user + nice + system + irq + softirq + steal))
    else
        echo 0
    fi
}
b0=$(busy)
t0=$(date +%s.%N)
status=0
"$@" || status=$?
t1=$(date +%s.%N)
b1=$(busy)
python3 - "$label" "$t0" "$t1" "$b0" "$b1" "$(getconf CLK_TCK)" "$status" <<'PY'
import sys
label, t0, t1, b0, b1, tick, status = sys.argv[1:]
wall, cpu = float(t1) - float(t0), (int(b1) - int(b0)) / int(tick)
print(f"== stage {label}: {wall:.0f} s wall, {cpu:.0f} s of CPU busy on the machine"
      f" ({cpu / max(wall, 1e-9):.1f} cores){'' if status == '0' else f', exit {status}'}", flush=True)
PY
exit $status
