#!/usr/bin/env bash
# The offline GPU check: builds ptrain on a machine with a GPU, PyTorch and no network, runs the GPU
# tests, trains the quickstart on the GPU, and times ptrain in bf16 on a 1.2B and a 0.3B GPT beside
# PyTorch eager written as a tuned user writes it (autocast bf16, SDPA, fused AdamW, gradients freed between steps) and beside
# torch.compile of that; then TF32 and fp32 beside plain eager, then the memory levers, as far as the
# budget goes.
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
# 540: the whole check, build included, in one device call of at most 600 s; each phase's limit is cut
# to leave the later phases their minimum), --test-label L (default gpu), --quickstart-nproc N (default
# 1), --skip-bench, --quick (builds only ptrain, its plugins and the GPU tests; runs the GPU tests, the
# quickstart, then, if time is left, the single most important pair: ptrain bf16 on the 1.2B GPT beside
# tuned eager, which ran during the build: for a second try in a short lease).
#
# Order: what matters most comes first, so a budget cut short loses the least: build, gpu-tests,
# quickstart, bench-bf16 (the 1.2B GPT, then the 350M), bench-tf32, bench-fp32, levers. The build
# (~184 s at -j16, 123 s for --quick's targets) leaves the GPU idle: the eager runs go then, in this
# order, each under its own timeout: tuned 1.2B, compiled 1.2B, tuned 350M, compiled 350M, TF32 1.2B,
# fp32 1.2B. Each is limited so as to leave the phases after the build 180 s (gpu-tests, quickstart,
# the first ptrain row), and one that would get less than its minimum is passed over (torch.compile
# first: it needs the most). None starts once the build has ended; the one going then finishes before
# the GPU tests start, so nothing shares the GPU while it is timed. Whatever did not run during the
# build runs in the bench phase beside its ptrain row, if the budget leaves its minimum.
#
# Phase limits, in seconds, each also cut to what the budget leaves: configure 120, build 300 (leaving
# 100), gpu-tests 150 (leaving 85: the quickstart and the first ptrain row), quickstart 75 (leaving 75
# for the first pair; none in --quick); ptrain bench runs 120 on the 1.2B GPT in bf16 and 90 on the
# others (started with 45 left, 40 for the 350M; from the 350M on, a ptrain row starts only if its
# eager row, when still to run, has 30 left after it); eager: tuned 90 on the 1.2B and 60 on the
# 350M, TF32 60, fp32 75 (each started with 30 left), torch.compile 180 on the 1.2B and 150 on the
# 350M (compiling a 1.2B GPT takes 60-120 s; started only with 100 and 80 left, the 1.2B's in the
# bench phase only if 45 remain after it for the 350M's ptrain row); memory levers 90 per run
# (started with 45 left). At the default budget and the build's measured time, the bf16 table and
# the TF32 pair are expected to fit; fp32 and the levers take what is left.
#
# Phases, each under `timeout`, each recorded whatever happens to the others:
#   extract     dpkg-deb -x of every tools/device/debs/*.deb into <build>/deps (never into /)
#   configure   cmake -G Ninja, CMAKE_PREFIX_PATH = <build>/deps/usr first, then PyTorch's
#               torch.utils.cmake_prefix_path; each package's *_DIR is checked to lie in <build>/deps
#   build       every default target, -j<jobs> (niced), sm_90 only (H100/H200); tools/bench/gpt_eager.py
#               --device cuda meanwhile (the GPU is otherwise idle then; the build is niced so the
#               Python thread keeps a core)
#   gpu-tests   ctest -L gpu. ASSUMPTION: GPU tests carry the ctest label "gpu" and skip (GTEST_SKIP,
#               "no CUDA device") where no GPU is visible; here a skipped test is a failure
#   quickstart  ptrain run configs/quickstart.yaml device=cuda (one process: one GPU), final exact match
#   bench-bf16  ptrain run tools/device/gpt_1b.yaml, then gpt_350m.yaml, precision.name=bf16 (bf16
#               parameters and activations, float32 masters and gradient accumulation), beside
#               gpt_eager.py --tuned (autocast bf16 over fp32 weights, SDPA, fused AdamW, zero_grad(set_to_none=True)) and --tuned
#               --compile; the table: step time, tokens/s, TFLOP/s (6N per token), MFU against the
#               card's dense peak for the row's precision (H100 SXM, H200, A100; '-' on others), ptrain's
#               own mfu, device peak; ptrain/eager-tuned and ptrain/compile tokens/s, device memory
#               below eager or not, and the targets as PASS/MISS lines (informational: MFU >= 50% of
#               the bf16 peak on the 1.2B GPT, >= 1.1x tuned eager's tokens/s, >= torch.compile's,
#               device memory below eager's)
#   bench-tf32  the 1.2B GPT, ptrain device.tf32=true (ptrain's own switch, in the device section:
#               device.type=cuda beside it) beside gpt_eager.py --tf32
#   bench-fp32  the 1.2B GPT, ptrain device.tf32=false (and NVIDIA_TF32_OVERRIDE=0, so the row is fp32
#               whatever libtorch defaults to) beside gpt_eager.py
#   levers      the 1.2B GPT in bf16, 6 steps: full recomputation, then with parameters, gradients and
#               optimizer states in pinned host memory, the distributed optimizer, parameters alone
#               with recomputation, all three without: step time and the device's peak beside
#               bench-bf16's row
#
# The summary goes to $OUT/summary.txt when OUT is set (phase logs to $OUT/device-logs/, the bench
# runs' JSON lines, statuses and metrics.jsonl files to $OUT/device-bench/, from which
# tools/device/bench_table.py prints the tables again), else to <build>/summary.txt. Exit status 0
# when every phase passed (the targets are informational; bench-tf32, bench-fp32 and levers left out
# by the budget are skips, not failures).
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1

python=python3
build="build-device"
jobs=$(nproc)
budget=540
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

# The GPTs that both sides time (tools/device/gpt_1b.yaml and gpt_350m.yaml hold the same numbers for
# ptrain): name -> gpt_eager.py's arguments, the recipe, and L,h,heads,s,b,V for the table.
declare -A M_EAGER=([1b]="--layers 24 --hidden 2048 --heads 16 --seq 1024 --batch 4"
                    [350m]="--layers 24 --hidden 1024 --heads 16 --seq 1024 --batch 8")
declare -A M_YAML=([1b]=tools/device/gpt_1b.yaml [350m]=tools/device/gpt_350m.yaml)
declare -A M_SPEC=([1b]="24,2048,16,1024,4,16" [350m]="24,1024,16,1024,8,16")
# Steps: 2 warm-up and 10 timed on both sides (bf16 steps are short: ten keep the median steady);
# torch.compile warms up 3, its first step compiling. The levers: 6 steps, the median after two.
B_VOCAB=16 B_WARMUP=2 B_STEPS=10 C_WARMUP=3 LEVER_STEPS=6
# What the phases after the build need at least (gpu-tests 90, quickstart 30, the first ptrain row 45,
# the summary): each eager run during the build is limited so as to leave them this much after it.
POST_BUILD=180

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
  echo "rc=$ph_rc" >>"$log"  # the summary shows the tails of logs not ending in rc=0
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
    # What the tables were made of (a few kB): bench_table.py reads them again anywhere.
    if [ -d "${bench_dir:-}" ]; then
      mkdir -p "$OUT/device-bench"
      for f in "$bench_dir"/*.json "$bench_dir"/*.status; do [ -f "$f" ] && cp "$f" "$OUT/device-bench/"; done
      for f in "$bench_dir"/*/metrics.jsonl; do
        [ -f "$f" ] || continue
        mkdir -p "$OUT/device-bench/$(basename "$(dirname "$f")")"
        cp "$f" "$OUT/device-bench/$(basename "$(dirname "$f")")/"
      done
    fi
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

# --- the bench runs' bookkeeping -------------------------------------------------------------------------
# Every bench run has a name: bench-<precision>-ptrain-<model>, bench-<precision>-eager-<kind>-<model>
# (kind: tuned, compiled, plain) or levers-<lever>. Its log is $logs/NAME.log, its result in $bench_dir
# (NAME/metrics.jsonl or NAME.json), and its outcome NAME.status: STATUS|SECONDS|NOTE, written by
# whichever process ran it (the eager runs during the build run in a subshell) and read by the table.
bench_dir="$build/device-bench"
rm -rf "$bench_dir"
mkdir -p "$bench_dir"
set_status() { echo "$1|$2|$3" >"$bench_dir/$4.status"; }  # STATUS SECONDS NOTE NAME
get_status() { cut -d'|' -f1 "$bench_dir/$1.status" 2>/dev/null; }
get_seconds() { cut -d'|' -f2 "$bench_dir/$1.status" 2>/dev/null; }
outcome() {  # NAME RC SECONDS [NOTE]: the status file of a finished run
  local st note=${4:-}
  st=$(status_of "$2")
  case $st in TIMEOUT) note="timed out${note:+; $note}" ;; FAIL) note="failed, rc=$2 (see $1.log)" ;; esac
  set_status "$st" "$3" "$note" "$1"
}

eager_caps() {  # NAME -> "CAP MIN": its limit, and the least it starts with
  case $1 in
    bench-bf16-eager-tuned-1b) echo "90 30" ;;
    bench-bf16-eager-tuned-350m) echo "60 30" ;;
    bench-bf16-eager-compiled-1b) echo "180 100" ;;
    bench-bf16-eager-compiled-350m) echo "150 80" ;;
    bench-tf32-eager-plain-*) echo "60 30" ;;
    *) echo "75 30" ;;
  esac
}
# eager_run NAME LIMIT [NOTE]: one gpt_eager.py run.
eager_run() {
  local name=$1 lim=$2 note=${3:-} prec kind model t0 rc flags=()
  prec=${name#bench-}; prec=${prec%%-*}
  model=${name##*-}
  kind=${name#bench-"$prec"-eager-}; kind=${kind%-*}
  case $kind in
    tuned) flags=(--tuned --warmup "$B_WARMUP") ;;
    compiled) flags=(--tuned --compile --warmup "$C_WARMUP") ;;
    *) flags=(--warmup "$B_WARMUP"); [ "$prec" = tf32 ] && flags+=(--tf32) ;;
  esac
  local log="$logs/$name.log"
  # shellcheck disable=SC2206  # the model's arguments are words
  local cmd=("$python" tools/bench/gpt_eager.py --device cuda ${M_EAGER[$model]} --vocab "$B_VOCAB"
             --steps "$B_STEPS" "${flags[@]}")
  echo "== $name (limit ${lim}s): ${cmd[*]}" | tee "$log"
  t0=$(date +%s)
  timeout -k 5 "$lim" "${cmd[@]}" >"$bench_dir/$name.json" 2>>"$log"
  rc=$?
  echo "rc=$rc" >>"$log"
  outcome "$name" "$rc" $(( $(date +%s) - t0 )) "$note"
}
# eager_wanted NAME: whether the bench phase should run it (the build's end or the budget left it out).
eager_wanted() {
  local st
  st=$(get_status "$1")
  [ -z "$st" ] || [ "$st" = not-run ]
}

# --- build, with the eager runs on the idle GPU meanwhile -------------------------------------------
eager_pid=
eager_queue=()
if [ $skip_bench -eq 0 ] && [ -n "$gpu_name" ]; then
  if [ $quick -eq 1 ]; then
    eager_queue=(bench-bf16-eager-tuned-1b)
  else
    eager_queue=(bench-bf16-eager-tuned-1b bench-bf16-eager-compiled-1b bench-bf16-eager-tuned-350m
                 bench-bf16-eager-compiled-350m bench-tf32-eager-plain-1b bench-fp32-eager-plain-1b)
  fi
  (
    for name in "${eager_queue[@]}"; do
      [ -e "$bench_dir/.build-done" ] && break
      read -r cap least <<<"$(eager_caps "$name")"
      lim=$(limit "$cap" "$POST_BUILD")
      if [ "$lim" -lt "$least" ]; then
        set_status not-run 0 "not run during the build: ${lim}s left of the ${least}s it needs" "$name"
        continue
      fi
      eager_run "$name" "$lim" "during the build"
    done
  ) &
  eager_pid=$!
fi
keep_going=()  # ninja: build every target that can be built, so one failure does not hide the others
[ "$generator" = Ninja ] && keep_going=(-- -k 0)
targets=()     # --quick: what the later phases run (the GPU tests depend on ptrain and every plugin)
[ $quick -eq 1 ] && targets=(--target ptrain_gpu_tests)
run_phase build "$(limit 300 100)" "$logs/build.log" nice -n 10 cmake --build "$build" -j "$jobs" "${targets[@]}" \
  "${keep_going[@]}"
record build "$(status_of $ph_rc)" "$ph_s" "-j$jobs, last step $(grep -o '^\[[0-9]*/[0-9]*\]' "$logs/build.log" | tail -1)"
build_rc=$ph_rc
# A failed target elsewhere (ninja kept going) leaves the later phases what they need: run them.
if [ $build_rc -ne 0 ] && [ $build_rc -ne 124 ] && [ -x "$build/bin/ptrain" ] && [ -x "$build/bin/ptrain_gpu_tests" ]; then
  extra+=("" "build failed, but bin/ptrain and bin/ptrain_gpu_tests were built: the later phases ran")
  build_rc=0
fi
# No eager run starts after the build; the one going ends before anything else uses the GPU, so that
# nothing shares the GPU while it is timed. Its limit left the phases after the build POST_BUILD.
if [ -n "$eager_pid" ]; then
  touch "$bench_dir/.build-done"
  wait "$eager_pid"
fi

# --- GPU tests -------------------------------------------------------------------------------------------
if [ $build_rc -ne 0 ]; then
  record gpu-tests skip 0 "no build"
elif [ "$(limit 150 85)" -lt 20 ]; then
  record gpu-tests TIMEOUT 0 "no time left"
else
  listed=$(cd "$build" && ctest -N -L "$label" 2>/dev/null | sed -n 's/^Total Tests: //p')
  if [ "${listed:-0}" -eq 0 ]; then
    record gpu-tests NONE 0 "no ctest test carries the label '$label' (see the ASSUMPTION at the top of this script)"
  else
    run_phase gpu-tests "$(limit 150 85)" "$logs/gpu-tests.log" \
      ctest --test-dir "$build" -L "$label" -V -j 8
    line=$(grep -E 'tests passed' "$logs/gpu-tests.log" | tail -1)
    skipped=$(grep -c '\*\*\*Skipped\|Not Run' "$logs/gpu-tests.log")
    st=$(status_of $ph_rc)
    if [ "$st" = ok ] && [ "$skipped" -gt 0 ]; then st=FAIL; fi
    record gpu-tests "$st" "$ph_s" "label '$label': ${line:-no result}; $skipped skipped (a skip here means the test saw no GPU)"
  fi
fi

# --- quickstart on the GPU ---------------------------------------------------------------------------------
qs_reserve=75  # the first bench pair after it (in --quick, only if time is left)
[ $quick -eq 1 ] && qs_reserve=0
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

# --- bench: ptrain beside eager, bf16 first ------------------------------------------------------------------
# ptrain_run NAME LIMIT YAML STEPS ENV OVERRIDES...: one `ptrain run` on one GPU, its folder
# $bench_dir/NAME; ENV is one VAR=VALUE for the process, or - for none.
ptrain_run() {
  local name=$1 lim=$2 yaml=$3 steps=$4 envs=()
  [ "$5" != - ] && envs=("$5")
  shift 5
  rm -rf "${bench_dir:?}/$name"
  run_phase "$name" "$lim" "$logs/$name.log" env "${envs[@]}" "$build/bin/ptrain" run "$yaml" \
    --nproc 1 --run-dir "$bench_dir/$name" launch.nproc=1 train.steps="$steps" "$@"
  outcome "$name" "$ph_rc" "$ph_s"
}
# A group of rows (bench-bf16, -tf32, -fp32) is ok when each row that ran passed; in bench-bf16 a row
# the budget left out is a TIMEOUT too (missing_counts=1), in the lower-priority groups it is not.
group_status=ok group_note="" missing_counts=1 group_t0=$(date +%s)
worse() {  # STATUS: the group's status becomes the worse of the two
  case $1 in
    ok) ;;
    FAIL) group_status=FAIL ;;
    TIMEOUT) [ "$group_status" = FAIL ] || group_status=TIMEOUT ;;
    *) [ $missing_counts -eq 1 ] && worse TIMEOUT ;;  # not-run
  esac
}
# bench_ptrain NAME MIN CAP RESERVE ENV OVERRIDES...: a ptrain row, if the budget leaves MIN.
bench_ptrain() {
  local name=$1 least=$2 cap=$3 reserve=$4 envv=$5 model
  shift 5
  model=${name##*-}
  if [ $build_rc -ne 0 ]; then
    set_status FAIL 0 "no build" "$name"
  elif [ "$(limit "$cap" "$reserve")" -lt "$least" ]; then
    set_status not-run 0 "not run: no time left in the budget" "$name"
  else
    ptrain_run "$name" "$(limit "$cap" "$reserve")" "${M_YAML[$model]}" $(( B_WARMUP + B_STEPS )) "$envv" "$@"
  fi
  worse "$(get_status "$name")"
  group_note="$group_note, ${name#bench-*-} $(get_status "$name") $(get_seconds "$name")s"
}
# bench_eager NAME RESERVE [PTRAIN_ROW]: an eager row that did not run during the build, if the budget
# leaves its minimum and PTRAIN_ROW (its pair) was not left out; its status counts in the group's,
# except a torch.compile row's that the budget left out or timed out (its limit is the budget's
# choice, not a fault).
bench_eager() {
  local name=$1 reserve=$2 partner=${3:-} cap least lim
  if eager_wanted "$name" && [ -n "$partner" ] && [ "$(get_status "$partner")" = not-run ]; then
    set_status not-run 0 "not run: its ptrain row did not fit" "$name"
  elif eager_wanted "$name"; then
    read -r cap least <<<"$(eager_caps "$name")"
    lim=$(limit "$cap" "$reserve")
    if [ "$lim" -ge "$least" ]; then
      eager_run "$name" "$lim"
    else
      set_status not-run 0 "not run: ${lim}s left of the ${least}s it needs" "$name"
    fi
  fi
  local st
  st=$(get_status "$name")
  group_note="$group_note, ${name#bench-*-} $st $(get_seconds "$name")s"
  case $name in
    *-compiled-*) [ "$st" = FAIL ] && worse FAIL ;;
    *) worse "$st" ;;
  esac
}
bench_table() {
  local table
  table=$("$python" tools/device/bench_table.py bench "$bench_dir" "$gpu_name" "$B_WARMUP" \
          "1b:gpt-1.2b=${M_SPEC[1b]}" "350m:gpt-350m=${M_SPEC[350m]}" 2>&1)
  while IFS= read -r line; do extra+=("$line"); done <<<"$table"
}

if [ $skip_bench -eq 1 ]; then
  record bench-bf16 skip 0 "--skip-bench"
elif [ -z "$gpu_name" ]; then
  record bench-bf16 FAIL 0 "PyTorch sees no GPU"
else
  # The 1.2B pair first (--quick's only pair), then torch.compile on it, then the 350M rows.
  bench_ptrain bench-bf16-ptrain-1b 45 120 0 - device=cuda precision.name=bf16
  bench_eager bench-bf16-eager-tuned-1b 0
  if [ $quick -eq 0 ]; then
    bench_eager bench-bf16-eager-compiled-1b 45
    # A pair or nothing from here on: a ptrain row starts only if its tuned eager row (when still to
    # run) can follow it.
    pair=0
    eager_wanted bench-bf16-eager-tuned-350m && pair=30
    bench_ptrain bench-bf16-ptrain-350m 40 90 $pair - device=cuda precision.name=bf16
    bench_eager bench-bf16-eager-tuned-350m 0 bench-bf16-ptrain-350m
    bench_eager bench-bf16-eager-compiled-350m 0 bench-bf16-ptrain-350m
  fi
  bench_table_done=1
  record bench-bf16 "$group_status" $(( $(date +%s) - group_t0 )) "${group_note#, }"
fi

# TF32 and fp32: lower priority, the 1.2B GPT only. device.tf32 is ptrain's own switch; the fp32 row
# also sets NVIDIA_TF32_OVERRIDE=0, so that it is fp32 whatever libtorch defaults to.
for prec in tf32 fp32; do
  if [ $skip_bench -eq 1 ] || [ $quick -eq 1 ] || [ -z "$gpu_name" ]; then
    record "bench-$prec" skip 0 "--skip-bench, --quick or no GPU"
    continue
  fi
  group_status=ok group_note="" missing_counts=0 group_t0=$(date +%s)
  pair=0
  eager_wanted "bench-$prec-eager-plain-1b" && pair=30
  if [ "$prec" = tf32 ]; then
    bench_ptrain bench-tf32-ptrain-1b 45 90 $pair - device.type=cuda device.tf32=true
  else
    bench_ptrain bench-fp32-ptrain-1b 45 90 $pair NVIDIA_TF32_OVERRIDE=0 device.type=cuda device.tf32=false
  fi
  bench_eager "bench-$prec-eager-plain-1b" 0 "bench-$prec-ptrain-1b"
  if [ "$(get_status "bench-$prec-ptrain-1b")" = not-run ] && [ "$(get_status "bench-$prec-eager-plain-1b")" = not-run ]; then
    record "bench-$prec" skip 0 "no time left in the budget (lower priority)"
  else
    record "bench-$prec" "$group_status" $(( $(date +%s) - group_t0 )) "${group_note#, }"
  fi
done
[ -n "${bench_table_done:-}" ] && bench_table

# --- memory levers: the 1.2B GPT in bf16 with recomputation, offload, the distributed optimizer ---------
if [ $skip_bench -eq 1 ] || [ $quick -eq 1 ] || [ $build_rc -ne 0 ] || [ -z "$gpu_name" ]; then
  record levers skip 0 "no build, no GPU, --skip-bench or --quick"
elif [ "$(limit 90 0)" -lt 45 ]; then
  record levers skip 0 "no time left in the budget (lowest priority)"
else
  # Recomputation first: without it autograd's saved views of each block's weights keep their device
  # copies from forward to backward (docs/memory.md), so parameter offload saves little. The
  # distributed optimizer and offload exclude each other (offload moves the whole optimizer's tensors).
  all_three=(offload.params=true offload.grads=true offload.optimizer=true)
  levers_status=ok levers_note="" group_t0=$(date +%s)
  for spec in "recompute|model.recompute=full" "recompute-offload|model.recompute=full ${all_three[*]}" \
              "distributed|optimizer.distributed=true" "recompute-params|model.recompute=full offload.params=true" \
              "offload|${all_three[*]}"; do
    IFS='|' read -r name overrides <<<"$spec"
    if [ "$(limit 90 0)" -lt 45 ]; then
      set_status not-run 0 "not run: no time left in the budget" "levers-$name"
      levers_note="$levers_note, $name not run"
      continue
    fi
    # shellcheck disable=SC2086  # the overrides are words
    ptrain_run "levers-$name" "$(limit 90 0)" "${M_YAML[1b]}" "$LEVER_STEPS" - device=cuda precision.name=bf16 $overrides
    levers_note="$levers_note, $name $(status_of $ph_rc) ${ph_s}s"
    [ $ph_rc -eq 0 ] || levers_status=$(status_of $ph_rc)
  done
  table=$("$python" tools/device/bench_table.py levers "$bench_dir" "$B_WARMUP" 2>&1)
  while IFS= read -r line; do extra+=("$line"); done <<<"$table"
  record levers "$levers_status" $(( $(date +%s) - group_t0 )) "${levers_note#, }"
fi

finish
