#!/usr/bin/env bash
# kafka.sh start|stop|halt|resume STATE_DIR: one Apache Kafka 4.x broker in
# KRaft combined mode (broker and controller in one JVM) on free loopback
# ports, logs and data under STATE_DIR/kafka.
# start writes STATE_DIR/kafka.env with EDGELIMIT_KAFKA_BROKERS (host:port).
# When tls.sh made STATE_DIR/tls (and not EDGELIMIT_PRIVATE), the same broker
# also listens with SASL_SSL (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; users
# created at format time) and start writes EDGELIMIT_TEST_KAFKA_SASL_BROKERS,
# EDGELIMIT_TEST_KAFKA_USER and EDGELIMIT_TEST_KAFKA_PASSWORD: that user
# exists for all three mechanisms.
# halt stops the broker and keeps its ports and data; resume starts it again
# on them and waits until it serves.
#
# The jars come from Maven Central through kafka/pom.xml into
# ${EDGELIMIT_CACHE:-~/.cache/edgelimit}/kafka-VERSION/libs, fetched once
# (and Maven keeps its own copy in ~/.m2).
# EDGELIMIT_KAFKA_VERSION picks the version (default 4.4.0, else 4.3.1);
# EDGELIMIT_KAFKA_JAVA_OPTS replaces the JVM options below.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/proc.sh"
here=$(cd "$(dirname "$0")" && pwd)
server_args kafka "start|stop|halt|resume" "$@"
pidfile=$dir/kafka.pid
cache=${EDGELIMIT_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/edgelimit}
# A small heap, and the client compiler only (C1): the broker starts in about
# 2s instead of 4-5s, and the loads we put on it are small.
java_opts=${EDGELIMIT_KAFKA_JAVA_OPTS:--Xms64m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true}

# fetch VERSION: makes $cache/kafka-VERSION/libs complete, or fails.
fetch() {
	local v=$1 out=$cache/kafka-$1
	[ -f "$out/libs/.complete" ] && return 0
	mkdir -p "$out"
	(
		# One fetch at a time per version: parallel starts share the cache.
		flock 9
		[ -f "$out/libs/.complete" ] && exit 0
		echo "kafka: fetching kafka_2.13 $v from Maven Central into $out" >&2
		rm -rf "$out/libs.tmp"
		if ! mvn -B -q -Dstyle.color=never -f "$here/kafka/pom.xml" \
			dependency:copy-dependencies -Dkafka.version="$v" -DincludeScope=runtime \
			-DoutputDirectory="$out/libs.tmp" >"$out/mvn.log" 2>&1; then
			tail -n 20 "$out/mvn.log" >&2
			rm -rf "$out/libs.tmp"
			exit 1
		fi
		touch "$out/libs.tmp/.complete"
		rm -rf "$out/libs"
		mv "$out/libs.tmp" "$out/libs"
	) 9>"$out/.lock"
}

# libs: prints the jar folder of the first version that fetches.
libs() {
	local v
	for v in ${EDGELIMIT_KAFKA_VERSION:-4.4.0 4.3.1}; do
		if fetch "$v"; then
			echo "$cache/kafka-$v/libs"
			return 0
		fi
		echo "kafka: could not fetch $v" >&2
	done
	return 1
}

write_config() { # port controller_port [sasl_ssl_port password]
	local listeners="PLAINTEXT://127.0.0.1:$1" sasl=""
	mkdir -p "$dir/logs"
	if [ -n "${3:-}" ]; then
		listeners="$listeners,SASL_SSL://127.0.0.1:$3"
		# Brokers talk to each other and the controller in PLAINTEXT; only
		# clients use SASL_SSL. The PEM key store is the server's key
		# followed by its certificate; SCRAM users live in the metadata
		# log (format --add-scram), the PLAIN user in the JAAS line.
		sasl="ssl.keystore.type=PEM
ssl.keystore.location=$state/tls/server-bundle.pem
ssl.truststore.type=PEM
ssl.truststore.location=$state/tls/ca.pem
ssl.client.auth=requested
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_edgelimit=\"$4\";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
	fi
	cat >"$dir/server.properties" <<EOF
# Written by deploy/local/kafka.sh.
process.roles=broker,controller
node.id=1
listeners=$listeners,CONTROLLER://127.0.0.1:$2
advertised.listeners=$listeners
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
$sasl
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
controller.quorum.bootstrap.servers=127.0.0.1:$2
log.dirs=$dir/data
num.partitions=4
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
EOF
	echo "$1 $2 ${3:-} ${4:-}" >"$dir/ports"
	chmod 600 "$dir/ports" "$dir/server.properties"
}

cluster_id() { # a random UUID in Kafka's base64 form, like kafka-storage.sh random-uuid
	# Never one that starts with "-": kafka-storage would take it for an
	# option (one id in 64 did, and the stack failed to start).
	python3 -c '
import base64, uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break'
}

# run_broker LIBS: starts the broker and waits until it says it started and
# its port accepts connections.
run_broker() {
	local libs=$1 port pid deadline
	read -r port _ <"$dir/ports"
	# A fresh log, so the "started" line we wait for is this run's.
	[ -f "$dir/logs/server.log" ] && cat "$dir/logs/server.log" >>"$dir/logs/server.log.old" && rm -f "$dir/logs/server.log"
	# shellcheck disable=SC2086
	nohup java $java_opts -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
		-Dkafka.logs.dir="$dir/logs" -cp "$libs/*" kafka.Kafka "$dir/server.properties" \
		</dev/null >"$dir/logs/stdout.log" 2>&1 &
	pid=$!
	echo "$pid" >"$pidfile"
	deadline=$((SECONDS + 90))
	until grep -q 'Kafka Server started' "$dir/logs/server.log" 2>/dev/null &&
		(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
		if ! alive "$pid" || [ $SECONDS -ge $deadline ]; then
			echo "kafka: broker did not start on 127.0.0.1:$port" >&2
			tail -n 20 "$dir/logs/stdout.log" "$dir/logs/server.log" >&2 || true
			stop_process "$pidfile"
			return 1
		fi
		sleep 0.1
	done
	echo "$libs" >"$dir/libs"
}

write_env() {
	local port sasl pw
	read -r port _ sasl pw <"$dir/ports"
	{
		echo "export EDGELIMIT_KAFKA_BROKERS=127.0.0.1:$port"
		if [ -n "$sasl" ]; then
			echo "export EDGELIMIT_TEST_KAFKA_SASL_BROKERS=127.0.0.1:$sasl"
			echo "export EDGELIMIT_TEST_KAFKA_USER=edgelimit"
			echo "export EDGELIMIT_TEST_KAFKA_PASSWORD=$pw"
		fi
	} >"$state/kafka.env"
	echo "kafka: broker 127.0.0.1:$port${sasl:+, sasl_ssl 127.0.0.1:$sasl} ($(basename "$(dirname "$(cat "$dir/libs")")"))" >&2
}

case $cmd in
start)
	need_pkg java openjdk-17-jre-headless
	need_pkg mvn maven
	if running "$pidfile"; then
		write_env
		exit 0
	fi
	jars=$(libs)
	rm -rf "$dir"
	mkdir -p "$dir"
	scram=()
	if [ -f "$state/tls/ca.pem" ] && [ -z "${EDGELIMIT_PRIVATE:-}" ]; then
		pw=$(openssl rand -hex 16)
		write_config "$(free_port)" "$(free_port)" "$(free_port)" "$pw"
		scram=(--add-scram "SCRAM-SHA-256=[name=edgelimit,password=$pw]"
			--add-scram "SCRAM-SHA-512=[name=edgelimit,password=$pw]")
	else
		write_config "$(free_port)" "$(free_port)"
	fi
	# --standalone: this node alone is the controller quorum, as
	# kafka-storage.sh format --standalone does.
	# shellcheck disable=SC2086
	if ! java $java_opts -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
		-Dkafka.logs.dir="$dir/logs" -cp "$jars/*" kafka.tools.StorageTool format --standalone \
		-t "$(cluster_id)" -c "$dir/server.properties" "${scram[@]}" >"$dir/logs/format.log" 2>&1; then
		cat "$dir/logs/format.log" >&2
		exit 1
	fi
	run_broker "$jars"
	start_watchdog "$0" "$state" "$dir"
	write_env
	;;
resume)
	[ -f "$dir/libs" ] || { echo "kafka: nothing to resume in $dir" >&2; exit 1; }
	running "$pidfile" || run_broker "$(cat "$dir/libs")"
	;;
halt)
	stop_process "$pidfile"
	;;
stop)
	stop_watchdog "$dir"
	stop_process "$pidfile"
	rm -f "$state/kafka.env"
	;;
esac
