#!/usr/bin/env bash
# Installs and starts (or stops) the real services the integration tests talk to.
#
#   scripts/services.sh start   install if needed, start, wait until ready; prints env to export
#   scripts/services.sh stop    stop what `start` started
#   scripts/services.sh env     print the environment of running services
#
# Services (loopback only; state in target/services/):
#   S3: moto's S3 server from PyPI (moto[s3]==5.2.5) in a private virtualenv.
# Idempotent: `start` reuses a running server. Needs python3 with venv (any 3.9+).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="${SLUICE_SERVICES_DIR:-$PWD/target/services}"
mkdir -p "$STATE"

log() { printf '[services] %s\n' "$*" >&2; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_moto() {
    local venv="$STATE/venv-moto"
    if [[ -x "$venv/bin/moto_server" ]]; then return; fi
    log "installing moto (S3 server) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'moto[s3]==5.2.5' 'flask<4' 'flask-cors<7'
}

start_moto() {
    install_moto
    if alive "$STATE/moto.pid"; then
        log "moto already running on port $(cat "$STATE/moto.port")"
        return
    fi
    local port
    port="$(free_port)"
    "$STATE/venv-moto/bin/moto_server" -H 127.0.0.1 -p "$port" >"$STATE/moto.log" 2>&1 &
    echo $! >"$STATE/moto.pid"
    echo "$port" >"$STATE/moto.port"
    # Bounded readiness wait: 30 s.
    for _ in $(seq 1 300); do
        if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/', timeout=1)" 2>/dev/null; then
            log "moto ready on 127.0.0.1:$port"
            return
        fi
        if ! alive "$STATE/moto.pid"; then
            log "moto exited; its log:"; cat "$STATE/moto.log" >&2; exit 1
        fi
        sleep 0.1
    done
    log "moto did not become ready within 30 s; its log:"; cat "$STATE/moto.log" >&2
    exit 1
}

print_env() {
    if alive "$STATE/moto.pid"; then
        echo "export SLUICE_TEST_S3_ENDPOINT=http://127.0.0.1:$(cat "$STATE/moto.port")"
        echo "export SLUICE_TEST_MOTO_SERVER=$STATE/venv-moto/bin/moto_server"
    fi
}

stop() {
    for svc in moto; do
        if alive "$STATE/$svc.pid"; then
            kill "$(cat "$STATE/$svc.pid")" 2>/dev/null || true
            log "stopped $svc"
        fi
        rm -f "$STATE/$svc.pid"
    done
}

case "${1:-}" in
    start) start_moto; print_env ;;
    stop) stop ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
