#!/bin/sh
# Creates the certificates kube-scheduler and `kubegpu extender` authenticate each other with:
#
#   make-certs.sh DIR [NAME ...]
#
#   DIR/ca.crt, ca.key          a CA for the extender alone (keep ca.key offline; it signs who may bind pods)
#   DIR/tls.crt, tls.key        the extender's serving certificate (serverAuth) for each NAME
#                               (default: kubegpu-extender.kube-system.svc; an IP address becomes an IP SAN)
#   DIR/client.crt, client.key  kube-scheduler's client certificate (clientAuth, CN=kube-scheduler)
#
# Then (see extender.yaml and scheduler-config.yaml):
#
#   kubectl -n kube-system create secret tls kubegpu-extender-tls --cert=DIR/tls.crt --key=DIR/tls.key
#   kubectl -n kube-system create secret generic kubegpu-extender-client-ca --from-file=ca.crt=DIR/ca.crt
#   kubectl -n kube-system create secret generic kubegpu-extender-client \
#       --from-file=ca.crt=DIR/ca.crt --from-file=tls.crt=DIR/client.crt --from-file=tls.key=DIR/client.key
#
# The extender accepts any client certificate this CA signed: use a CA of its own, not the cluster's.
set -eu

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME ...]" >&2
  exit 2
fi
dir=$1
shift
[ $# -gt 0 ] || set -- kubegpu-extender.kube-system.svc
days=${DAYS:-365}
mkdir -p "$dir"
umask 077

sans=""
for name in "$@"; do
  case $name in
    *[!0-9.:]*) sans="$sans${sans:+,}DNS:$name" ;;
    *) sans="$sans${sans:+,}IP:$name" ;;
  esac
done

openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=kubegpu-extender-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null

sign() {  # sign NAME SUBJECT EXTENSIONS
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$dir/$1.key" -out "$dir/$1.csr" 2>/dev/null
  printf '%s\n' "$3" > "$dir/$1.ext"
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days "$days" \
    -extfile "$dir/$1.ext" -out "$dir/$1.crt" 2>/dev/null
  rm -f "$dir/$1.csr" "$dir/$1.ext"
}

sign tls "/CN=$1" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$sans"
sign client "/CN=kube-scheduler" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
rm -f "$dir/ca.srl"
echo "$dir"
