#!/usr/bin/env bash
# Create a CA, one certificate per service (and etcd), and a bearer token.
#   [OMRU_NODES="node-a node-b"] deploy/make-certs.sh OUT_DIR HOST [HOST ...]
# With OMRU_NODES, also one executor certificate per node id,
# executor-<node>.pem with CN omru-executor-<node>: that node's identity (it
# may register, renew and watch for itself only; the shared executor.pem
# acts for any node).
# Every HOST (name or IP address) goes into each certificate's SANs, so one
# set serves a cluster whose head and nodes are those hosts. Each certificate
# also names its service: CN and DNS SAN omru-<service> (executors accept
# directives only from omru-planner, which also runs the profiler's
# trials; they check the planner they subscribe to presents omru-planner). Keys stay in
# OUT_DIR (mode 600); copy OUT_DIR to every node as ./certs next to the
# compose files.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR HOST [HOST ...]" >&2; exit 2; }
out=$1; shift
mkdir -p "$out"; cd "$out"
umask 077
san="DNS:localhost,IP:127.0.0.1"
for h in "$@"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+=",IP:$h"; else san+=",DNS:$h"; fi
done
[ -f ca.pem ] || openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=omru-ca" \
  -keyout ca-key.pem -out ca.pem 2>/dev/null
for svc in registry profiler planner executor etcd client ${OMRU_NODES:+$(printf 'executor-%s ' ${OMRU_NODES//,/ })}; do
  openssl req -newkey rsa:3072 -nodes -subj "/CN=omru-$svc" -keyout "$svc-key.pem" -out "$svc.csr" 2>/dev/null
  openssl x509 -req -in "$svc.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 \
    -extfile <(printf 'subjectAltName=DNS:omru-%s,%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$svc" "$san") \
    -out "$svc.pem" 2>/dev/null
  rm -f "$svc.csr"
done
[ -f token ] || openssl rand -hex 32 > token
chmod 644 ./*.pem; chmod 600 ./*-key.pem token
echo "certificates and token in $(pwd)"
