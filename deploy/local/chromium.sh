#!/usr/bin/env bash
# chromium.sh start|stop|halt|resume STATE_DIR: no server, just Debian's
# Chromium for the dashboard's browser tests (run it headless, --no-sandbox
# as root). start installs it when missing and writes STATE_DIR/chromium.env
# with EDGELIMIT_CHROMIUM, the binary's path; the other verbs do nothing.
source "$(dirname "$0")/lib.sh"
server_args chromium "start|stop|halt|resume" "$@"

case $cmd in
start)
	need_pkg chromium chromium
	echo "export EDGELIMIT_CHROMIUM=$(command -v chromium)" >"$state/chromium.env"
	echo "chromium: $(command -v chromium)" >&2
	;;
stop)
	rm -f "$state/chromium.env"
	;;
halt | resume) ;;
esac
