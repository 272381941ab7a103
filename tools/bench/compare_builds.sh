#!/usr/bin/env bash
# Two ptrain builds side by side on the bench GPT (tools/bench/gpt.yaml), runs alternating so that
# background load hits both alike: the median step time after two warm-up steps of each run.
#
#   tools/bench/compare_builds.sh OLD_BUILD NEW_BUILD [small|large] [--nproc N] [key=value ...]
#
# e.g. after `git worktree add /tmp/old <commit> && cmake -S /tmp/old -B /tmp/old/build &&
# cmake --build /tmp/old/build --target ptrain ptrain_plugins_all`:
#   tools/bench/compare_builds.sh /tmp/old/build build small
#   tools/bench/compare_builds.sh /tmp/old/build build small --nproc 2 parallel.tensor_model_parallel_size=2
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
old=$1 new=$2
shift 2
size=small
if [ $# -gt 0 ] && [[ $1 != *=* && $1 != --* ]]; then size=$1; shift; fi
nproc=1
if [ $# -gt 1 ] && [ "$1" = "--nproc" ]; then nproc=$2; shift 2; fi
case $size in
  small) shape="model.num_layers=4 model.hidden_size=256 model.num_attention_heads=4 model.seq_length=64 train.global_batch_size=32 train.steps=14" ;;
  large) shape="model.num_layers=8 model.hidden_size=1024 model.num_attention_heads=16 model.seq_length=128 train.global_batch_size=8 train.steps=8" ;;
  *) echo "compare_builds: size '$size' is not small or large" >&2; exit 2 ;;
esac
recipe="$(cd "$(dirname "$0")" && pwd)/gpt.yaml"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
median() {
  python3 -c 'import json,sys,statistics
t=[json.loads(l)["step_time_s"] for l in open(sys.argv[1]) if "step_time_s" in l and json.loads(l)["step"]>2]
print("%.4f" % statistics.median(t))' "$1"
}
for rep in 1 2 3; do
  line="run $rep:"
  for build in "$old" "$new"; do
    dir="$scratch/run"
    rm -rf "$dir"
    # shellcheck disable=SC2086
    "$build/bin/ptrain" run "$recipe" --nproc "$nproc" --run-dir "$dir" launch.nproc="$nproc" $shape "$@" >"$scratch/log" 2>&1 ||
      { cat "$scratch/log" >&2; exit 1; }
    line="$line $build $(median "$dir/metrics.jsonl") s"
  done
  echo "$line"
done
