#!/usr/bin/env bash
# One job on the H200 machine: build for sm_90a, run the tests (CUDA ones included), the demo, the benchmark
# and the ncu byte check; logs and JSON results go to ${OUT:-gpu_out}. Usage: scripts/gpu_job.sh [steps...]
# with steps from: build test sanitize racecheck demo bench tune ncu profile stalls profiles batch1 spec spectune specview gdn gdntune
# gdnspec variants
# (default: build test demo bench ncu). specview: verify on caches with the bf16 output view (issue 5).
# tune: the benchmark plus alternative launch configurations; profile: ncu sections of one replay launch;
# stalls: where that launch's warps were sampled, per SASS instruction (bench/ncu_top_stalls.py), and its ncu
# sections; PROFILE_KERNEL (regex), PROFILE_CMD (the program launching it), PROFILE_SKIP, PROFILE_TAG choose another;
# PROFILE_CACHE=none keeps the caches warm (ncu's default, all, flushes them before the launch: a cold instruction cache);
# its top-stall listing comes back as $OUT/stalls<TAG>_top.txt, and with PROFILE_SRC=1 the source-correlated samples;
# profiles: stalls of the view replay step, GDN verify and Mamba-2 verify at batch 256 (not yet timed: run it alone);
# batch1: stalls of the Mamba-2 replay step and step at batch 1, source-correlated;
# spec: speculative verify+commit vs the per-position baseline (issue 3); gdn: the GDN decode steps (issue 4);
# spectune, gdntune: spec, gdn plus the kernels' alternative launch configurations; gdnspec: GDN verify+commit
# vs its per-position baseline, with other rows per verify block.
# variants: candidate kernel changes prepared without a GPU, as patch files in bench/patches/, measured in one
# call, their builds in parallel (one build's time for all). VARIANTS lists NAME=patch+patch... (NAME alone: the
# tree as it is); each is copied to /tmp/var/NAME, patched and built in place; then each entry of VRUNS,
# NAME:KIND with KIND mamba2, gdn, spec or gdnspec (that `--tune` benchmark, plus VBENCH_ARGS_KIND or VBENCH_ARGS, into
# $OUT/KIND_NAME.json), test (the CUDA tests, -k VTEST_K_NAME or VTEST_K when set), sanitize (memcheck over the CUDA tests of
# VSAN_TESTS, default tests, -k VSAN_K, default SAN_K below) or psanitize (the same, one process a test file, in parallel), runs in order in its copy (logs in /tmp/var:
# the call prints their tails). The working tree is left as it was. Example (session 7):
# VARIANTS="base p1=ring-sum-at-flush" VRUNS="base:mamba2 p1:mamba2" bash scripts/gpu_job.sh variants
# VREUSE=1 keeps the builds a previous call left in /tmp/var (a machine still warm: a call within its idle
# release) and builds only the missing ones; those copies are of the previous call's tree and patches.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the variants step runs from copies of the tree
STEPS=${*:-build test demo bench ncu}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
# The H200 image's default g++ (/opt/gcc wrapper) links objects whose C++ exceptions crash the process when
# thrown through torch's dispatcher (seen 2026-11-29: every validation error segfaulted); the system
# compiler's objects raise them properly. nvcc takes its host compiler from CC too.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
# The commit measured comes from REPLAYSSM_COMMIT or a .commit file (`git rev-parse --short HEAD > .commit`,
# carried with the call): the machine's copy of .git may be stale (seen 2026-11-29), so it comes last.
export REPLAYSSM_COMMIT=${REPLAYSSM_COMMIT:-$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || true)}
status=0
# The memcheck runs' default test filter: the out_of_range tests trap on purpose in a child process, and memcheck
# counts each trapping thread as an error (the sanitize step, and the variants step's unless VSAN_K says otherwise).
SAN_K="not out_of_range"
run() {  # run NAME CMD...: log to $OUT/NAME.log, remember failures
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  local log=${LOGDIR:-$OUT}/$name.log  # (LOGDIR: the variants step keeps its logs off $OUT, which returns 8 files)
  "$@" > "$log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  tail -n 25 "$log"
  # one line a step in $OUT/summary.txt (which comes back when the call's printed tail is cut): rc, time, last line
  echo "$name rc=$rc $((SECONDS - t0))s | $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-300)" >> "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
  return $rc
}
stalls() {  # stalls TAG KERNEL_REGEX SKIP CMD: ncu sections of one launch, and where its warps stalled, per SASS line
  run stalls$1 bash -c "ncu --clock-control none --cache-control ${PROFILE_CACHE:-all} -k regex:$2 -s $3 -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section SourceCounters --section WarpStateStats --import-source yes -f -o /tmp/rssm_stalls$1 $4 > /dev/null && \
      ncu -i /tmp/rssm_stalls$1.ncu-rep > $OUT/stalls$1_sections.txt && \
      ncu -i /tmp/rssm_stalls$1.ncu-rep --page source --csv --print-source sass > /tmp/stalls$1.csv && \
      python3 bench/ncu_top_stalls.py /tmp/stalls$1.csv | tee $OUT/stalls$1_top.txt && \
      { [ -z \"${PROFILE_SRC:-}\" ] || ncu -i /tmp/rssm_stalls$1.ncu-rep --page source --csv --print-source cuda,sass | \
        gzip > $OUT/stalls$1_src.csv.gz || true; }"
  # (PROFILE_SRC=1 also returns _src.csv.gz: the samples per SASS line with the CUDA source lines they come from (the
  # build has -lineinfo), for mapping the time to the source on the CPU machine. A run returns 8 files at most.)
}
for step in $STEPS; do
  case $step in
    build) rm -rf build replayssm/_C*.so; run build python3 -m pip install -e . --no-build-isolation --no-deps -v || exit 1 ;;
    test) run test python3 -m pytest -q -rs tests ;;
    sanitize) run sanitize compute-sanitizer --tool memcheck --target-processes all python3 -m pytest -q -x tests -m cuda -k "$SAN_K" ;;
    racecheck) run racecheck compute-sanitizer --tool racecheck python3 -m pytest -q -x tests/test_mamba2.py -k "launch_configurations" ;;
    demo) run demo python3 -m replayssm demo ;;
    bench) run bench python3 bench/bench_mamba2.py --out "$OUT/mamba2_decode.json" ;;
    tune) run tune python3 bench/bench_mamba2.py --tune --out "$OUT/mamba2_decode.json" ;;
    ncu) run ncu python3 bench/ncu_bytes.py --out "$OUT/ncu_bytes.json" ;;
    stalls) stalls "${PROFILE_TAG:-}" "${PROFILE_KERNEL:-mamba2_replay_step_kernel}" "${PROFILE_SKIP:-2}" \
        "${PROFILE_CMD:-python3 bench/ncu_bytes.py --child --batch ${PROFILE_BATCH:-256}}" ;;
    batch1)  # where batch 1's time goes: the replay step (cursors at 8, the 3rd launch: w = 10) and the step, with
      # their samples mapped to source lines (PROFILE_SRC); session 19's plan (bench/NOTES.md, "Next session")
      export PROFILE_SRC=1
      stalls _r1 mamba2_replay_step 2 "python3 bench/ncu_bytes.py --child --batch 1 --cursor 8 --no-standard"
      stalls _s1 mamba2_step_kernel 2 "python3 bench/ncu_bytes.py --child --batch 1" ;;
    profiles)  # the three kernels session 5 left unprofiled (bench/NOTES.md, "Next session"), batch 256
      stalls _view replay_step 8 "python3 bench/ncu_bytes.py --child --view --batch 256"
      stalls _gdnverify gdn_replay_verify 2 "python3 bench/bench_gdn_speculative.py --batches 256 --T 4 --rates 0.5 --out /tmp/p.json"
      stalls _verify mamba2_replay_verify 2 "python3 bench/bench_speculative.py --batches 256 --T 4 --rates 0.5 --out /tmp/p.json" ;;
    variants)
      [ -n "${VREUSE:-}" ] || rm -rf /tmp/var; mkdir -p /tmp/var
      for v in ${VARIANTS:-base}; do
        name=${v%%=*}; patches=; [ "$name" != "$v" ] && patches=${v#*=}
        if [ -n "${VREUSE:-}" ] && ls /tmp/var/$name/replayssm/_C*.so > /dev/null 2>&1; then echo "=== reusing $name"; continue; fi
        rm -rf /tmp/var/$name
        mkdir -p /tmp/var/$name
        tar --exclude=./build --exclude=./.git --exclude=./.venv --exclude='./replayssm/_C*.so' -cf - . | tar -xf - -C /tmp/var/$name
        ( cd /tmp/var/$name && { for p in ${patches//+/ }; do git apply "bench/patches/$p.patch" || exit 1; done
          MAX_JOBS=${VMAX_JOBS:-8} python3 setup.py build_ext --inplace; } > build.log 2>&1 ) &
      done
      t0=$SECONDS; wait; echo "=== variant builds: $((SECONDS - t0)) s"
      for v in ${VARIANTS:-base}; do name=${v%%=*}
        ls /tmp/var/$name/replayssm/_C*.so > /dev/null 2>&1 || { echo "=== build $name failed"; tail -30 /tmp/var/$name/build.log; cp /tmp/var/$name/build.log "$OUT/build_$name.log"; status=1; }
      done
      for r in ${VRUNS:-base:mamba2}; do name=${r%%:*}; kind=${r#*:}
        [ -d /tmp/var/$name ] && ls /tmp/var/$name/replayssm/_C*.so > /dev/null 2>&1 || continue
        cd /tmp/var/$name; export PYTHONPATH=/tmp/var/$name
        case $kind in
          test) tk=VTEST_K_$name; tk=${!tk:-${VTEST_K:-}}  # (VTEST_K_NAME: one variant's filter, else VTEST_K; "all": none)
                [ "$tk" = all ] && tk=
                LOGDIR=/tmp/var run "test_$name" python3 -m pytest -q -rs tests -m cuda ${tk:+-k "$tk"} ;;
          sanitize) LOGDIR=/tmp/var run "sanitize_$name" compute-sanitizer --tool memcheck --target-processes all \
              python3 -m pytest -q -x -m cuda ${VSAN_TESTS:-tests} -k "${VSAN_K:-$SAN_K}" ;;
          psanitize)  # (memcheck as sanitize, one compute-sanitizer a test file, all at once: ~335 s for every CUDA test,
            # session 49, against more than 360 s in one process)
            pids=; for f in ${VSAN_TESTS:-$(grep -l cuda tests/test_*.py)}; do  # (the files with CUDA tests: pytest -m cuda on one without exits 5)
              t=$(basename "$f" .py)
              LOGDIR=/tmp/var run "psan_${name}_$t" compute-sanitizer --tool memcheck --error-exitcode 97 --target-processes all \
                python3 -m pytest -q -x -m cuda "$f" -k "${VSAN_K:-$SAN_K}" > /tmp/var/psan_${name}_$t.out 2>&1 &
              pids="$pids $!"; done
            for pid in $pids; do wait $pid || status=1; done
            cat /tmp/var/psan_${name}_*.out; grep -h "ERROR SUMMARY" /tmp/var/psan_${name}_*.log ;;
          *) case $kind in mamba2) script=bench_mamba2.py ;; gdn) script=bench_gdn.py ;; spec) script=bench_speculative.py ;;
               gdnspec) script=bench_gdn_speculative.py ;; *) echo "=== unknown run kind $kind"; status=1; cd - > /dev/null; continue ;; esac
             kargs=VBENCH_ARGS_$kind  # (VBENCH_ARGS_mamba2, ..._gdnspec: one kind's arguments, else VBENCH_ARGS)
             LOGDIR=/tmp/var run "${kind}_$name" python3 bench/$script --tune ${!kargs:-${VBENCH_ARGS:-}} --out "$OUT/${kind}_$name.json"
             # (the entries that beat their default, bench/tune_leads.py: the leads are in the call's output)
             [ -f "$OUT/${kind}_$name.json" ] && { echo "=== leads ${kind}_$name"; python3 bench/tune_leads.py "$OUT/${kind}_$name.json" | tail -n 20
               echo "=== targets ${kind}_$name"; python3 bench/targets.py "$OUT/${kind}_$name.json" | cut -d'|' -f2-5 | tail -n +3; } ;;
        esac
        unset PYTHONPATH; cd - > /dev/null
      done ;;
    spec) run spec python3 bench/bench_speculative.py --out "$OUT/mamba2_speculative.json" ;;
    spectune) run spec python3 bench/bench_speculative.py --tune --out "$OUT/mamba2_speculative.json" ;;
    specview) run specview python3 bench/bench_speculative.py --view --tune --batches 128 256 --out "$OUT/mamba2_speculative_view.json" ;;
    gdn) run gdn python3 bench/bench_gdn.py --out "$OUT/gdn_decode.json" ;;
    gdnspec) run gdnspec python3 bench/bench_gdn_speculative.py --tune --out "$OUT/gdn_speculative.json" ;;
    gdntune) run gdn python3 bench/bench_gdn.py --tune --out "$OUT/gdn_decode.json" ;;
    profile) run profile ncu --clock-control none -k regex:${PROFILE_KERNEL:-mamba2_replay_step_kernel} -s 2 -c 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section SourceCounters \
        python3 bench/ncu_bytes.py --child --batch ${PROFILE_BATCH:-256} ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit $status
