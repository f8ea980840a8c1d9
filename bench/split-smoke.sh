#!/bin/sh
# bench-rma in split mode: the initiator waits (--no-fork), a separately
# started target connects (--target). Both must exit 0 and the initiator must
# print its JSON. Usage: split-smoke.sh BENCH_RMA PROVIDER
set -u
bench=$1
provider=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bench" --provider "$provider" --smoke --json --no-fork >"$dir/out.json" 2>"$dir/err" &
init=$!
port=
i=0
while [ -z "$port" ] && [ $i -lt 100 ]; do
  port=$(sed -n 's/.*waiting for a target on port \([0-9]*\).*/\1/p' "$dir/err")
  [ -n "$port" ] || sleep 0.1
  i=$((i + 1))
done
if [ -z "$port" ]; then
  echo "initiator never announced its port:" >&2
  cat "$dir/err" >&2
  kill "$init" 2>/dev/null
  exit 1
fi
"$bench" --provider "$provider" --smoke --target "127.0.0.1:$port"
trc=$?
wait "$init"
irc=$?
cat "$dir/out.json"
if [ $trc -ne 0 ] || [ $irc -ne 0 ]; then
  echo "target exit $trc, initiator exit $irc" >&2
  cat "$dir/err" >&2
  exit 1
fi
grep -q '"results"' "$dir/out.json" || { echo "no JSON results" >&2; exit 1; }
