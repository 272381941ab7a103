#!/usr/bin/env bash
# The offline GPU check: builds ptrain on a machine with a GPU, PyTorch and no network, then runs the
# GPU tests, trains the quickstart on the GPU and times a ~1.2B-parameter GPT beside PyTorch eager.
#
#   tools/device/fetch-debs.sh                       # first, on Debian 12 with network (fills tools/device/debs/)
#   tools/device/check.sh                            # on the GPU machine, from anywhere in the tree
#   tools/device/check.sh --python /path/to/python   # the PyTorch to build against (default: python3)
#   tools/device/check.sh --configure-only           # unpack and configure, report where each package
#                                                    # was found, stop (no GPU needed)
#
# tools/device/debs/ is git-ignored: whatever copies the tree to the GPU machine must carry it (18 files,
# 12.5 MiB; 183 MB once unpacked, under the build folder). Other options: --build DIR (default
# build-device, relative to the tree's root), --jobs N (default: every core), --budget SECONDS (default
# 450 for the whole script: each phase's limit is cut to leave the later phases their minimum),
# --test-label L (default gpu), --quickstart-nproc N (default 1), --skip-bench, --quick (builds only
# ptrain, its plugins and the GPU tests; runs the GPU tests, the offload phase, then the quickstart; no
# eager or bench runs: for a second try in a short lease).
#
# Phase limits, in seconds: configure 120, build 330, gpu-tests 150, quickstart 75, bench 120 per ptrain
# run (the TF32 one only with 45 left), eager 100 per run (in the background during the build), offload
# 110 per run (with 60 left).
#
# Phases, each under `timeout`, each recorded whatever happens to the others:
#   extract     dpkg-deb -x of every tools/device/debs/*.deb into <build>/deps (never into /)
#   configure   cmake -G Ninja, CMAKE_PREFIX_PATH = <build>/deps/usr first, then PyTorch's
#               torch.utils.cmake_prefix_path; each package's *_DIR is checked to lie in <build>/deps
#   build       every default target, -j<jobs> (niced), sm_90 only (H100/H200)
#   eager       tools/bench/gpt_eager.py --device cuda, fp32 then TF32, while the build runs
#               (the GPU is otherwise idle then; the build is niced so the Python thread keeps a core)
#   gpu-tests   ctest -L gpu. ASSUMPTION: GPU tests carry the ctest label "gpu" and skip (GTEST_SKIP,
#               "no CUDA device") where no GPU is visible; here a skipped test is a failure
#   quickstart  ptrain run configs/quickstart.yaml device=cuda (one process: one GPU), final exact match
#   bench       ptrain run tools/device/gpt_1b.yaml device=cuda, fp32 (NVIDIA_TF32_OVERRIDE=0), then
#               TF32 (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1) if time is left; tokens/s and MFU beside eager
#   offload     the same GPT, fp32, 4 steps, every block recomputed (model.recompute=full): without
#               offload, then with parameters, gradients and optimizer states in pinned host memory,
#               then (time permitting) parameters alone and all three without recomputation: step
#               time and the device's peak beside the bench's fp32 run
#
# The summary goes to $OUT/summary.txt when OUT is set (phase logs to $OUT/device-logs/), else to
# <build>/summary.txt. Exit status 0 when every phase passed.
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1

python=python3
build="build-device"
jobs=$(nproc)
budget=450
label=gpu
qs_nproc=1
configure_only=0
skip_bench=0
quick=0
while [ $# -gt 0 ]; do
  case $1 in
    --python) python=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --test-label) label=$2; shift 2 ;;
    --quickstart-nproc) qs_nproc=$2; shift 2 ;;
    --configure-only) configure_only=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done

mkdir -p "$build"
build="$(cd "$build" && pwd)"
prefix="$build/deps"
logs="$build/device-logs"
rm -rf "$logs"
mkdir -p "$logs"
if [ -n "${OUT:-}" ]; then summary_file="$OUT/summary.txt"; else summary_file="$build/summary.txt"; fi

# The GPT that both sides time (tools/device/gpt_1b.yaml holds the same numbers for ptrain).
B_LAYERS=24 B_HIDDEN=2048 B_HEADS=16 B_SEQ=1024 B_BATCH=4 B_VOCAB=16 B_WARMUP=2 B_STEPS=6

start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
# limit CAP RESERVE: seconds a phase may take, CAP at most, leaving RESERVE (the later phases' minimum)
# and 10 s for the summary.
limit() {
  local left=$(( budget - $(elapsed) - $2 - 10 ))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

phases=()    # "name|status|seconds|detail"
failed=0
record() {
  phases+=("$1|$2|$3|$4")
  printf '== %-10s %-5s %4ss  %s\n' "$1" "$2" "$3" "$4"
  case $2 in ok|skip) ;; *) failed=1 ;; esac
}
# run_phase NAME LIMIT LOG CMD...: runs CMD under timeout; sets ph_rc and ph_s.
run_phase() {
  local name=$1 lim=$2 log=$3
  shift 3
  local t0
  t0=$(date +%s)
  echo "== $name (limit ${lim}s): $*" | tee "$log"
  if [ "$lim" -lt 5 ]; then
    echo "== $name: no time left in the budget" >>"$log"
    ph_rc=124 ph_s=0
    return
  fi
  timeout -k 10 "$lim" "$@" >>"$log" 2>&1
  ph_rc=$?
  ph_s=$(( $(date +%s) - t0 ))
  if [ $ph_rc -eq 124 ] || [ $ph_rc -eq 137 ]; then echo "== $name: timed out after ${lim}s" >>"$log"; fi
}
status_of() {  # rc -> ok | TIMEOUT | FAIL
  if [ "$1" -eq 0 ]; then echo ok; elif [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then echo TIMEOUT; else echo FAIL; fi
}

extra=()     # lines after the phase table
write_summary() {
  {
    echo "ptrain device check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), tree $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
    echo "machine: ${gpu_name:-no GPU seen by PyTorch}; $(nproc) cores; torch ${torch_version:-?} (CUDA ${torch_cuda:-?});" \
         "$(cmake --version 2>/dev/null | head -1); $(g++ --version 2>/dev/null | head -1);" \
         "nvcc $( (/usr/local/cuda/bin/nvcc --version 2>/dev/null || nvcc --version 2>/dev/null) | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "budget ${budget}s, used $(elapsed)s; build folder $build"
    echo
    printf '%-11s %-7s %5s  %s\n' phase status secs detail
    for p in "${phases[@]}"; do
      IFS='|' read -r n s t d <<<"$p"
      printf '%-11s %-7s %5s  %s\n' "$n" "$s" "$t" "$d"
    done
    for line in "${extra[@]}"; do echo "$line"; done
    for p in "${phases[@]}"; do
      IFS='|' read -r n s _ _ <<<"$p"
      if [ "$s" = ok ] || [ "$s" = skip ]; then continue; fi
      for f in "$logs/$n".log "$logs/$n"-*.log; do
        [ -f "$f" ] || continue
        [ "$(tail -n 1 "$f")" = "rc=0" ] && continue
        echo
        if [ "$n" = build ]; then
          echo "--- build.log: first errors ---"
          grep -m 30 -E 'error:|FAILED:|undefined reference|CMake Error' "$f"
        fi
        echo "--- $(basename "$f"): last 25 lines ---"
        tail -n 25 "$f"
      done
    done
  } >"$summary_file"
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/device-logs"
    for f in "$logs"/*; do [ -f "$f" ] && tail -n 3000 "$f" >"$OUT/device-logs/$(basename "$f")"; done
  fi
  echo
  cat "$summary_file"
  echo "(summary: $summary_file)"
}
finish() { write_summary; exit $failed; }

# --- PyTorch: where its CMake files are, and whether it sees a GPU -------------------------------------
if ! probe=$(timeout 90 "$python" - 2>"$logs/probe.log" <<'EOF'
import torch
print(torch.utils.cmake_prefix_path)
print(torch.__version__)
print(torch.version.cuda)
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
); then
  record torch FAIL 0 "$python cannot import torch (see $logs/probe.log)"
  finish
fi
{ read -r torch_prefix; read -r torch_version; read -r torch_cuda; read -r gpu_name; } <<<"$probe"

# --- extract: the Debian packages into <build>/deps ----------------------------------------------------
debs=(tools/device/debs/*.deb)
if [ ! -e "${debs[0]}" ]; then
  record extract FAIL 0 "no tools/device/debs/*.deb: run tools/device/fetch-debs.sh on Debian 12 and carry the folder"
  finish
fi
t0=$(date +%s)
want=$(stat -c '%s %n' "${debs[@]}")
if [ "$(cat "$prefix/.debs" 2>/dev/null)" != "$want" ]; then
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for f in "${debs[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix" || { record extract FAIL $(( $(date +%s) - t0 )) "dpkg-deb -x $f failed"; finish; }
    else  # no dpkg: a .deb is an ar archive holding data.tar.xz
      unpack=$(mktemp -d)
      (cd "$unpack" && ar x "$root/$f" && tar -xf data.tar.* -C "$prefix") ||
        { record extract FAIL $(( $(date +%s) - t0 )) "cannot unpack $f"; finish; }
      rm -rf "$unpack"
    fi
  done
  # A -dev package's library link may be absolute (zlib1g-dev: libz.so -> /lib/x86_64-linux-gnu/...):
  # point it into the prefix, else the linker takes the static archive beside it (not built -fPIC).
  while IFS= read -r link; do
    target=$(readlink "$link")
    if [ -e "$prefix$target" ]; then ln -sfn "$prefix$target" "$link"; fi
  done < <(find "$prefix" -type l -lname '/*')
  echo "$want" >"$prefix/.debs"
fi
libdir="$prefix/usr/lib/x86_64-linux-gnu"
# The Debian libraries' own dependencies (spdlog -> fmt) are found through this, at build time too
# (gtest_discover_tests runs the test binaries) and in every process ptrain starts.
export LD_LIBRARY_PATH="$libdir:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
record extract ok $(( $(date +%s) - t0 )) "${#debs[@]} debs -> $prefix ($(du -sm "$prefix" | cut -f1) MB)"

# --- configure -------------------------------------------------------------------------------------------
prefix_path="$prefix/usr;$libdir/cmake;$torch_prefix"
generator="Unix Makefiles"
command -v ninja >/dev/null && generator=Ninja
cuda_args=()
if [ -x /usr/local/cuda/bin/nvcc ]; then cuda_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc); fi
# A cache from another prefix, PyTorch or generator would keep the packages it found: start afresh.
stamp="$generator;$prefix_path"
if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/.device-configure" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
# sm_90 only (H100/H200): ptrain's kernels and libtorch's arch flags; CMAKE_POLICY_VERSION_MINIMUM lets
# a CMake 4 read package files written for older ones (CMake 3 ignores it).
run_phase configure "$(limit 120 100)" "$logs/configure.log" \
  cmake -S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$prefix_path" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  -DPTRAIN_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 "${cuda_args[@]}"
configure_rc=$ph_rc configure_s=$ph_s
echo "$stamp" >"$build/.device-configure"
# Where each package was found: every one must come from the unpacked debs (the system may have
# others, and a GPU machine none at all), libtorch from PyTorch.
outside=()
extra+=("" "packages found (CMakeCache.txt):")
for v in yaml-cpp_DIR spdlog_DIR fmt_DIR Boost_DIR boost_headers_DIR boost_filesystem_DIR GTest_DIR CLI11_DIR nlohmann_json_DIR Torch_DIR; do
  dir=$(sed -n "s/^$v:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null)
  where="deps"
  if [ "$v" = Torch_DIR ]; then
    case $dir in "$torch_prefix"/*) where=pytorch ;; *) where=ELSEWHERE; outside+=("$v") ;; esac
  else
    case $dir in "$prefix"/*) ;; *) where=ELSEWHERE; outside+=("$v") ;; esac
  fi
  extra+=("$(printf '  %-22s %-9s %s' "$v" "$where" "${dir:-(not set)}")")
done
fmt_link=$(readlink "$build/include-first/fmt" 2>/dev/null)
if [ -n "$fmt_link" ]; then
  extra+=("$(printf '  %-22s %-9s %s' "fmt ahead of libtorch" "$(case $fmt_link in "$prefix"/*) echo deps ;; *) echo ELSEWHERE ;; esac)" "$fmt_link")")
  case $fmt_link in "$prefix"/*) ;; *) outside+=(include-first/fmt) ;; esac
fi
cuda_line=$(grep -o 'ptrain: libtorch .*' "$logs/configure.log" | tail -1)
if [ "$configure_rc" -ne 0 ]; then
  record configure "$(status_of "$configure_rc")" "$configure_s" "cmake failed"
  finish
elif [ ${#outside[@]} -gt 0 ]; then
  record configure FAIL "$configure_s" "found outside $prefix: ${outside[*]}; $cuda_line"
else
  record configure ok "$configure_s" "$generator; every package from deps; $cuda_line"
fi
if [ $configure_only -eq 1 ]; then finish; fi

# --- build, with the eager benchmark on the idle GPU meanwhile ----------------------------------------
bench_dir="$build/device-bench"
rm -rf "$bench_dir"
mkdir -p "$bench_dir"
eager_pid=
eager_limit=$(limit 100 150)
if [ $skip_bench -eq 0 ] && [ $quick -eq 0 ] && [ -n "$gpu_name" ] && [ "$eager_limit" -ge 30 ]; then
  (
    for m in fp32 tf32; do
      flag=()
      [ $m = tf32 ] && flag=(--tf32)
      timeout -k 5 "$eager_limit" "$python" tools/bench/gpt_eager.py --device cuda --layers $B_LAYERS \
        --hidden $B_HIDDEN --heads $B_HEADS --seq $B_SEQ --batch $B_BATCH --vocab $B_VOCAB \
        --warmup $B_WARMUP --steps $B_STEPS "${flag[@]}" >"$bench_dir/eager_$m.json" 2>"$logs/bench-eager-$m.log"
      echo "rc=$?" >>"$logs/bench-eager-$m.log"
    done
  ) &
  eager_pid=$!
fi
keep_going=()  # ninja: build every target that can be built, so one failure does not hide the others
[ "$generator" = Ninja ] && keep_going=(-- -k 0)
targets=()     # --quick: what the later phases run (the GPU tests depend on ptrain and every plugin)
[ $quick -eq 1 ] && targets=(--target ptrain_gpu_tests)
run_phase build "$(limit 330 100)" "$logs/build.log" nice -n 10 cmake --build "$build" -j "$jobs" "${targets[@]}" \
  "${keep_going[@]}"
record build "$(status_of $ph_rc)" "$ph_s" "-j$jobs, last step $(grep -o '^\[[0-9]*/[0-9]*\]' "$logs/build.log" | tail -1)"
build_rc=$ph_rc
# A failed target elsewhere (ninja kept going) leaves the later phases what they need: run them.
if [ $build_rc -ne 0 ] && [ $build_rc -ne 124 ] && [ -x "$build/bin/ptrain" ] && [ -x "$build/bin/ptrain_gpu_tests" ]; then
  extra+=("" "build failed, but bin/ptrain and bin/ptrain_gpu_tests were built: the later phases ran")
  build_rc=0
fi
if [ -n "$eager_pid" ]; then wait "$eager_pid"; fi

# --- GPU tests -------------------------------------------------------------------------------------------
if [ $build_rc -ne 0 ]; then
  record gpu-tests skip 0 "no build"
elif [ "$(limit 150 80)" -lt 20 ]; then
  record gpu-tests TIMEOUT 0 "no time left"
else
  listed=$(cd "$build" && ctest -N -L "$label" 2>/dev/null | sed -n 's/^Total Tests: //p')
  if [ "${listed:-0}" -eq 0 ]; then
    record gpu-tests NONE 0 "no ctest test carries the label '$label' (see the ASSUMPTION at the top of this script)"
  else
    run_phase gpu-tests "$(limit 150 80)" "$logs/gpu-tests.log" \
      ctest --test-dir "$build" -L "$label" -V -j 8
    line=$(grep -E 'tests passed' "$logs/gpu-tests.log" | tail -1)
    skipped=$(grep -c '\*\*\*Skipped\|Not Run' "$logs/gpu-tests.log")
    st=$(status_of $ph_rc)
    if [ "$st" = ok ] && [ "$skipped" -gt 0 ]; then st=FAIL; fi
    record gpu-tests "$st" "$ph_s" "label '$label': ${line:-no result}; $skipped skipped (a skip here means the test saw no GPU)"
  fi
fi

# --- quickstart on the GPU ---------------------------------------------------------------------------------
qs_reserve=45  # for the bench and offload phases after it (none in --quick, where it runs last)
[ $quick -eq 1 ] && qs_reserve=0
quickstart_phase() {
if [ $build_rc -ne 0 ]; then
  record quickstart skip 0 "no build"
elif [ "$(limit 75 "$qs_reserve")" -lt 30 ]; then
  record quickstart TIMEOUT 0 "no time left"
else
  rm -rf "$build/runs/quickstart"
  run_phase quickstart "$(limit 75 "$qs_reserve")" "$logs/quickstart.log" \
    "$build/bin/ptrain" run configs/quickstart.yaml --nproc "$qs_nproc" --run-dir "$build/runs/quickstart" \
    launch.nproc="$qs_nproc" device=cuda
  # The run's closing summary (worker lines carry a "[rank N]" prefix), else its metrics.
  plain=$(sed -E 's/^\[rank [0-9]+\] *//' "$logs/quickstart.log")
  acc=$(awk '$1 == "eval_exact_match" {v = $2} END {print v}' <<<"$plain")
  loss=$(awk '$1 == "final" && $2 == "loss" {v = $3} END {print v}' <<<"$plain")
  if [ -z "$acc" ] && [ -f "$build/runs/quickstart/metrics.jsonl" ]; then
    acc=$(grep '"eval_exact_match"' "$build/runs/quickstart/metrics.jsonl" | tail -1 |
          sed -E 's/.*"eval_exact_match": *([-0-9.eE+]+).*/\1/')
  fi
  record quickstart "$(status_of $ph_rc)" "$ph_s" \
    "configs/quickstart.yaml device=cuda nproc=$qs_nproc: final exact match ${acc:-?}, final loss ${loss:-?}"
fi
}
[ $quick -eq 0 ] && quickstart_phase

# --- bench: ptrain on the 1.2B GPT, then the table beside eager ----------------------------------------------
ptrain_bench() {  # MODE VAR=VALUE LIMIT: one run of gpt_1b.yaml, its metrics in $bench_dir/ptrain_MODE
  local mode=$1
  shift
  rm -rf "$bench_dir/ptrain_$mode"
  run_phase "bench-$mode" "$2" "$logs/bench-$mode.log" env "$1" "$build/bin/ptrain" run tools/device/gpt_1b.yaml \
    --nproc 1 --run-dir "$bench_dir/ptrain_$mode" launch.nproc=1 device=cuda
}
if [ $skip_bench -eq 1 ] || [ $quick -eq 1 ]; then
  record bench skip 0 "--skip-bench or --quick"
elif [ -z "$gpu_name" ]; then
  record bench FAIL 0 "PyTorch sees no GPU"
else
  bench_status=ok
  if [ $build_rc -ne 0 ]; then
    bench_note="ptrain: no build"
    bench_status=FAIL
  elif [ "$(limit 120 0)" -lt 45 ]; then
    bench_note="ptrain: no time left"
    bench_status=TIMEOUT
  else
    # fp32: TF32 off in cuBLAS whatever the framework asks; tf32: on, whatever it asks.
    ptrain_bench fp32 NVIDIA_TF32_OVERRIDE=0 "$(limit 120 0)"
    bench_note="ptrain fp32 $(status_of $ph_rc) ${ph_s}s"
    [ $ph_rc -eq 0 ] || bench_status=$(status_of $ph_rc)
    if [ $ph_rc -eq 0 ] && [ "$(limit 120 0)" -ge 45 ]; then
      ptrain_bench tf32 TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 "$(limit 120 0)"
      bench_note="$bench_note, tf32 $(status_of $ph_rc) ${ph_s}s"
    else
      bench_note="$bench_note, tf32 not run"
    fi
  fi
  for m in fp32 tf32; do
    if ! grep -q step_time_s "$bench_dir/eager_$m.json" 2>/dev/null; then
      bench_note="$bench_note; eager $m failed"
      bench_status=FAIL
    fi
  done
  table=$("$python" - "$bench_dir" $B_LAYERS $B_HIDDEN $B_HEADS $B_SEQ $B_BATCH $B_VOCAB $B_WARMUP <<'EOF'
import json, os, statistics, sys
d = sys.argv[1]
L, h, heads, s, b, V, warm = map(int, sys.argv[2:])
# 12 L h^2 + V h, the usual count; exactly, with biases, LayerNorms and the position table:
approx = 12 * L * h * h + V * h
exact = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h
attn = 12 * L * h * s          # attention scores and values, forward and backward, per token
PEAK = {"fp32": 67e12, "tf32": 494e12, "bf16": 989e12}  # H200 SXM, dense
tokens = b * s
print(f"\nbench: GPT L={L} h={h} heads={heads} seq={s} batch={b} vocab={V}: {tokens} tokens/step;")
print(f"  params 12*L*h^2 + V*h = {approx:,} ({exact:,} with biases, LayerNorms, positions)")
print(f"  model FLOPs/token 6N = {6 * exact / 1e9:.2f} GFLOP with N = {exact:,} (+ attention 12*L*h*s ="
      f" {attn / 1e9:.2f} GFLOP)")
print("  H200 dense peaks: fp32 67, tf32 494, bf16 989 TFLOP/s. MFU = 6 N tokens/s / the peak of the precision the")
print("  run used (fp32 rows: 67, tf32 rows: 494); 'vs tf32': 6 N tokens/s / 494 for every row; '+attn': MFU with")
print("  the attention FLOPs added. Both sides train in fp32 (weights, activations, AdamW); only the matmul differs.")
print(f"  {'run':<14}{'matmul':<8}{'step s':>8}{'tok/s':>9}{'TFLOP/s':>9}{'MFU':>8}{'vs tf32':>9}{'+attn':>8}{'GPU GB':>8}")
rows = []
for who in ("ptrain", "eager"):
    for m in ("fp32", "tf32"):
        step, mem = None, None
        if who == "eager":
            try:
                r = json.loads(open(os.path.join(d, f"eager_{m}.json")).read().strip().splitlines()[-1])
                step, mem = r["step_time_s"], r.get("peak_gpu_mem_gb")
            except Exception:
                pass
        else:
            try:
                t = [json.loads(l) for l in open(os.path.join(d, f"ptrain_{m}", "metrics.jsonl"))]
                mem = max((x.get("peak_device_mb", 0) for x in t), default=0) / 1024 or None
                t = [x["step_time_s"] for x in t if "step_time_s" in x and x["step"] > warm]
                step = statistics.median(t) if t else None
            except Exception:
                pass
        if step is None:
            print(f"  {who:<14}{m:<8}{'no result':>8}")
            continue
        tps = tokens / step
        fl = 6 * exact * tps
        mfu = fl / PEAK[m]
        print(f"  {who:<14}{m:<8}{step:>8.3f}{tps:>9.0f}{fl / 1e12:>9.1f}{100 * mfu:>7.1f}%"
              f"{100 * fl / PEAK['tf32']:>8.1f}%{100 * (fl + attn * tps) / PEAK[m]:>7.1f}%"
              + (f"{mem:>8.1f}" if mem is not None else f"{'-':>8}"))
        rows.append((who, m, tps))
r = {(w, m): t for w, m, t in rows}
for m in ("fp32", "tf32"):
    if ("ptrain", m) in r and ("eager", m) in r:
        print(f"  ptrain/eager tokens/s, {m}: {r[('ptrain', m)] / r[('eager', m)]:.2f}x")
print("  (median step time after the warm-up steps; ptrain's step ends when the loss is on the host, eager")
print("  synchronizes the device around each step; eager ran while the build did, the build niced)")
EOF
)
  while IFS= read -r line; do extra+=("$line"); done <<<"$table"
  record bench "$bench_status" 0 "$bench_note"
fi

# --- offload: the same GPT with its tensors at rest in pinned host memory ----------------------------------
offload_run() {  # NAME LIMIT OVERRIDES...: 4 steps of gpt_1b.yaml, fp32, metrics in $bench_dir/offload_NAME
  local name=$1 lim=$2
  shift 2
  rm -rf "$bench_dir/offload_$name"
  run_phase "offload-$name" "$lim" "$logs/offload-$name.log" env NVIDIA_TF32_OVERRIDE=0 "$build/bin/ptrain" run \
    tools/device/gpt_1b.yaml --nproc 1 --run-dir "$bench_dir/offload_$name" launch.nproc=1 device=cuda \
    train.steps=4 "$@"
}
if [ $skip_bench -eq 1 ] || [ $build_rc -ne 0 ] || [ -z "$gpu_name" ]; then
  record offload skip 0 "no build, no GPU or --skip-bench"
elif [ "$(limit 110 0)" -lt 60 ]; then
  record offload TIMEOUT 0 "no time left"
else
  # Recomputation first: without it autograd's saved views of each block's weights keep their device
  # copies from forward to backward (docs/memory.md), so parameter offload saves little.
  all_three=(offload.params=true offload.grads=true offload.optimizer=true)
  reserve=0
  [ $quick -eq 1 ] && reserve=40  # the quickstart runs after
  offload_status=ok offload_note=""
  for spec in "recompute|model.recompute=full" "recompute_all|model.recompute=full ${all_three[*]}" \
              "recompute_params|model.recompute=full offload.params=true" "all|${all_three[*]}"; do
    IFS='|' read -r name overrides <<<"$spec"
    if [ "$(limit 110 "$reserve")" -lt 45 ]; then offload_note="$offload_note, $name not run"; continue; fi
    # shellcheck disable=SC2086  # the overrides are words
    offload_run "$name" "$(limit 110 "$reserve")" $overrides
    offload_note="$offload_note, $name $(status_of $ph_rc) ${ph_s}s"
    [ $ph_rc -eq 0 ] || offload_status=$(status_of $ph_rc)
  done
  offload_note=${offload_note#, }
  table=$("$python" - "$bench_dir" <<'EOF'
import json, os, statistics, sys
d = sys.argv[1]
print("\noffload (pinned host tier), the bench's GPT in fp32: median step time after the first two steps and the")
print("device's peak (libtorch's caching allocator); 'none' is the bench's fp32 run")
print(f"  {'offload':<24}{'recompute':<11}{'step s':>8}{'peak GB':>9}")
for name, rc, folder in (("none", "none", "ptrain_fp32"), ("none", "full", "offload_recompute"),
                         ("params+grads+optimizer", "full", "offload_recompute_all"),
                         ("params", "full", "offload_recompute_params"),
                         ("params+grads+optimizer", "none", "offload_all")):
    try:
        rows = [json.loads(l) for l in open(os.path.join(d, folder, "metrics.jsonl"))]
    except Exception:
        print(f"  {name:<24}{rc:<11}{'no result':>8}")
        continue
    steps = [r["step_time_s"] for r in rows if "step_time_s" in r and r["step"] > 2]
    peak = max((r.get("peak_device_mb", 0) for r in rows), default=0) / 1024
    step = f"{statistics.median(steps):8.3f}" if steps else f"{'-':>8}"
    print(f"  {name:<24}{rc:<11}{step}{peak:>9.1f}")
EOF
)
  while IFS= read -r line; do extra+=("$line"); done <<<"$table"
  record offload "$offload_status" 0 "$offload_note"
fi

[ $quick -eq 1 ] && quickstart_phase
finish
