#!/usr/bin/env bash
# HTTP load benchmark: greeting_server (examples/greeting) against nginx, driven by wrk.
#
#   bash bench/run_http.sh            run as root (it installs wrk and nginx-light if missing)
#
# Servers: bus    greeting_server: HTTP -> bus request -> service on a bus executor -> HTTP
#          direct greeting_server --direct: answered on the I/O thread, no bus hop
#          nginx  `return 200 "Hello Sergio"` (bench/http/nginx.conf.in)
# Matrix:  threads (greeting_server I/O threads and executors / nginx workers) x connections;
#          each measurement is `wrk -t1 -c<conns> -d<DURATION>s --latency`, on a freshly started
#          server. The runs are interleaved (for each run: each config: each server) so that
#          slow drifts of the machine spread over every server alike.
#
# Environment (defaults in brackets):
#   RUNS [5]  DURATION [10] (seconds per measurement)  THREADS ["1 2"]  CONNS ["100 1000 10000"]
#   SERVERS ["bus direct nginx"]  PORT [18080] (bus; direct +1, nginx +2)  PAUSE [2] (seconds
#   between measurements)  BUS_ARGS ["--spin_us 0"] (extra greeting_server flags for bus: its
#   executor shares the I/O thread's cores, so it parks at once instead of spinning)  BUILD_DIR [build-bench]  JOBS [2]  OUT [bench/results/http-<date>-<commit>.txt]
#   TLS [0]: 1 serves HTTPS only, bus and nginx with one certificate (EC P-256, made here with
#   openssl) and the same TLS 1.2/1.3 protocols and ciphers (greeting_server's defaults)
#   WRK_TIMEOUT [2s]: wrk's --timeout (a request unanswered for that long counts as a timeout); 10,000
#   new TLS connections at once need more than 2 s of handshakes on one client core
#   NEW_CONNECTION [0]: 1 makes every request a new connection ("Connection: close": wrk
#   reconnects, with a full TLS handshake each time under TLS=1)  PATH_ [/greeting/Sergio]
#   HEADER [""]: one more request header
#
# Bearer tokens: SERVERS may also hold rs256, es256, hs256 (greeting_server with a JWK Set of an
# RSA 2048, an EC P-256 and an HS256 key made here, its greeting route requiring a token; wrk
# sends the same token with every request, as a client does, so the I/O thread's cache answers
# after the first) and rs256-new, es256-new, hs256-new (a different token on every request, from
# 5,000 minted with PyJWT, more than the cache holds: each one is verified). With any of them
# every measurement, bus's too, goes through bench/http/tokens.lua, and bus sends no token.
#
# The whole log (machine, raw wrk output of every measurement, summary) is appended to OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
DURATION=${DURATION:-10}
THREADS=${THREADS:-"1 2"}
CONNS=${CONNS:-"100 1000 10000"}
SERVERS=${SERVERS:-"bus direct nginx"}
PORT=${PORT:-18080}
BUS_ARGS=${BUS_ARGS-"--spin_us 0"}
PAUSE=${PAUSE:-2}
TLS=${TLS:-0}
NEW_CONNECTION=${NEW_CONNECTION:-0}
WRK_TIMEOUT=${WRK_TIMEOUT:-2s}
PATH_=${PATH_:-/greeting/Sergio}
HEADER=${HEADER:-}
build=${BUILD_DIR:-build-bench}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
out=${OUT:-bench/results/http-$(date +%F)-$commit.txt}
reproduce="BUS_ARGS=\"$BUS_ARGS\" RUNS=$RUNS DURATION=$DURATION THREADS=\"$THREADS\" CONNS=\"$CONNS\" SERVERS=\"$SERVERS\" TLS=$TLS NEW_CONNECTION=$NEW_CONNECTION WRK_TIMEOUT=$WRK_TIMEOUT PATH_=$PATH_${HEADER:+ HEADER=\"...\"} bash bench/run_http.sh"

# --- dependencies and build (their output goes to $build/run_http-build.log, not to OUT) ---
bash scripts/deps.sh wrk nginx-light
mkdir -p "$build"
echo "run_http: building greeting_server in $build"
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUS_BUILD_TESTS=OFF \
  -DBUS_BUILD_BENCH=OFF -DBUS_BUILD_EXAMPLES=ON &&
  cmake --build "$build" --target greeting_server -j "${JOBS:-2}"; } >"$build/run_http-build.log" 2>&1; then
  tail -30 "$build/run_http-build.log" >&2
  echo "run_http: build failed (log: $build/run_http-build.log)" >&2
  exit 1
fi
greeting_server=$(find "$build" -name greeting_server -type f -perm -u+x | head -1)
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $greeting_server && -x $nginx_bin ]] || { echo "run_http: greeting_server or nginx missing" >&2; exit 1; }

# 10,000 connections need 10,000 descriptors in wrk and in the server; children inherit this.
ulimit -n "$(ulimit -Hn)"
if (($(ulimit -n) < 10100)); then
  echo "run_http: warning: ulimit -n is $(ulimit -n); 10000 connections will fail" >&2
fi

# --- processes and cleanup: nothing may outlive the script ---
tmp=$(mktemp -d /tmp/run_http.XXXXXX)
server_pid="" wrk_pid=""
kill_tree() {  # pid: TERM, then KILL what is left; nginx workers too (they survive a KILLed master)
  local pid=$1 kids i
  mapfile -t kids < <(pgrep -P "$pid" 2>/dev/null || true)
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "run_http: pid $pid still running 5 s after SIGTERM: SIGKILL"
  fi
  kill -KILL "$pid" "${kids[@]}" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  set +e
  trap '' PIPE  # tee may be gone already (Ctrl-C): do not die before the servers are stopped
  [[ -n $wrk_pid ]] && kill -KILL "$wrk_pid" 2>/dev/null
  [[ -n $server_pid ]] && kill_tree "$server_pid"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT  # so that the EXIT trap runs
trap 'exit 143' TERM

mkdir -p "$(dirname "$out")"
exec > >(tee -a "$out") 2>&1

scheme=http
tls_args=() nginx_listen="" nginx_tls=""
if ((TLS)); then
  # One certificate for both servers, and the same protocols and ciphers.
  scheme=https
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null
  ciphers=ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305
  tls_args=(--plain=false --tls_cert "$tmp/cert.pem" --tls_key "$tmp/key.pem")
  nginx_listen=" ssl"
  nginx_tls="ssl_certificate $tmp/cert.pem; ssl_certificate_key $tmp/key.pem; ssl_protocols TLSv1.2 TLSv1.3; ssl_ciphers $ciphers;"
fi
wrk_extra=()
((NEW_CONNECTION)) && wrk_extra+=(-H "Connection: close")
[[ -n $HEADER ]] && wrk_extra+=(-H "$HEADER")

# Bearer tokens (see the top): keys, the server's JWK Set, and the tokens each kind sends.
token_kinds=0
for kind in $SERVERS; do [[ $kind =~ ^(rs|es|hs)256(-new)?$ ]] && token_kinds=1; done
if ((token_kinds)); then
  bash scripts/deps.sh python3-jwt python3-cryptography
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$tmp/rs256.key" 2>/dev/null
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/es256.key" 2>/dev/null
  openssl rand -hex 32 | tr -d '\n' >"$tmp/hs256.key"
  for alg in rs256 es256; do openssl pkey -in "$tmp/$alg.key" -pubout -out "$tmp/$alg.pub"; done
  # Debian's python3 (python3-jwt), whatever python3 comes first on PATH.
  /usr/bin/python3 tests/endpoint/tools/mint_jwt.py --jwks "$tmp/jwks.json" rs256="$tmp/rs256.pub" \
    es256="$tmp/es256.pub" hs256="oct:$tmp/hs256.key"
  /usr/bin/python3 - "$tmp" <<'PY'
import sys, time, jwt
tmp = sys.argv[1]
for alg in ("RS256", "ES256", "HS256"):
    key = open(f"{tmp}/{alg.lower()}.key", "rb").read()
    mint = lambda i: jwt.encode({"sub": f"client-{i}", "exp": int(time.time()) + 86400},
                                key, algorithm=alg, headers={"kid": alg.lower()})
    open(f"{tmp}/{alg.lower()}.token", "w").write(mint(0) + "\n")
    open(f"{tmp}/{alg.lower()}-new.token", "w").write("".join(mint(i) + "\n" for i in range(5000)))
PY
fi
token_file() {  # kind: the tokens file it sends (none for bus, direct and nginx)
  [[ $1 =~ ^(rs|es|hs)256(-new)?$ ]] && echo "$tmp/$1.token"
  return 0
}

# --- the machine ---
echo "=== run_http $(date -u '+%F %T UTC') ==="
echo "reproduce: $reproduce"
source_line=$commit
git diff --quiet HEAD -- bus endpoint examples CMakeLists.txt 2>/dev/null ||
  source_line+=" + uncommitted changes under bus/, endpoint/, examples/ or CMakeLists.txt"
echo "commit:    $source_line"
echo "cpus:      $(nproc) x $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
echo "kernel:    $(uname -srm)"
echo "wrk:       $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}')"
echo "nginx:     $("$nginx_bin" -v 2>&1)"
echo "server:    $greeting_server"
echo "ulimit -n: $(ulimit -n); somaxconn $(cat /proc/sys/net/core/somaxconn)"
echo "load:      $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
ncpu=$(nproc)

# CPU sets. The server gets cores 0..T-1; wrk gets the next core when there is one. With 2
# cores and T=2 there is none: the server and wrk then share both cores (and the numbers
# measure the server and wrk together).
server_cpus() { if (($1 == 1)); then echo 0; else echo "0-$(($1 - 1))"; fi; }
wrk_cpus() {
  if (($1 < ncpu)); then echo "$1"; else echo "0-$((ncpu - 1))"; fi
}
for t in $THREADS; do
  note=""
  [[ $(wrk_cpus "$t") == "$t" ]] || note="  (shared: wrk competes with the server for both cores)"
  echo "pinning:   threads=$t: server on CPU $(server_cpus "$t"), wrk on CPU $(wrk_cpus "$t")$note"
done
echo "note:      bus runs T I/O threads + T executors (the service's threads) in the same CPU set;"
echo "           direct runs T I/O threads (its executor idles); nginx runs T workers + an idle master."
n_meas=$(($(wc -w <<<"$THREADS") * $(wc -w <<<"$CONNS") * $(wc -w <<<"$SERVERS") * RUNS))
echo "plan:      $n_meas measurements of ${DURATION}s, about $((n_meas * (DURATION + PAUSE + 2) / 60 + 1)) min"

# --- servers ---
backlog=$(cat /proc/sys/net/core/somaxconn)  # what greeting_server's listen() gets
port_of() {
  case $1 in
    bus) echo "$PORT" ;; direct) echo $((PORT + 1)) ;; nginx) echo $((PORT + 2)) ;;
    rs256) echo $((PORT + 3)) ;; es256) echo $((PORT + 4)) ;; hs256) echo $((PORT + 5)) ;;
    rs256-new) echo $((PORT + 6)) ;; es256-new) echo $((PORT + 7)) ;; hs256-new) echo $((PORT + 8)) ;;
  esac
}
# Each server kind has its own port: the client side of the previous measurement's connections
# may still be in TIME_WAIT towards the old port.

start_server() {  # kind threads: sets server_pid
  local kind=$1 t=$2 port cpus
  port=$(port_of "$kind")
  cpus=$(server_cpus "$t")
  case $kind in
    bus | direct | rs256* | es256* | hs256*)
      local args=(--port "$port" --io_threads "$t" --executors "$t" --max_connections 20000)
      ((TLS)) && args+=(--tls_port "$port" "${tls_args[@]}")
      [[ $kind == direct ]] && args+=(--direct)
      [[ $kind != direct && -n ${BUS_ARGS:-} ]] && read -r -a extra <<<"$BUS_ARGS" && args+=("${extra[@]}")
      [[ -n $(token_file "$kind") ]] && args+=(--jwt_jwks "$tmp/jwks.json")
      # taskset execs the program: $! is the server's pid.
      taskset -c "$cpus" "$greeting_server" "${args[@]}" >"$tmp/server.log" 2>&1 &
      ;;
    nginx)
      sed -e "s|@DIR@|$tmp/nginx|g" -e "s|@WORKERS@|$t|g" -e "s|@PORT@|$port|g" \
        -e "s|@BACKLOG@|$backlog|g" -e "s|@LISTEN_TLS@|$nginx_listen|g" -e "s|@TLS@|$nginx_tls|g" \
        bench/http/nginx.conf.in >"$tmp/nginx/nginx.conf"
      # Foreground master (daemon off), so $! is the master and the workers are its children.
      taskset -c "$cpus" "$nginx_bin" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" \
        -e "$tmp/nginx/error.log" -g 'daemon off;' >"$tmp/server.log" 2>&1 &
      ;;
  esac
  server_pid=$!
}

answers() {  # port kind: true once GET /greeting/Sergio answers "Hello Sergio"
  local auth=""
  [[ -n $(token_file "$2") ]] && auth="Authorization: Bearer $(head -1 "$(token_file "$2")")"
  if ((TLS)); then
    [[ $(curl -sk --max-time 1 ${auth:+-H "$auth"} "https://127.0.0.1:$1/greeting/Sergio") == *"Hello Sergio"* ]]
    return
  fi
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET /greeting/Sergio HTTP/1.1\r\nHost: 127.0.0.1\r\n%sConnection: close\r\n\r\n' \
      "${auth:+$auth$'\r\n'}" >&3
    reply=$(timeout 1 cat <&3)
    [[ $reply == *"Hello Sergio"* ]]
  ) 2>/dev/null
}

server_pids() {  # sets pids: the server and its children (nginx workers)
  pids=("$server_pid")
  mapfile -t -O 1 pids < <(pgrep -P "$server_pid" 2>/dev/null || true)
}
status_kib() {  # field pids...: sum of that /proc/PID/status field in KiB
  local field=$1 pid sum=0 v
  shift
  for pid; do
    v=$(awk -v f="$field:" '$1 == f {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}

# --- one measurement ---
results=$tmp/results.tsv
printf 'run\tthreads\tconns\tserver\trps\tp50_us\tp99_us\tconnect\tread\twrite\ttimeout\tnon2xx\trss_kib\n' >"$results"
mkdir -p "$tmp/nginx"

measure() {  # run threads conns kind
  local run=$1 t=$2 c=$3 kind=$4 port i ok=0 parsed rss hwm pss peak_rss=0 now row pids=()
  port=$(port_of "$kind")
  echo
  echo "--- run $run/$RUNS threads=$t conns=$c server=$kind port=$port load $(cut -d' ' -f1 /proc/loadavg)"
  start_server "$kind" "$t"
  for i in $(seq 100); do  # up to 10 s
    if answers "$port" "$kind"; then ok=1; break; fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ((!ok)); then
    echo "run_http: $kind did not answer on port $port; its output:"
    cat "$tmp/server.log" "$tmp/nginx/error.log" 2>/dev/null | tail -20
    kill_tree "$server_pid"
    server_pid=
    row="NA\tNA\tNA\t0\t0\t0\t0\t0\tNA"
  else
    local cmd=(wrk -t1 -c"$c" -d"${DURATION}s" --timeout "$WRK_TIMEOUT" --latency "${wrk_extra[@]}")
    ((token_kinds)) && cmd+=(-s bench/http/tokens.lua)
    cmd+=("$scheme://127.0.0.1:$port$PATH_")
    [[ -n $(token_file "$kind") ]] && cmd+=(-- "$(token_file "$kind")")
    echo "taskset -c $(wrk_cpus "$t") ${cmd[*]}"
    taskset -c "$(wrk_cpus "$t")" "${cmd[@]}" >"$tmp/wrk.out" 2>&1 &
    wrk_pid=$!
    # nginx's memory: the largest sum of VmRSS over master + workers, sampled every 0.5 s while
    # wrk runs (and once after). Sums of RSS count the pages master and workers share (binary,
    # libraries) once per process: a few MiB more than nginx really holds.
    while kill -0 "$wrk_pid" 2>/dev/null; do
      server_pids
      now=$(status_kib VmRSS "${pids[@]}")
      ((now > peak_rss)) && peak_rss=$now
      sleep 0.5
    done
    local wrk_rc=0
    wait "$wrk_pid" || wrk_rc=$?
    wrk_pid=
    server_pids
    now=$(status_kib VmRSS "${pids[@]}")
    ((now > peak_rss)) && peak_rss=$now
    hwm=$(status_kib VmHWM "${pids[@]}")
    # For the log only: PSS counts shared pages once across nginx's processes (compare with RSS).
    pss=0
    for i in "${pids[@]}"; do
      pss=$((pss + $(awk '$1 == "Pss:" {print $2}' "/proc/$i/smaps_rollup" 2>/dev/null || echo 0)))
    done
    cat "$tmp/wrk.out"
    # greeting_server is one process: its VmHWM is the exact peak. nginx: the sampled sum.
    if [[ $kind == nginx ]]; then rss=$peak_rss; else rss=$hwm; fi
    echo "memory: VmHWM sum ${hwm} KiB, sampled VmRSS sum max ${peak_rss} KiB, Pss sum at end ${pss} KiB, pids ${pids[*]}"
    kill_tree "$server_pid"
    server_pid=
    tail -2 "$tmp/server.log" | sed 's/^/server: /'
    if ((wrk_rc != 0)); then
      echo "run_http: wrk exited with $wrk_rc"
      row="NA\tNA\tNA\t0\t0\t0\t0\t0\tNA"
    else
      parsed=$(awk -f bench/http/parse_wrk.awk "$tmp/wrk.out")
      row="$parsed\t$rss"
    fi
  fi
  if [[ -s $tmp/nginx/error.log ]]; then
    echo "nginx error.log:"
    sed 's/^/  /' "$tmp/nginx/error.log" | tail -10
    : >"$tmp/nginx/error.log"
  fi
  printf "%s\t%s\t%s\t%s\t$row\n" "$run" "$t" "$c" "$kind" >>"$results"
  printf "RESULT\t%s\t%s\t%s\t%s\t$row\n" "$run" "$t" "$c" "$kind"
  sleep "$PAUSE"  # let the kernel finish closing the connections before the next server
}

read -r -a servers <<<"$SERVERS"
for run in $(seq "$RUNS"); do
  for t in $THREADS; do
    for c in $CONNS; do
      # Rotate which server goes first from run to run: none always follows the same one.
      for i in $(seq 0 $((${#servers[@]} - 1))); do
        measure "$run" "$t" "$c" "${servers[$(((i + run - 1) % ${#servers[@]}))]}"
      done
    done
  done
done

echo
echo "=== summary ($(date -u '+%F %T UTC'); commit $source_line; load $(cut -d' ' -f1-3 /proc/loadavg)) ==="
python3 bench/http/summarise.py "$results"
echo
echo "reproduce: $reproduce"
echo "raw log:   $out"
