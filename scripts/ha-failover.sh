#!/usr/bin/env bash
# capgate on a PostgreSQL cluster that fails over, on one machine: etcd, three Patroni nodes and
# HAProxy from Debian's packages, configured from deploy/ha/; three `capgate serve` replicas
# through HAProxy (`target_session_attrs=read-write`), each with an audit spool, under a steady
# load of `capgate decide` callers. Then, one after the other, with time to settle in between:
#
#   kill        the primary's postmaster is killed (SIGKILL); Patroni restarts it
#   node loss   the primary's Patroni and postmaster are killed (SIGKILL): another node takes over
#   switchover  `patronictl switchover`: the primary hands over cleanly
#
# and checks: every decision the callers were answered has its audit row (0 missing), the
# ceiling was never exceeded (callers' allows and audit rows), and no replica exited. It prints,
# per event, the outage callers saw: the longest time without a normal answer (an answer that
# is not UNAVAILABLE, a transport error or `usage_unknown`).
#
# Not run by CI (it takes a few minutes and installs a cluster's worth of packages); its figures
# are in docs/operations.md. Run as root, or with password-less sudo, on Debian 12:
#
#   scripts/ha-failover.sh            (CAPGATE=path/to/capgate to use another build)
#
# It works in /tmp/capgate-ha and stops everything it started when it ends.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
work=${CAPGATE_HA_DIR:-/tmp/capgate-ha}
capgate=${CAPGATE:-$repo/target/debug/capgate}
# About what the callers ask for until the switchover: allows are answered through the first
# two events, and the ceiling is reached before the end.
ceiling=${CEILING:-4000}
callers=${CALLERS:-4}
settle=${SETTLE:-20}

step() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'scripts/ha-failover.sh: %s\n' "$*" >&2; exit 1; }
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}
as_postgres() {
    if [ "$(id -un)" = postgres ]; then "$@"; else as_root runuser -u postgres -- "$@"; fi
}
# Becomes a command run as `postgres`. Started with `&`, the function runs in a subshell that the
# command replaces, so that `$!` is the command's own pid.
exec_as_postgres() {
    if [ "$(id -un)" = postgres ]; then
        exec "$@"
    elif [ "$(id -u)" -eq 0 ]; then
        exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
    else
        exec sudo -n -u postgres -- "$@"
    fi
}
now_ms() { date +%s%3N; }
event() { printf '%s\t%s\n' "$(now_ms)" "$1" >>"$work/events.tsv"; step "$(date +%T) $1"; }
# The cluster as any live node's REST API has it.
cluster() {
    curl -fs http://127.0.0.1:8011/cluster || curl -fs http://127.0.0.1:8012/cluster || curl -fs http://127.0.0.1:8013/cluster
}
leader() {
    cluster | python3 -c \
        'import json,sys; print([m["name"] for m in json.load(sys.stdin)["members"] if m["role"] == "leader"][0])'
}
postmaster_pid() { head -n 1 "$work/$1/postmaster.pid"; }

missing=()
for package_command in patroni:patroni etcd-server:etcd etcd-client:etcdctl haproxy:haproxy \
    postgresql:pg_ctlcluster python3-psycopg2:; do
    package=${package_command%%:*}
    command=${package_command##*:}
    if [ -n "$command" ]; then
        command -v "$command" >/dev/null 2>&1 || [ -x "/usr/sbin/$command" ] || missing+=("$package")
    else
        /usr/bin/python3 -c 'import psycopg2' 2>/dev/null || missing+=("$package")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    step "apt-get install ${missing[*]}"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
pg_bin=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin | sort -V | tail -n 1)
[ -x "$capgate" ] || die "$capgate is missing: cargo build first (or set CAPGATE)"

pids=()
patroni_pids=()
cleanup() {
    set +e
    [ -f "$work/stop" ] || touch "$work/stop" 2>/dev/null
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    [ -f "$work/haproxy.pid" ] && kill "$(cat "$work/haproxy.pid")" 2>/dev/null
    for pid in "${patroni_pids[@]}"; do as_root kill "$pid" 2>/dev/null; done
    for _ in $(seq 1 20); do
        alive=0
        for pid in "${patroni_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.5
    done
    # A Patroni that cannot reach etcd any more may not stop on its own.
    for pid in "${patroni_pids[@]}"; do as_root kill -9 "$pid" 2>/dev/null; done
    for node in 1 2 3; do
        [ -d "$work/pg$node" ] && as_postgres "$pg_bin/pg_ctl" -D "$work/pg$node" -m immediate stop >/dev/null 2>&1
    done
    [ -f "$work/etcd.pid" ] && kill "$(cat "$work/etcd.pid")" 2>/dev/null
}
trap cleanup EXIT

for port in 2379 5000 5441 5442 5443 8011 8012 8013 51001 51002 51003; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "127.0.0.1:$port is taken: a cluster of an earlier run is still up?"
    fi
done

step "a fresh $work"
as_root rm -rf "$work"
mkdir -p "$work"
as_root chown postgres "$work"
chmod 777 "$work"

step "etcd on 127.0.0.1:2379"
exec_as_postgres etcd --name capgate-ha --data-dir "$work/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster capgate-ha=http://127.0.0.1:2380 >"$work/etcd.log" 2>&1 &
echo $! >"$work/etcd.pid"
for _ in $(seq 1 50); do ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:2379 endpoint health >/dev/null 2>&1 && break; sleep 0.2; done

step "three Patroni nodes (deploy/ha/patroni.yml) on 5441-5443, REST 8011-8013"
for node in 1 2 3; do
    sed -e "s/^name: pg1/name: pg$node/" -e "s/5441/544$node/g" -e "s/8011/801$node/g" \
        -e "s#/var/lib/capgate-ha/pg1#$work/pg$node#g" -e "s#/usr/lib/postgresql/15/bin#$pg_bin#" \
        deploy/ha/patroni.yml >"$work/patroni$node.yml"
    mkdir -p "$work/pg$node.sock"
    as_root chown postgres "$work/pg$node.sock"
    exec_as_postgres patroni "$work/patroni$node.yml" >"$work/patroni$node.log" 2>&1 &
    patroni_pids[$node]=$!
    # The first bootstraps the cluster; the others clone it once it is up.
    if [ "$node" = 1 ]; then
        for _ in $(seq 1 60); do curl -fs http://127.0.0.1:8011/primary >/dev/null && break; sleep 1; done
    fi
done
for _ in $(seq 1 120); do
    running=$(cluster | python3 -c \
        'import json,sys; print(sum(m["state"] in ("running","streaming") for m in json.load(sys.stdin)["members"]))' 2>/dev/null || echo 0)
    [ "$running" = 3 ] && break
    sleep 1
done
[ "$running" = 3 ] || die "the cluster did not come up with three members (see $work/patroni*.log)"
as_postgres patronictl -c "$work/patroni1.yml" list

step "HAProxy (deploy/ha/haproxy.cfg) on 127.0.0.1:5000"
haproxy -f deploy/ha/haproxy.cfg -D -p "$work/haproxy.pid"
export PGPASSWORD=ha-superuser-password
# HAProxy counts every server up until its first checks say otherwise: wait until five
# connections in a row reach the primary.
in_a_row=0
for _ in $(seq 1 60); do
    if [ "$(psql -h 127.0.0.1 -p 5000 -U postgres -d postgres -Atc 'select pg_is_in_recovery()' 2>/dev/null)" = f ]; then
        in_a_row=$((in_a_row + 1))
        [ "$in_a_row" = 5 ] && break
    else
        in_a_row=0
    fi
    sleep 0.5
done
[ "$in_a_row" = 5 ] || die "HAProxy does not reach the primary on 127.0.0.1:5000"
psql -h 127.0.0.1 -p 5000 -U postgres -d postgres -qc "CREATE ROLE capgate LOGIN PASSWORD 'capgate-ha'" \
    -c 'CREATE DATABASE capgate OWNER capgate'
url='postgres://capgate:capgate-ha@127.0.0.1:5000/capgate?target_session_attrs=read-write'

step "capgate migrate, then three replicas"
CAPGATE_DATABASE_URL=$url "$capgate" migrate
sed "s/limits: { calls: 600, per: 1h }/limits: { calls: $ceiling, per: 1h }/" examples/policy.yaml >"$work/policy.yaml"
grep -q "calls: $ceiling" "$work/policy.yaml" || die "the example's ceiling moved"
for replica in 1 2 3; do
    mkdir -p "$work/spool$replica"
    CAPGATE_DATABASE_URL=$url "$capgate" serve --listen "127.0.0.1:5100$replica" \
        --policy "$work/policy.yaml" --catalog examples/catalog.yaml \
        --audit-spool "$work/spool$replica" --poll-interval 1s \
        >"$work/capgate$replica.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do grep -q 'capgate serving' "$work/capgate$replica.log" && break; sleep 0.2; done
    grep -q 'capgate serving' "$work/capgate$replica.log" || die "replica $replica did not start (see $work/capgate$replica.log)"
done
replica_pids=("${pids[@]}")

step "$callers callers on the three replicas"
python3 - "$capgate" "$work" "$callers" >"$work/load.log" 2>&1 <<'PY' &
import json, subprocess, sys, threading, time, os
capgate, work, callers = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = open(os.path.join(work, "calls.tsv"), "w", buffering=1)
lock = threading.Lock()
def caller(n):
    i = n
    while not os.path.exists(os.path.join(work, "stop")):
        replica = 1 + i % 3
        capped = i % 2 == 0
        args = [capgate, "decide", "--server", f"http://127.0.0.1:5100{replica}", "--json", "--issuer", "staff"]
        # Ana reading tickets has the ceiling (/grants/0); Dee searching docs has none (/grants/2).
        if capped:
            args += ["--subject", "ana", "--attr", "dept=support", "--capability", "tickets.issue.read"]
        else:
            args += ["--subject", "dee", "--capability", "docs.page.search"]
        start = time.time()
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=15)
            rc, stdout = done.returncode, done.stdout
        except subprocess.TimeoutExpired:
            rc, stdout = -1, ""
        end = time.time()
        outcome = code = decision_id = "-"
        if rc == 0:
            answer = json.loads(stdout)
            decision_id = answer.get("decision_id", "-")
            decision = answer.get("result", {}).get("decision")
            if decision:
                outcome = decision["outcome"]
                code = decision["reason"]["code"]
        with lock:
            out.write(f"{int(start*1000)}\t{int(end*1000)}\t{replica}\t{'capped' if capped else 'uncapped'}\t{rc}\t{outcome}\t{code}\t{decision_id}\n")
        i += callers
threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
for t in threads: t.start()
for t in threads: t.join()
PY
pids+=($!)


sleep "$settle"
primary=$(leader)
event "kill: SIGKILL to the postmaster of $primary"
as_root kill -9 "$(postmaster_pid "$primary")"
sleep "$settle"

primary=$(leader)
event "node loss: SIGKILL to Patroni and the postmaster of $primary"
as_root kill -9 "${patroni_pids[${primary#pg}]}"
as_root kill -9 "$(postmaster_pid "$primary")"
sleep "$settle"
sleep "$settle"

primary=$(leader)
candidate=$(cluster | python3 -c \
    'import json,sys; print([m["name"] for m in json.load(sys.stdin)["members"] if m["role"] != "leader" and m["state"] in ("running","streaming")][0])')
event "switchover: $primary to $candidate"
as_postgres patronictl -c "$work/patroni${candidate#pg}.yml" switchover --leader "$primary" --candidate "$candidate" --force
sleep "$settle"
event "end of load"
touch "$work/stop"
wait "${pids[-1]}" || true

step "the replicas' spools drain"
for _ in $(seq 1 60); do
    left=$(find "$work"/spool? -maxdepth 1 -name 'audit-*.jsonl' -size +0 | wc -l)
    [ "$left" = 0 ] && break
    sleep 1
done

step "checks"
exited=0
for pid in "${replica_pids[@]}"; do kill -0 "$pid" 2>/dev/null || exited=$((exited + 1)); done
cut -f8 "$work/calls.tsv" | grep -v '^-$' >"$work/answered.ids" || true
awk -F'\t' '$6 == "allow" { print $8 }' "$work/calls.tsv" >"$work/allowed.ids"
export PGPASSWORD=capgate-ha
missing_answered=$(psql -h 127.0.0.1 -p 5000 -U capgate -d capgate -At -v ON_ERROR_STOP=1 \
    -c 'CREATE TEMP TABLE answered (id text)' -c "\\copy answered FROM '$work/answered.ids'" \
    -c 'SELECT count(*) FROM answered a WHERE NOT EXISTS (SELECT 1 FROM audit_log l WHERE l.decision_id = a.id)' | tail -n 1)
missing_allowed=$(psql -h 127.0.0.1 -p 5000 -U capgate -d capgate -At -v ON_ERROR_STOP=1 \
    -c 'CREATE TEMP TABLE allowed (id text)' -c "\\copy allowed FROM '$work/allowed.ids'" \
    -c "SELECT count(*) FROM allowed a WHERE NOT EXISTS (SELECT 1 FROM audit_log l WHERE l.decision_id = a.id AND l.outcome = 'allow')" | tail -n 1)
audit_capped_allows=$(psql -h 127.0.0.1 -p 5000 -U capgate -d capgate -At \
    -c "SELECT count(*) FROM audit_log WHERE outcome = 'allow' AND capability = 'tickets.issue.read' AND kind = 'decide'")
python3 - "$work" "$ceiling" "$missing_answered" "$missing_allowed" "$audit_capped_allows" "$exited" <<'PY'
import sys
work, ceiling = sys.argv[1], int(sys.argv[2])
missing_answered, missing_allowed, audit_allows, exited = map(int, sys.argv[3:7])
calls = [line.rstrip("\n").split("\t") for line in open(f"{work}/calls.tsv")]
events = [line.rstrip("\n").split("\t") for line in open(f"{work}/events.tsv")]
def normal(call):
    return call[4] == "0" and call[6] not in ("-", "usage_unknown")
caller_allows = sum(1 for c in calls if c[3] == "capped" and c[5] == "allow")
print(f"calls: {len(calls)}; answered: {sum(c[4] == '0' for c in calls)}; "
      f"unavailable or failed: {sum(c[4] != '0' for c in calls)}; "
      f"usage_unknown: {sum(c[6] == 'usage_unknown' for c in calls)}")
print(f"capped allows: callers {caller_allows}, audit {audit_allows}, ceiling {ceiling}")
print(f"answered decisions without their audit row: {missing_answered}; allows without theirs: {missing_allowed}")
print(f"replicas that exited: {exited}")
# Per event and kind of call: the longest time, from the event to the next one, without a normal
# answer (from the last one before to the next one), how many calls failed, and the slowest call.
for (at, name), (until, _) in zip(events, events[1:]):
    at, until = int(at), int(until)
    for kind in ("capped", "uncapped"):
        window = sorted((int(c[1]), normal(c), int(c[1]) - int(c[0]))
                        for c in calls if c[3] == kind and at - 2000 <= int(c[1]) <= until)
        last_ok, worst, failed, slowest = None, 0, 0, 0
        for end, ok, took in window:
            if end >= at:
                slowest = max(slowest, took)
                failed += not ok
            if ok:
                if last_ok is not None and end >= at:
                    worst = max(worst, end - last_ok)
                last_ok = end
        print(f"{name.split(':')[0]:>10} {kind:>8}: longest without a normal answer {worst:>5} ms, "
              f"{failed:>4} failed (UNAVAILABLE, transport error or usage_unknown), slowest call {slowest} ms")
ok = missing_answered == 0 and missing_allowed == 0 and exited == 0 \
    and caller_allows <= ceiling and audit_allows <= ceiling
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
