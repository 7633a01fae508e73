#!/usr/bin/env bash
# Code by commit (issue #12): what a worker that cannot see the checkout
# costs against one on a shared file system, in one run on one machine.
#
#   sudo bash bench/bycommit.sh [FVD_BIN]
#
# For two repositories, the example port in a repository of its own and the
# same port inside a clone of the fvd repository (port folder
# examples/tinyport, the whole history behind it), it runs the example port
# up to its question (exit 3) on a fresh `fvd orchestrator serve` and one
# fresh `fvd worker`:
#   shared    the worker sees the checkout (it runs the jobs there);
#   bycommit  the worker runs in its own mount namespace with a tmpfs over
#             the checkout's parent (`unshare -m`: needs root), so every job
#             runs in a checkout of its own, fetched over its stream;
#   warm      bycommit again on the same worker workspace (--rerun): the
#             clone already holds the commit.
# and prints, per run, the time from the first job's queueing to its
# process start, and for bycommit the bytes fetched for the first job and
# for each agent attempt's commit (timestep_embed's two attempts).
# FVD_BIN defaults to target/debug/fvd (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BIN=${1:-$ROOT/target/debug/fvd}
[ -x "$BIN" ] || cargo build --quiet --bin fvd
BIN=$(realpath "$BIN")
unshare -m --propagation private true || { echo "bycommit bench needs root and unshare -m" >&2; exit 2; }

WORK=$(mktemp -d /tmp/fvd-bycommit.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
cp "$BIN" "$WORK/fvd"
FVD="$WORK/fvd"

git_id=(-c user.name=bench -c user.email=bench@localhost)

# A repository holding the example port at its top.
make_own() {
  mkdir -p "$1"
  cp -r "$ROOT/examples/tinyport/." "$1/"
  git -C "$1" init -q -b main
  git -C "$1" add -A
  git "${git_id[@]}" -C "$1" commit -q -m base
  echo "$1"
}

# A clone of the fvd repository (its history included); the port folder is
# examples/tinyport inside it.
make_fvd_clone() {
  git clone -q --no-local "$ROOT" "$1"
  echo "$1/examples/tinyport"
}

# run NAME STATE PORT_DIR HIDE(0|1) WORKSPACE [submit flags...]: one
# orchestrator on the database in $WORK/STATE, one worker, one submit.
run() {
  local name=$1 state=$WORK/$2 port=$3 hide=$4 ws=$5; shift 5
  local dir=$WORK/$name
  mkdir -p "$dir" "$state"
  "$FVD" orchestrator serve --listen 127.0.0.1:0 --db "sqlite://$state/o.db" \
    >"$dir/o.out" 2>"$dir/o.log" &
  local opid=$!
  PIDS+=($opid)
  local url=""
  for _ in $(seq 100); do
    url=$(awk '/listening on/ {print $NF}' "$dir/o.out" 2>/dev/null || true)
    [ -n "$url" ] && break
    sleep 0.1
  done
  local worker=("$FVD" worker --orchestrator "$url" --workspace "$ws" --gpus none --cpu-slots 2 --worker-id "$name")
  if [ "$hide" = 1 ]; then
    local hidden
    hidden=$(dirname "$(git -C "$port" rev-parse --show-toplevel)")
    FVD_LOG=info unshare -m --propagation private sh -c 'mount -t tmpfs fvd-hidden "$0" && exec "$@"' \
      "$hidden" "${worker[@]}" >/dev/null 2>"$dir/w.log" &
  else
    FVD_LOG=info "${worker[@]}" >/dev/null 2>"$dir/w.log" &
  fi
  local wpid=$!
  PIDS+=($wpid)
  local t0 code=0
  t0=$(date +%s%3N)
  "$FVD" submit --family tinyport --repo "$port" --orchestrator "$url" --wait "$@" \
    >"$dir/submit.out" 2>"$dir/submit.err" || code=$?
  kill "$wpid" "$opid" 2>/dev/null || true
  wait "$wpid" "$opid" 2>/dev/null || true
  python3 - "$dir" "$state" "$name" "$code" "$t0" <<'EOF'
import re, sqlite3, sys
d, state, name, code, t0 = sys.argv[1:6]
db = sqlite3.connect(f"{state}/o.db")
rows = db.execute(
    "SELECT queued_ms, spawned_ms FROM jobs WHERE spawned_ms IS NOT NULL AND queued_ms >= ?",
    (int(t0),)).fetchall()
first = min(rows, key=lambda r: r[1])
log = re.sub(r"\x1b\[[0-9;]*m", "", open(f"{d}/w.log").read())
fetched = [(m.group(1), int(m.group(2)), int(m.group(3))) for m in re.finditer(
    r"fetched the code of a commit .*?commit=(\w+) bytes=(\d+) haves=\d+ ms=(\d+)", log)]
modes = re.findall(r"mode=(\w+)", log)
print(f"RESULT {name} exit={code} first_job_queue_to_start_ms={first[1] - first[0]} "
      f"jobs={len(modes)} modes={sorted(set(modes))} "
      f"fetches(commit,bytes,ms)={[(c[:12], b, ms) for c, b, ms in fetched]}")
EOF
}

for repo in own fvd; do
  if [ $repo = own ]; then
    port=$(make_own "$WORK/src-$repo/hidden/repo")
  else
    port=$(make_fvd_clone "$WORK/src-$repo/hidden/repo")
  fi
  echo "== $repo: $(git -C "$port" rev-list --count HEAD) commit(s), $(git -C "$port" count-objects -vH | awk '/size-pack/ {print $2 $3}') packed"
  run "$repo-shared" "$repo-shared" "$port" 0 "$WORK/ws-$repo-shared"
  # The same repository as new for the next port: no worktree, branch or
  # status file of the first.
  rm -rf "$port/.fvd"
  git -C "$port" worktree prune
  git -C "$port" branch -D fvd/tinyport/timestep_embed fvd/tinyport/time_shift >/dev/null 2>&1 || true
  git -C "$port" checkout -q -- .
  git -C "$port" clean -q -fd -- .
  run "$repo-bycommit" "$repo-bycommit" "$port" 1 "$WORK/ws-$repo-bycommit"
  run "$repo-warm" "$repo-bycommit" "$port" 1 "$WORK/ws-$repo-bycommit" --rerun
done
