#!/usr/bin/env bash
# clickhouse-cluster.sh start|stop STATE_DIR: a two-shard ClickHouse cluster,
# two servers started by clickhouse.sh (in STATE_DIR/shard1 and shard2), each
# told about both as cluster "edgelimit" (one replica per shard) through a
# config.d file, which the servers reload without a restart.
# start writes STATE_DIR/clickhouse-cluster.env with EDGELIMIT_CLICKHOUSE_SHARD1
# and EDGELIMIT_CLICKHOUSE_SHARD2 (native host:port) and
# EDGELIMIT_CLICKHOUSE_CLUSTER (the cluster's name).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
server_args clickhouse-cluster "start|stop" "$@"

case $cmd in
start)
	declare -a ports
	for i in 1 2; do
		"$here/clickhouse.sh" start "$state/shard$i"
		read -r tcp _ <"$state/shard$i/clickhouse/ports"
		ports+=("$tcp")
	done
	for i in 1 2; do
		mkdir -p "$state/shard$i/clickhouse/config.d"
		cat >"$state/shard$i/clickhouse/config.d/edgelimit-cluster.xml" <<XML
<?xml version="1.0"?>
<!-- Written by deploy/local/clickhouse-cluster.sh. -->
<yandex>
    <remote_servers>
        <edgelimit>
            <shard><replica><host>127.0.0.1</host><port>${ports[0]}</port></replica></shard>
            <shard><replica><host>127.0.0.1</host><port>${ports[1]}</port></replica></shard>
        </edgelimit>
    </remote_servers>
</yandex>
XML
	done
	for p in "${ports[@]}"; do
		wait_for "cluster edgelimit on 127.0.0.1:$p" 60 sh -c \
			"[ \"\$(clickhouse-client --port $p -q \"SELECT count() FROM system.clusters WHERE cluster = 'edgelimit'\")\" = 2 ]"
	done
	{
		echo "export EDGELIMIT_CLICKHOUSE_SHARD1=127.0.0.1:${ports[0]}"
		echo "export EDGELIMIT_CLICKHOUSE_SHARD2=127.0.0.1:${ports[1]}"
		echo "export EDGELIMIT_CLICKHOUSE_CLUSTER=edgelimit"
	} >"$state/clickhouse-cluster.env"
	echo "clickhouse cluster: shards 127.0.0.1:${ports[0]} 127.0.0.1:${ports[1]}" >&2
	;;
stop)
	for i in 1 2; do
		"$here/clickhouse.sh" stop "$state/shard$i" &
	done
	wait
	rm -f "$state/clickhouse-cluster.env"
	;;
esac
