#!/usr/bin/env bash
# prometheus.sh start|stop|halt|resume STATE_DIR: Prometheus and Alertmanager
# (Debian's packages) on free loopback ports, data and config under
# STATE_DIR/prometheus.
# start writes STATE_DIR/prometheus.env with EDGELIMIT_PROMETHEUS_URL,
# EDGELIMIT_ALERTMANAGER_URL and EDGELIMIT_PROMETHEUS_DIR.
#
# Prometheus scrapes nothing at first. Tests drop files into
# EDGELIMIT_PROMETHEUS_DIR and POST /-/reload (--web.enable-lifecycle):
#   rules/*.yml     rule files (recording and alerting), loaded on reload;
#   targets/*.yml   file_sd target groups for the job "edgelimit", picked up
#                   without a reload; a group's labels may set
#                   __metrics_path__ and __scrape_interval__;
#   prometheus.yml  may be rewritten whole (then reload).
# Use a file name of your own (the test's name) in the shared instance.
# Rules are evaluated and targets scraped every EDGELIMIT_PROMETHEUS_INTERVAL
# (default 1s, so that tests see alerts quickly); firing alerts are sent to
# Alertmanager as often. Prometheus finds the Alertmanager about 5s after it
# starts, so an alert may reach Alertmanager only that long after it fires.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/proc.sh"
server_args prometheus "start|stop|halt|resume" "$@"
interval=${EDGELIMIT_PROMETHEUS_INTERVAL:-1s}

write_config() { # prometheus_port alertmanager_port
	mkdir -p "$dir/rules" "$dir/targets" "$dir/data" "$dir/alertmanager/data" "$dir/logs"
	cat >"$dir/prometheus.yml" <<EOF
# Written by deploy/local/prometheus.sh.
global:
  scrape_interval: $interval
  evaluation_interval: $interval
rule_files:
  - $dir/rules/*.yml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["127.0.0.1:$2"]
scrape_configs:
  - job_name: edgelimit
    file_sd_configs:
      - files: ["$dir/targets/*.yml", "$dir/targets/*.json"]
        refresh_interval: 1s
EOF
	cat >"$dir/alertmanager/alertmanager.yml" <<EOF
# Written by deploy/local/prometheus.sh: alerts are kept for the API
# (/api/v2/alerts) and sent nowhere.
route:
  receiver: "null"
  group_by: ["alertname"]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: "null"
EOF
	echo "$1 $2" >"$dir/ports"
}

ready() { # url
	curl -fsS -o /dev/null --max-time 2 "$1/-/ready"
}

# run_servers: starts whichever of the two is not running, and waits.
run_servers() {
	local pport aport
	read -r pport aport <"$dir/ports"
	if ! running "$dir/alertmanager.pid"; then
		nohup prometheus-alertmanager --config.file="$dir/alertmanager/alertmanager.yml" \
			--storage.path="$dir/alertmanager/data" \
			--web.listen-address="127.0.0.1:$aport" --cluster.listen-address= \
			--log.level=warn </dev/null >>"$dir/logs/alertmanager.log" 2>&1 &
		echo $! >"$dir/alertmanager.pid"
	fi
	if ! running "$dir/prometheus.pid"; then
		nohup prometheus --config.file="$dir/prometheus.yml" \
			--storage.tsdb.path="$dir/data" \
			--web.listen-address="127.0.0.1:$pport" --web.enable-lifecycle \
			--rules.alert.resend-delay="$interval" \
			--log.level=warn </dev/null >>"$dir/logs/prometheus.log" 2>&1 &
		echo $! >"$dir/prometheus.pid"
	fi
	if ! wait_for "alertmanager on 127.0.0.1:$aport" 30 ready "http://127.0.0.1:$aport" ||
		! wait_for "prometheus on 127.0.0.1:$pport" 60 ready "http://127.0.0.1:$pport"; then
		tail -n 20 "$dir/logs/alertmanager.log" "$dir/logs/prometheus.log" >&2 || true
		halt_all
		return 1
	fi
}

halt_all() {
	stop_process "$dir/prometheus.pid"
	stop_process "$dir/alertmanager.pid"
}

write_env() {
	local pport aport
	read -r pport aport <"$dir/ports"
	{
		echo "export EDGELIMIT_PROMETHEUS_URL=http://127.0.0.1:$pport"
		echo "export EDGELIMIT_ALERTMANAGER_URL=http://127.0.0.1:$aport"
		echo "export EDGELIMIT_PROMETHEUS_DIR=$dir"
	} >"$state/prometheus.env"
	echo "prometheus: http://127.0.0.1:$pport, alertmanager http://127.0.0.1:$aport" >&2
}

case $cmd in
start)
	need_pkg prometheus prometheus
	need_pkg prometheus-alertmanager prometheus-alertmanager
	need_pkg curl curl
	if running "$dir/prometheus.pid" && running "$dir/alertmanager.pid"; then
		write_env
		exit 0
	fi
	stop_watchdog "$dir"
	halt_all
	mkdir -p "$dir"
	write_config "$(free_port)" "$(free_port)"
	run_servers
	start_watchdog "$0" "$state" "$dir"
	write_env
	;;
resume)
	[ -f "$dir/ports" ] || { echo "prometheus: nothing to resume in $dir" >&2; exit 1; }
	run_servers
	;;
halt)
	halt_all
	;;
stop)
	stop_watchdog "$dir"
	halt_all
	rm -f "$state/prometheus.env"
	;;
esac
