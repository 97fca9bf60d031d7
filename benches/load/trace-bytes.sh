#!/usr/bin/env bash
# Bytes exported per traced request (issue 39): the activator, every request sampled, exports
# to the OTLP stand-in collector (testkit/collector/otel_receiver.py, OpenTelemetry's own Python
# messages) over OTLP/HTTP or OTLP/gRPC; the figure is kactivator_trace_export_bytes_total (the
# encoded payloads, before HTTP or gRPC framing) as the collector received them, per span and
# per traced request, after the activator exported what it held (it exits, and its last batch
# goes out then). curl sends the requests one at a time on one connection.
#
# Usage: bash benches/load/trace-bytes.sh [--requests N] [--protocol http/protobuf|grpc]
#   KACTIVATOR_BIN (default target/release/kactivator), KACTIVATOR_PYTHON (default
#   target/venv/bin/python3, which scripts/test.sh makes).
set -euo pipefail

requests=2000
protocol=http/protobuf
while (($#)); do
  case $1 in
    --requests) requests=$2; shift 2 ;;
    --protocol) protocol=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
bin=${KACTIVATOR_BIN:-target/release/kactivator}
python=${KACTIVATOR_PYTHON:-target/venv/bin/python3}
for tool in nginx curl; do
  command -v "$tool" >/dev/null || { echo "trace-bytes.sh needs $tool" >&2; exit 1; }
done
[[ -x $bin ]] || { echo "no binary at $bin (cargo build --release, or set KACTIVATOR_BIN)" >&2; exit 1; }

work=$(mktemp -d /tmp/kactivator-trace-bytes.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The collector: its stdin held open by a fifo, its events (one JSON line each) to a file.
mkfifo "$work/collector.in"
"$python" testkit/collector/otel_receiver.py <"$work/collector.in" >"$work/collector.log" &
pids+=($!)
exec 3>"$work/collector.in"
for _ in $(seq 100); do grep -q listening "$work/collector.log" 2>/dev/null && break; sleep 0.1; done
read -r grpc_port http_port < <(python3 -c 'import json,sys; e=json.loads(open(sys.argv[1]).readline()); print(e["grpc"], e["http"])' "$work/collector.log")
case $protocol in
  http/protobuf) endpoint="http://127.0.0.1:$http_port/v1/traces" ;;
  grpc) endpoint="http://127.0.0.1:$grpc_port" ;;
  *) echo "--protocol is http/protobuf or grpc" >&2; exit 2 ;;
esac

backend_port=$(free_port)
mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events {}
http {
  access_log off;
  server { listen 127.0.0.1:$backend_port; location / { return 200 "ok"; } }
}
EOF
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
pids+=($!)

port=$(free_port)
admin=$(free_port)
cat >"$work/kactivator.toml" <<EOF
[listen]
http = "127.0.0.1:$port"
http2 = "127.0.0.1:0"
admin = "127.0.0.1:$admin"

[features]
"activator.pod-quarantine" = "disabled"

[tracing]
protocol = "$protocol"
endpoint = "$endpoint"
sampling_rate = 1.0

[[revisions]]
namespace = "default"
name = "bench"
container_concurrency = 0
pods = ["127.0.0.1:$backend_port"]
EOF
"$bin" --config "$work/kactivator.toml" --shards 1 --drain-grace-seconds 0 2>"$work/kactivator.log" &
kactivator=$!
pids+=($kactivator)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$admin/readyz" >/dev/null && break; sleep 0.1; done

echo "== $requests requests through the activator, every one traced, spans over $protocol"
urls=()
for _ in $(seq "$requests"); do urls+=(-o /dev/null "http://127.0.0.1:$port/"); done
curl -fs -H "Knative-Serving-Namespace: default" -H "Knative-Serving-Revision: bench" "${urls[@]}"
metrics=$(curl -fs "http://127.0.0.1:$admin/metrics")
served=$(awk '/^kactivator_shard_requests_total/ {s += $NF} END {print s}' <<<"$metrics")
kill -TERM "$kactivator"
wait "$kactivator" || true
# What the collector received: spans, the requests they come from (one `handle` span each),
# and the payloads' bytes. A span the activator dropped (its buffers are bounded, and this
# collector is a slow Python one) is not in either figure, so the ratios are per span
# received; the drops are shown beside them.
python3 - "$work/collector.log" "$served" <<'PY'
import json, sys
spans = handles = payload = 0
for line in open(sys.argv[1]):
    event = json.loads(line)
    if event.get("event") == "request":
        payload += event["bytes"]
    elif event.get("event") == "span":
        spans += 1
        handles += event.get("name") == "handle"
print("requests served: %s; traced requests received (handle spans): %d; spans received: %d; "
      "payload bytes received: %d" % (sys.argv[2], handles, spans, payload))
print("bytes per span: %.0f; spans per request: %.2f; bytes per traced request: %.0f"
      % (payload / spans, spans / handles, payload / handles))
PY
grep '^kactivator_trace_spans_dropped_total' <<<"$metrics" || true
