# Reads wrk --latency output; prints one tab-separated line:
#   rps p50_us p99_us connect read write timeout non2xx
# (works with mawk and gawk). Missing numbers print as NA; absent error lines mean 0 errors.
function us(v,   n, unit) {
  n = v + 0
  unit = v
  sub(/^[0-9.]+/, "", unit)
  if (unit == "us") return n
  if (unit == "ms") return n * 1000
  if (unit == "s") return n * 1000000
  if (unit == "m") return n * 60000000
  if (unit == "h") return n * 3600000000
  return "NA"
}
BEGIN { rps = p50 = p99 = "NA"; c = r = w = t = n = 0; dist = 0 }
/^Requests\/sec:/ { rps = $2 }
/Latency Distribution/ { dist = 1 }
# Only the percentile lines under "Latency Distribution" (the thread stats have no "50%").
dist && $1 == "50%" { p50 = us($2) }
dist && $1 == "99%" { p99 = us($2); dist = 0 }
# "Socket errors: connect 0, read 0, write 0, timeout 0" ("0," is 0 for awk)
/Socket errors:/ { c = $4 + 0; r = $6 + 0; w = $8 + 0; t = $10 + 0 }
/Non-2xx or 3xx responses:/ { n = $NF + 0 }
END { printf "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", rps, p50, p99, c, r, w, t, n }
