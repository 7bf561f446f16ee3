#!/usr/bin/env bash
# The one command that checks capgate: formatting, lints (the core's purity gate among them), the
# core built on its own, every test of the workspace, and the reference gateways' suites. It
# prepares what a fresh Debian 12 machine with a rustup toolchain lacks (a C compiler, Python's
# venv, openssl, Node.js 20 and npm, PostgreSQL; then uv and the npm and PyPI packages of
# gateways/), and its output ends with the test runner's summary line. The PostgreSQL store suite
# also runs through PgBouncer (scripts/pgbouncer.sh), in transaction and in session mode.
#
#   scripts/test.sh             prepare, then check everything
#   scripts/test.sh --prepare   only install what is missing
#
# CI runs it through .ci/run, in a fresh clone, with CI=true and no stdin.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() {
    printf '\n==> %s\n' "$*" >&2
}

die() {
    printf 'scripts/test.sh: %s\n' "$*" >&2
    exit 1
}

# Runs a command as root: directly when we are root, through sudo when it needs no password.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        die "\`$*\` needs root, and sudo is not available without a password"
    fi
}

# Runs a command as the `postgres` user, which owns the packaged cluster.
as_postgres() {
    if [ "$(id -un)" = postgres ]; then
        "$@"
    elif [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        as_root runuser -u postgres -- "$@"
    fi
}

ensure_cargo() {
    # A non-login shell may not have rustup's directory on its PATH yet.
    if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
        # shellcheck source=/dev/null
        . "$HOME/.cargo/env"
    fi
    command -v cargo >/dev/null 2>&1 || die "cargo not found: install a Rust toolchain with rustup"
}

# Installs a rustup component when its cargo subcommand is missing. That download needs the network;
# offline, the script stops here and says so.
ensure_component() {
    local subcommand=$1 component=$2
    if cargo "$subcommand" --version >/dev/null 2>&1; then
        return
    fi
    step "rustup component add $component"
    command -v rustup >/dev/null 2>&1 || die "\`cargo $subcommand\` is missing and rustup is not installed"
    rustup component add "$component" \
        || die "\`cargo $subcommand\` is missing and \`rustup component add $component\` failed (it needs network access)"
}

# Debian packages that a fresh Debian 12 with only rustup lacks, installed when their command is
# missing: a C compiler and the C library's headers (the linker rustc calls, and the C parts of ring
# and of sqlx's bundled SQLite), Python's venv and ensurepip (gateways/setup.sh, the client packaging
# test), openssl (the compose header tests/deploy.rs runs), the CA bundle, npm (which brings
# Debian's Node.js; ensure_node replaces it when it is older than 20), and nginx and HAProxy
# (gateways/peers puts them in front of capgate's forward-auth door).
ensure_system_packages() {
    local missing=()
    command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    [ -e /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
    command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
    if [ "${#missing[@]}" -eq 0 ]; then
        return
    fi
    step "apt-get install ${missing[*]}"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# Node.js 20 or later for the TypeScript gateway and client. Debian 12's is 18: then Node 20 comes
# from the npm registry (the node-linux-* package ships the official binary), into scripts/.tools/,
# and goes first on the PATH; Debian's npm runs on it.
NODE_VERSION=20.20.2
ensure_node() {
    local major
    major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$major" -ge 20 ]; then
        return
    fi
    local arch
    case "$(uname -m)" in
        x86_64) arch=x64 ;;
        aarch64) arch=arm64 ;;
        *) die "Node.js $major is too old and no Node.js 20 package is known for $(uname -m)" ;;
    esac
    local tools="$PWD/scripts/.tools/node-$NODE_VERSION"
    local bin="$tools/node_modules/node-linux-$arch/bin"
    if [ ! -x "$bin/node" ]; then
        step "npm install node-linux-$arch@$NODE_VERSION (Node.js ${major} is older than 20)"
        mkdir -p "$tools"
        npm install --prefix "$tools" --no-save --no-audit --no-fund --loglevel=error "node-linux-$arch@$NODE_VERSION"
    fi
    export PATH="$bin:$PATH"
    [ "$(node -p 'process.versions.node')" = "$NODE_VERSION" ] || die "node-linux-$arch did not put Node.js $NODE_VERSION on the PATH"
}

# PostgreSQL on 127.0.0.1:5432, for the store tests (tests/store.rs). Starts Debian's packaged
# cluster when it is not answering, installs the package first when it is missing, and exports
# DATABASE_URL. A server that is already running is used as it is. CAPGATE_REQUIRE_POSTGRES=1 turns
# the PostgreSQL variants' "skipped: no DATABASE_URL" into a failure, so this run cannot pass on
# SQLite alone.
ensure_postgres() {
    export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
    export CAPGATE_REQUIRE_POSTGRES=1
    if command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p 5432; then
        return
    fi

    local installed_now=false
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        step "apt-get install postgresql"
        as_root apt-get update
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
        installed_now=true
    fi

    local version
    version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$version" ]; then
        # The package was told not to create a cluster: create the default one.
        version=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
        [ -n "$version" ] || die "PostgreSQL is installed but no server version was found in /usr/lib/postgresql"
        as_root pg_createcluster "$version" main
    fi

    if [ "$installed_now" = true ]; then
        # A cluster this script created: let local tests connect as `postgres` without a password,
        # as DATABASE_URL says. A cluster that was already there keeps its own authentication.
        local hba="/etc/postgresql/$version/main/pg_hba.conf"
        as_root sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    fi

    step "pg_ctlcluster $version main start"
    as_postgres pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    local attempt
    for attempt in $(seq 1 30); do
        if pg_isready -q -h 127.0.0.1 -p 5432; then
            if [ "$installed_now" = true ]; then
                # In case the package's own scripts had started it before pg_hba.conf was changed.
                as_postgres pg_ctlcluster --skip-systemctl-redirect "$version" main reload
            fi
            return
        fi
        sleep 1
    done
    die "PostgreSQL $version did not start on 127.0.0.1:5432 (attempted for ${attempt}s; see /var/log/postgresql/)"
}

ensure_cargo
ensure_system_packages
ensure_node
ensure_component fmt rustfmt
ensure_component clippy clippy
if [ "${1:-}" = --prepare ]; then
    ensure_postgres
    step "ready: cc, python3 -m venv, openssl, node $(node --version), npm $(npm --version), PostgreSQL on 127.0.0.1:5432"
    exit 0
fi

step "cargo fmt --all --check"
cargo fmt --all --check

# The core's own clippy.toml bans clocks, files, the environment, the network, processes and
# randomness for capgate-core alone; `-D warnings` turns a use into a failure.
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

ensure_postgres

# With nextest, doctests and benches run first through cargo: nextest does not run doctests, and it
# would start one process per benchmark, each building its fixture again (seconds become a minute).
# Either way, the last line printed is the test runner's summary.
if cargo nextest --version >/dev/null 2>&1; then
    step "cargo test --workspace --doc"
    cargo test --workspace --doc
    step "cargo test --workspace --benches"
    cargo test --workspace --benches
    step "cargo nextest run --workspace"
    cargo nextest run --workspace
else
    step "cargo test --workspace --all-targets"
    cargo test --workspace --all-targets
    step "cargo test --workspace --doc"
    cargo test --workspace --doc
fi

# The PostgreSQL half of the store suite again, through Debian's PgBouncer: in transaction mode,
# where a server session is lent for one transaction (`pooler=transaction`), and in session mode
# (docs/decisions/0033-behind-a-pooler-and-a-failover.md). scripts/pgbouncer.sh installs it and
# starts one per mode; the databases are still created and migrated on the server itself.
step "the store suite through PgBouncer (transaction and session pooling)"
bash scripts/pgbouncer.sh
for pooler in 'postgres://postgres@127.0.0.1:6432/postgres?pooler=transaction' \
    'postgres://postgres@127.0.0.1:6433/postgres'; do
    step "CAPGATE_TEST_POOLER_URL=$pooler"
    if cargo nextest --version >/dev/null 2>&1; then
        CAPGATE_TEST_POOLER_URL=$pooler cargo nextest run --workspace -E 'binary(store) and test(/postgres/)'
    else
        CAPGATE_TEST_POOLER_URL=$pooler cargo test --workspace --test store postgres
    fi
done

# The reference gateways (gateways/): their toolchains and packages from their lockfiles, then the
# Python and TypeScript suites and the shared scenario suite, against the capgate the tests above
# built. Its last line is pytest's summary.
# The binary the Rust tests ran (`cargo build` alone would rebuild it, and half the dependency tree,
# with the features of a build without dev-dependencies).
# Where cargo put it: `target/`, or `CARGO_TARGET_DIR` (relative to here) when that is set.
step "gateways/run-tests.sh"
capgate_bin="${CARGO_TARGET_DIR:-target}/debug/capgate"
case "$capgate_bin" in /*) ;; *) capgate_bin="$PWD/$capgate_bin" ;; esac
[ -x "$capgate_bin" ] || die "$capgate_bin was not built by the tests above"
CAPGATE_BIN="$capgate_bin" bash gateways/run-tests.sh
