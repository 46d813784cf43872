#!/usr/bin/env bash
# Create the cluster's certificates and an admin's bearer token.
#   OMRU_NODES="<node id> ..." deploy/make-certs.sh OUT_DIR HOST [HOST ...]
# Two CAs, so that each certificate is accepted only where it belongs:
# - ca.pem signs the services' (registry, profiler, planner: CN and DNS SAN
#   omru-<service>), one per node of OMRU_NODES (executor-<node>.pem, CN
#   omru-executor-<node>: it acts for that node only) and the users' client.pem
#   (CN omru-client): mutual TLS between services, nodes and users.
# - etcd-ca.pem signs etcd.pem (etcd's own, also for its peers) and one etcd
#   client certificate per service that stores state (etcd-<service>.pem):
#   etcd trusts etcd-ca.pem alone, so client.pem and the nodes' certificates
#   cannot reach it.
# Extended key usages: clients clientAuth only (client.pem, etcd-<service>.pem);
# the services, nodes and etcd serve and also call (other services, the
# registry, etcd peers, their own health probe): serverAuth and clientAuth.
# Server certificates name every HOST (and localhost, 127.0.0.1 for the health
# probes); a node's names its node id as its host (name nodes by the address
# or host name the head reaches them at: the compose files' default).
# token is an admin's bearer token (the head's services); metrics-token a
# scraper's (role metrics: reads /metrics, calls no RPC), for Prometheus, and
# metrics.tokens the same as a tokens file line (--auth-tokens, every service
# and node).
# The CA keys go to OUT_DIR/private (only this script needs them: keep that
# folder off every node). Keys and the token are mode 600. A rerun adds or
# renews certificates with the same CAs.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: [OMRU_NODES=\"<node id> ...\"] $0 OUT_DIR HOST [HOST ...]" >&2; exit 2; }
out=$1; shift
nodes=${OMRU_NODES:-}; nodes=${nodes//,/ }
for node in $nodes; do
  [[ $node =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$ ]] || { echo "$0: node id '$node' is not an id ([A-Za-z0-9._-], 1..128)" >&2; exit 2; }
done
umask 077
mkdir -p "$out/private"; chmod 700 "$out/private"; cd "$out"
san_of() {  # a host name or IP address as a subjectAltName entry
  if [[ $1 =~ ^[0-9.]+$ || $1 == *:* ]]; then echo "IP:$1"; else echo "DNS:$1"; fi
}
hosts="DNS:localhost,IP:127.0.0.1"
for h in "$@"; do [[ ,$hosts, == *",$(san_of "$h"),"* ]] || hosts+=",$(san_of "$h")"; done

ca() {  # ca NAME CN: NAME.pem, its key in private/
  [ -f "$1.pem" ] && { [ -f "private/$1-key.pem" ] || { echo "$0: $1.pem exists without private/$1-key.pem" >&2; exit 1; }; return; }
  openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=$2" -keyout "private/$1-key.pem" -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

cert() {  # cert NAME CN CA USAGES [SAN]: NAME.pem and NAME-key.pem signed by CA
  local ext="basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=$4\n"
  [ -n "${5:-}" ] && ext+="subjectAltName=$5\n"
  openssl req -newkey rsa:3072 -nodes -subj "/CN=$2" -keyout "$1-key.pem" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "private/$3-key.pem" -CAcreateserial -days 825 \
    -extfile <(printf "$ext") -out "$1.pem" 2>/dev/null
  rm -f "$1.csr"
}

ca ca omru-ca
ca etcd-ca omru-etcd-ca
for svc in registry profiler planner; do
  cert "$svc" "omru-$svc" ca serverAuth,clientAuth "DNS:omru-$svc,$hosts"
  cert "etcd-$svc" "omru-$svc" etcd-ca clientAuth
done
cert etcd omru-etcd etcd-ca serverAuth,clientAuth "DNS:omru-etcd,$hosts"
cert client omru-client ca clientAuth
for node in $nodes; do
  cert "executor-$node" "omru-executor-$node" ca serverAuth,clientAuth \
    "DNS:omru-executor-$node,DNS:localhost,IP:127.0.0.1$([[ $node == 127.0.0.1 || $node == localhost ]] || echo ",$(san_of "$node")")"
done
rm -f ./*.srl
[ -f token ] || openssl rand -hex 32 > token
[ -f metrics-token ] || openssl rand -hex 32 > metrics-token
echo "$(cat metrics-token) prometheus metrics" > metrics.tokens
chmod 644 ./*.pem; chmod 600 ./*-key.pem private/* token metrics-token metrics.tokens
echo "certificates and token in $(pwd); CA keys in $(pwd)/private"
