#!/usr/bin/env bash
# Prints the current Beijing time (UTC+8) as a JSON object.
# Computed from UTC plus 8 hours so it is right even where tzdata is missing.
set -euo pipefail
format="${IAS_PARAM_FORMAT:-full}"
epoch=$(( $(date -u +%s) + 8 * 3600 ))
weekdays=(星期日 星期一 星期二 星期三 星期四 星期五 星期六)
weekday=${weekdays[$(date -u -d "@$epoch" +%w)]}
day=$(date -u -d "@$epoch" +%Y-%m-%d)
clock=$(date -u -d "@$epoch" +%H:%M:%S)
case "$format" in
  full) text="$day $weekday $clock" ;;
  date) text="$day $weekday" ;;
  time) text="$clock" ;;
  *) printf '{"success": false, "error": "unknown format: use full, date or time"}\n'; exit 0 ;;
esac
printf '{"success": true, "datetime": "%s", "timezone": "Asia/Shanghai (UTC+8)"}\n' "$text"
