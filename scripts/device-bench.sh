#!/usr/bin/env bash
# The service benchmark plan of issue 33, for a borrowed quiet machine with many cores, no
# PostgreSQL and no package registry, where time is short (minutes) and nothing can be built.
#
#   scripts/device-bench.sh prepare [--pg-pack DIR]   here: build, strip, pack into .device/
#   scripts/device-bench.sh run OUT [--quick]          there: start PostgreSQL, run the plan into OUT
#
# `prepare` builds the service bench with the bench profile (release), strips it, and packs this
# machine's PostgreSQL 15 beside it with the workplace's pg-pack tool (`--pg-pack`, default
# ../shared/tools/pg-pack). .device/ is ignored by git; carry it to the other machine with the
# checkout, and there run `scripts/device-bench.sh run "$OUT"`.
#
# `run` writes, as it goes (so that a run cut off still leaves what it measured):
#   OUT/machine.txt   cores, memory, kernel, PostgreSQL's settings that matter
#   OUT/tables.txt    every invocation's command and its table (medians, ratios)
#   OUT/results.jsonl every invocation's JSON document, one per line, with its label
#   OUT/progress.txt  the bench's progress lines, timestamped
# The plan (about 7 minutes on 16 cores; `--quick` runs each step once, briefly, to try the
# script):
#   1. PostgreSQL, the targets' table: 1, 16, 64, 256 callers; uncapped, capped (1,000 keys),
#      capped-hot (one key), against the health, append and hot-row baselines; 2 runs, median.
#   2. SQLite (the embedded default): 64 and 256 callers, uncapped and capped; 2 runs.
#   3. The sweep docs/operations.md is sized from: PostgreSQL at 64 and 256 callers, uncapped and
#      capped, over store connections × audit transactions in flight × batch size.
# No profile: the lent machines have no `perf`, and under their kernel (gVisor) no hardware events.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
device=$here/.device

prepare() {
    local pack=$here/../shared/tools/pg-pack
    while [[ $# -gt 0 ]]; do
        case $1 in
            --pg-pack) pack=${2:?--pg-pack DIR}; shift 2 ;;
            *) echo "prepare: unknown argument $1" >&2; exit 2 ;;
        esac
    done
    [[ -x $pack/pack.sh || -f $pack/pack.sh ]] \
        || { echo "prepare: no pg-pack at $pack (give --pg-pack DIR)" >&2; exit 2; }
    mkdir -p "$device"
    cd "$here"
    # The bench profile is release with `debug = 1`; the executable cargo names last is the bench.
    local bench
    bench=$(cargo bench --bench service --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json, sys
paths = [m["executable"] for m in map(json.loads, sys.stdin)
         if m.get("reason") == "compiler-artifact" and m.get("executable")
         and m["target"]["name"] == "service"]
print(paths[-1])')
    strip -o "$device/service" "$bench"
    bash "$pack/pack.sh" "$device" >/dev/null
    git rev-parse HEAD >"$device/commit"
    du -sh "$device"/* | sed 's/^/prepared: /'
    echo "carry .device; there: scripts/device-bench.sh run \"\$OUT\""
}

# A PostgreSQL program of the packed server, run as its unprivileged user (it refuses root).
as_pg() {
    local program=$1; shift
    su pgu -s /bin/bash -c "LD_LIBRARY_PATH=$pgdir/libs $(printf '%q ' "$pgbin/$program" "$@")"
}

# One bench invocation: its table appended to tables.txt, its JSON to results.jsonl.
bench() {
    local label=$1; shift
    local json=$out/.last.json
    {
        echo
        echo "## $label"
        echo "service --bench $*"
    } >>"$out/tables.txt"
    "$device/service" --bench "$@" --json-file "$json" >>"$out/tables.txt" \
        2> >(while IFS= read -r line; do printf '%s %s\n' "$(date +%T)" "$line"; done >>"$out/progress.txt") \
        || echo "(exit $?)" >>"$out/tables.txt"
    if [[ -s $json ]]; then
        python3 -c 'import json, sys
print(json.dumps({"label": sys.argv[1], "arguments": sys.argv[2:], "report": json.load(open(sys.argv[-1]))}))' \
            "$label" "$@" "$json" >>"$out/results.jsonl"
        rm -f "$json"
    fi
}

run() {
    out=${1:?run OUT}; shift
    local quick=
    [[ ${1:-} == --quick ]] && quick=1
    [[ -x $device/service && -f $device/pg.tar.xz ]] \
        || { echo "run: no prepared .device/ (scripts/device-bench.sh prepare here first)" >&2; exit 2; }
    mkdir -p "$out"
    local port=55432
    local url=postgres://postgres@127.0.0.1:$port/postgres
    # Global, for the trap.
    pgdir=$(mktemp -d /tmp/capgate-pg.XXXXXX)
    pgbin=$pgdir/root/usr/lib/postgresql/15/bin
    bash "$device/start.sh" "$pgdir" "$port" >/dev/null
    # pg_ctl leaves the server in its own session: stop it, whatever ends the run.
    trap 'as_pg pg_ctl -D "$pgdir/data" -m fast stop >/dev/null 2>&1; rm -rf "$pgdir"' EXIT
    {
        echo "commit: $(cat "$device/commit" 2>/dev/null)"
        echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
        grep -E 'MemTotal' /proc/meminfo
        echo "kernel: $(uname -r); load: $(cat /proc/loadavg)"
        echo "postgres: $(as_pg postgres --version)"
        local setting
        for setting in synchronous_commit fsync wal_sync_method shared_buffers max_connections; do
            echo "$setting = $(as_pg postgres -D "$pgdir/data" -C "$setting")"
        done
    } >"$out/machine.txt"

    local repeat=2 long=3s warm=1s short=1500ms brief=500ms
    if [[ -n $quick ]]; then repeat=1 long=300ms warm=100ms short=300ms brief=100ms; fi

    bench "PostgreSQL: the targets' table" --database-url "$url" --concurrency 1,16,64,256 \
        --scenario uncapped,capped,capped-hot --repeat "$repeat" --duration "$long" --warmup "$warm"
    bench "SQLite: the embedded default" --concurrency 64,256 --scenario uncapped,capped \
        --repeat "$repeat" --duration "$long" --warmup "$warm"
    local connections in_flight batch
    for connections in 8 32; do
        for in_flight in 1 2 4; do
            bench "sweep: store connections $connections, in flight $in_flight, batch 512" \
                --database-url "$url" --concurrency 64,256 --scenario uncapped,capped \
                --store-connections "$connections" --audit-in-flight "$in_flight" \
                --duration "$short" --warmup "$brief"
        done
    done
    for batch in 64 2048; do
        bench "sweep: store connections 32, in flight 2, batch $batch" \
            --database-url "$url" --concurrency 64,256 --scenario uncapped,capped \
            --store-connections 32 --audit-in-flight 2 --audit-batch "$batch" \
            --duration "$short" --warmup "$brief"
    done
    echo "done: $(date +%T), load $(cat /proc/loadavg)" >>"$out/progress.txt"
}

case ${1:-} in
    prepare) shift; prepare "$@" ;;
    run) shift; run "$@" ;;
    *) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
