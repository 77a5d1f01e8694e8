#!/usr/bin/env bash
# tls.sh start|stop STATE_DIR: the test stack's certificates, made with
# openssl under STATE_DIR/tls, for the servers that require TLS (redis.sh,
# kafka.sh and clickhouse.sh add a TLS server or listener when these exist):
#   ca.pem                 the CA every secure test server's certificate chains to
#   server.pem, server-key.pem   127.0.0.1 and localhost, signed by ca.pem
#   client.pem, client-key.pem   a client certificate signed by ca.pem
#   untrusted-ca.pem       a second CA that signed nothing the servers use,
#                          for "certificate signed by unknown authority" tests
# start writes STATE_DIR/tls.env with EDGELIMIT_TEST_TLS_DIR. Keys are P-256
# (fast to make) and unencrypted: they are throwaway test keys.
source "$(dirname "$0")/lib.sh"
server_args tls "start|stop" "$@"

# ca NAME: a self-signed CA NAME.pem with its key NAME-key.pem.
ca() {
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
		-keyout "$dir/$1-key.pem" -out "$dir/$1.pem" -subj "/CN=edgelimit test $1" \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}

# leaf NAME CN EXT: NAME.pem and NAME-key.pem (PKCS#8), signed by ca.pem.
leaf() {
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-keyout "$dir/$1-key.pem" -out "$dir/$1.csr" -subj "/CN=$2" 2>/dev/null
	printf '%s\n' "$3" >"$dir/$1.ext"
	openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
		-days 30 -out "$dir/$1.pem" -extfile "$dir/$1.ext" 2>/dev/null
	rm -f "$dir/$1.csr" "$dir/$1.ext"
}

case $cmd in
start)
	need_pkg openssl openssl
	if [ ! -f "$dir/.complete" ]; then
		rm -rf "$dir"
		mkdir -p "$dir"
		ca ca
		ca untrusted-ca
		leaf server localhost "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth"
		leaf client edgelimit-test-client "extendedKeyUsage=clientAuth"
		# Kafka's PEM key store wants the key and its chain in one file.
		cat "$dir/server-key.pem" "$dir/server.pem" >"$dir/server-bundle.pem"
		chmod 600 "$dir"/*-key.pem "$dir/server-bundle.pem"
		touch "$dir/.complete"
	fi
	echo "export EDGELIMIT_TEST_TLS_DIR=$dir" >"$state/tls.env"
	echo "tls: test CA and certificates in $dir" >&2
	;;
stop)
	rm -rf "$dir" "$state/tls.env"
	;;
esac
