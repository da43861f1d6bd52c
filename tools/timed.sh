#!/usr/bin/env bash
# Time one set-up step, so that a regression shows in the CI log (docs/e2e.md, "Set-up").
#
#   tools/timed.sh NAME CMD [ARG...]   run CMD; print "[setup] NAME ... s"; append a row to the log
#   tools/timed.sh --summary           print the log's rows, longest first, and the wall time they span
#   tools/timed.sh --reset             start a new log (make prepare does, before its steps)
#
# Steps run side by side (make -j): each row holds its own start and end, and the
# summary's wall time is the last end minus the first start, not their sum.
# The log: ${FSDP_SETUP_TIMES:-runs/setup-times.tsv}, tab-separated: name, seconds, start, end, exit code.
set -uo pipefail

LOG=${FSDP_SETUP_TIMES:-runs/setup-times.tsv}

case ${1:-} in
  --reset) mkdir -p "$(dirname "$LOG")"; : >"$LOG"; exit 0 ;;
  --summary)
    [ -s "$LOG" ] || { echo "[setup] no step ran (everything was up to date)"; exit 0; }
    awk -F'\t' '
      { name[NR] = $1; secs[NR] = $2; rc[NR] = $5
        if (NR == 1 || $3 < first) first = $3
        if ($4 > last) last = $4 }
      END {
        printf "[setup] %-28s %8s  %s\n", "step", "seconds", "exit"
        n = NR
        for (i = 1; i <= n; i++) order[i] = i
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
          if (secs[order[j]] > secs[order[i]]) { t = order[i]; order[i] = order[j]; order[j] = t }
        for (i = 1; i <= n; i++) { k = order[i]; printf "[setup] %-28s %8d  %s\n", name[k], secs[k], rc[k] }
        printf "[setup] %-28s %8d  (steps overlapped: first start to last end)\n", "wall", last - first
      }' "$LOG"
    exit 0 ;;
  ""|-h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

name=$1; shift
mkdir -p "$(dirname "$LOG")"
start=$(date +%s)
echo "[setup] $name: started" >&2
"$@"
rc=$?
end=$(date +%s)
printf '%s\t%d\t%d\t%d\t%d\n' "$name" $((end - start)) "$start" "$end" "$rc" >>"$LOG"
if [ "$rc" -eq 0 ]; then
  echo "[setup] $name: $((end - start)) s" >&2
else
  echo "[setup] $name: FAILED (exit $rc) after $((end - start)) s" >&2
fi
exit "$rc"
