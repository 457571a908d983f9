#!/usr/bin/env bash
# The whole GPU suite in one call (the device tool's machine: no install, run from the tree).
# Usage there: bash benchmarks/h200.sh [step ...]   steps: env tests ceilings ops attention doctor doctor-vit256 breakdown
#   dit vit doctor-models compile-presets compile-bucketed regional overhead tune tune-attention grad-mode
#   fullgraph-tune coldstart nms robot regional-aot dit-eager aoti-crash vit-gemm vit-tma load dit-threads zoo fleet
#   sweep gemm-gelu lock-bound percall bisect gpu-tests native-gap dit-host host-cut doctor-models-streams
#   (default: env tests ceilings ops)
# Writes everything under $OUT (or ./out) and prints short tables last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1  # absolute: tests start subprocesses in other folders
OUT=${OUT:-out}
mkdir -p "$OUT"
steps=${*:-env tests ceilings ops}
py=python3
# Bytecode. The image sets PYTHONDONTWRITEBYTECODE and ships no .pyc, so every Python process there compiles torch's
# modules from source (5-7 s a process; issue 35). Steps that do not time a process start write bytecode once into a
# private folder and reuse it in every later process (a sweep starts ~50); the steps that time cold starts run as the
# image does.
image_dont_write=${PYTHONDONTWRITEBYTECODE-}
pyc=${FULLGRAPH_PYC:-/tmp/fullgraph-pyc}
carried_redis() {  # Debian's redis-server and the `redis` client from a carried .gpu/ (benchmarks/carry_redis.sh), once
  [ -n "${CARRIED_REDIS:-}" ] && return
  export CARRIED_REDIS=1 PATH="$PWD/.gpu/redis/usr/bin:$PATH" PYTHONPATH="$PYTHONPATH:$PWD/.gpu/py" \
    LD_LIBRARY_PATH="$PWD/.gpu/redis/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
export_served() {  # MODEL PKG LOG: benchmarks/targets/serve.py:MODEL exported into PKG for the load steps, unless there
  [ -s "$2" ] && return
  mkdir -p "$(dirname "$2")"
  echo "--- $1: export $(date -u +%H:%M:%S)" | tee -a "$3"
  $py -m fullgraph export "benchmarks/targets/serve.py:$1" --preset perception --no-check -o "$2" 2>&1 | tee -a "$3" \
    | tail -3
}
for step in $steps; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    coldstart|regional|regional-aot|fleet|aoti-crash)
      unset PYTHONPYCACHEPREFIX; export PYTHONDONTWRITEBYTECODE=$image_dont_write ;;
    *) export PYTHONPYCACHEPREFIX=$pyc PYTHONDONTWRITEBYTECODE= ;;
  esac
  case $step in
    env)
      $py -m fullgraph env | tee "$OUT/env.txt"
      $py -m fullgraph env --json > "$OUT/env.json" && $py -c "import json,sys; json.load(open(sys.argv[1])); print('env.json parses')" "$OUT/env.json"
      nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.txt"
      # what cold starts depend on: bytecode caching, compiler settings, the C++ compiler Inductor runs
      { env | grep -i -E '^(python|torch|triton|cuda_|cxx|cc)' | sort
        $py -c "import fullgraph.deploy.coldstart as c; print('bytecode:', c.bytecode_cache())"
        cxx=$(command -v "${CXX:-g++}"); echo "C++ compiler: $cxx -> $(readlink -f "$cxx")"
        if [ "$(head -c 2 "$cxx")" = "#!" ]; then echo "(a script:)"; head -20 "$cxx"; fi
      } 2>&1 | tee -a "$OUT/env.txt" | tail -30
      ;;
    tests)
      $py -m pytest -p no:cacheprovider -q -ra --timeout=300 ${TESTS:-tests} 2>&1 | tee "$OUT/pytest.log" | tail -25
      ;;
    ceilings)
      $py -m fullgraph bench ceilings --csv "$OUT/ceilings_h200.csv"
      ;;
    ops)
      $py -m fullgraph bench ops --reps 30 --csv "$OUT/ops_h200.csv" --markdown "$OUT/ops_h200.md" ${OPS:+--ops $OPS}
      ;;
    attention)
      $py -m fullgraph bench attention --reps 30 --csv "$OUT/attention_h200.csv" | tee "$OUT/attention_h200.txt"
      ;;
    dit)  # issue 13: the DiT stack, ours (auto, kernel, native) against the plain twin, compiled and eager
      $py -m fullgraph bench dit --reps 30 --breakdown --csv "$OUT/dit_h200.csv" ${DIT_ARGS:-} | tee -a "$OUT/dit_h200.txt"
      ;;
    vit)  # issue 14: timm's ViT-B/16 against ours, eager and compiled, batch 1, 4, 256
      $py -m fullgraph bench vit --reps 30 --breakdown --csv "$OUT/vit_h200.csv" ${VIT_ARGS:-} | tee -a "$OUT/vit_h200.txt"
      ;;
    doctor)
      $py -m fullgraph doctor benchmarks/targets/vit.py:vit_b16 --input 1x3x224x224:fp32 ${DOCTOR_ARGS:-} \
        --html "$OUT/vit_doctor.html" --json "$OUT/vit_doctor.json" | tee "$OUT/vit_doctor.txt"
      ;;
    doctor-vit256)  # issue 11: the breakdown of ViT-B/16 at batch 256 bf16, and its flags
      $py -m fullgraph doctor benchmarks/targets/vit.py:vit_b16 --input 256x3x224x224:bf16 --dtype bf16 \
        --mode ${VIT_MODES:-eager,default,reduce-overhead} --budget ${VIT_BUDGET:-240} \
        --html "$OUT/vit256_doctor.html" --json "$OUT/vit256_doctor.json" 2>&1 | tee "$OUT/vit256_doctor.txt" | tail -60
      ;;
    breakdown)
      $py benchmarks/probes/breakdown_check.py 2>&1 | tee "$OUT/breakdown_check.txt" | tail -30
      ;;
    doctor-models)  # issue 34: the doctor on 16 third-party models, every surface checked; one part per device call:
      # DOCTOR_MODELS_ARGS="timm bert_base" picks models or groups (`doctor_models.py --plan` prints the parts); a
      # part starts no model past DOCTOR_MODELS_DEADLINE (540 s) and names the rest. Parts' CSVs join with --from-csv.
      # shellcheck disable=SC2086 # a word list
      $py benchmarks/doctor_models.py ${DOCTOR_MODELS_ARGS:-} 2>&1 | tee "$OUT/doctor_models.txt" | grep -v '^  \[' | tail -40
      ;;
    doctor-models-streams)  # issue 34: the 16 models in one device call, three parts side by side on one GPU (the
      # seconds are then not comparable; the surfaces are what is checked). The ceilings are measured first, alone: a
      # ceiling measured beside another process is low. Each part writes $OUT/<part>/doctor_models.{csv,json}.
      $py -c 'import torch; from fullgraph.bench.ceilings import ceilings_for as c
print(torch.cuda.get_device_name(), c("cuda", torch.float32), c("cuda", torch.bfloat16))' 2>&1 | tail -1
      parts=("${DOCTOR_PART_A:-maskrcnn_resnet50_fpn swin_tiny_patch4_window7_224 gpt2_greedy tv_resnet50}"
             "${DOCTOR_PART_B:-ssdlite320_mobilenet_v3_large fasterrcnn_resnet50_fpn bert_base resnet50}"
             "${DOCTOR_PART_C:-retinanet_resnet50_fpn t5_small vit_base_patch16_224 convnext_tiny efficientnet_b0 clip_vision_b32 tv_convnext_tiny tv_vit_b_16}")
      for i in 0 1 2; do
        # shellcheck disable=SC2086 # a word list
        DOCTOR_MODELS_DEADLINE=${DOCTOR_MODELS_DEADLINE:-470} OUT="$OUT/part$i" \
          $py benchmarks/doctor_models.py ${parts[$i]} > "/tmp/doctor_part$i.log" 2>&1 &
        sleep 15
      done
      wait
      for i in 0 1 2; do grep -E '^\| |every check|not started|^DOCTOR' "/tmp/doctor_part$i.log" | cut -c1-330; done
      ;;
    compile-presets)  # issue 12: each preset at batch 4, 1, 256 bf16 on timm ViT-B/16; plain modes at batch 4
      $py benchmarks/compile_presets.py presets --batches ${BATCHES:-4,1,256} --csv "$OUT/compile_presets_h200.csv" \
        2>&1 | tee "$OUT/compile_presets.txt" | grep -v '^  \[' | tail -50
      ;;
    compile-bucketed)  # issue 12: Bucketed reduce-overhead vs dynamic=True vs per-size over random sizes 1..32
      $py benchmarks/compile_presets.py bucketed --csv "$OUT/compile_bucketed_h200.csv" \
        2>&1 | tee "$OUT/compile_bucketed.txt" | grep -v '^  \[' | tail -12
      ;;
    regional)  # issue 12: cold compile in fresh processes, whole vs regional, timm ViT-B/16
      $py benchmarks/regional_compile.py --model timm:vit_base_patch16_224 ${REGIONAL_ARGS:-} --variants ${REGIONAL_VARIANTS:-whole,per-block,nested} --csv "$OUT/regional_compile_h200.csv" \
        2>&1 | tee "$OUT/regional_compile.txt" | tail -30
      ;;
    overhead)
      $py benchmarks/eager_overhead.py ${OVERHEAD_ARGS:-} | tee "$OUT/eager_overhead.txt"
      ;;
    tune)
      $py benchmarks/tune_rows.py 2>&1 | tee "$OUT/tune_rows.csv" | grep '^#'
      ;;
    tune-attention)
      $py benchmarks/tune_attention.py ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune_attention.csv" | grep "^#"
      ;;
    fullgraph-tune)  # issue 15: fullgraph tune on ViT-B/16 batch 4 with its default budget (480 s); FGTUNE_ARGS=--cache adds artifacts
      $py -m fullgraph tune benchmarks/targets/vit.py:vit_b16 --input 4x3x224x224:fp32 ${FGTUNE_ARGS:-} \
        -o "$OUT/vit_tuned.json" 2>&1 | tee "$OUT/vit_tuned.txt" | grep -v '^\[' | tail -40
      ;;
    coldstart)  # issue 15: time to first output in fresh processes, every warm-start route
      $py -m fullgraph bench coldstart --csv "$OUT/coldstart_h200.csv" ${COLDSTART_ARGS:-} 2>&1 | tee "$OUT/coldstart_h200.txt" | tail -30
      ;;
    nms)  # issue 14: our NMS against torchvision's, eager / compiled / CUDA graphs, exactness per case
      $py -m fullgraph bench nms --csv "$OUT/nms_h200.csv" ${NMS_ARGS:-} 2>&1 | tee "$OUT/nms_h200.txt" | tail -30
      ;;
    robot)  # issue 14: the robot model over a stream of varying inputs, four ways
      $py -m fullgraph bench robot --csv "$OUT/robot_h200.csv" ${ROBOT_ARGS:-} 2>&1 | tee "$OUT/robot_h200.txt" | tail -20
      ;;
    regional-aot)  # issue 15: one block's package loaded per layer against the whole model's, fresh processes
      $py benchmarks/probes/regional_aot.py --device cuda ${REGIONAL_AOT_ARGS:-} --csv "$OUT/regional_aot_h200.csv" 2>&1 | tee "$OUT/regional_aot.txt" | tail -8
      ;;
    dit-eager)  # issue 13: eager DiT, ours against the plain twin: aten ops, kernels, host time, latency per forward
      $py benchmarks/probes/dit_eager.py --device cuda ${DIT_EAGER_ARGS:-} 2>&1 | tee "$OUT/dit_eager_h200.txt" | tail -40
      ;;
    aoti-crash)  # issue 15: why an AOTInductor package segfaults when loaded in a fresh process on this image
      $py benchmarks/probes/aoti_crash.py --out "$OUT/aoti_crash" --device cuda ${AOTI_CRASH_ARGS:-} 2>&1 | tee "$OUT/aoti_crash.txt" | tail -40
      ;;
    vit-gemm)  # issue 14: the block's GEMMs alone, each way of feeding the residual stream, and attention per backend
      $py benchmarks/probes/vit_gemm_probe.py ${VIT_GEMM_ARGS:-} --csv "$OUT/vit_gemm_probe_h200.csv" 2>&1 | tee "$OUT/vit_gemm_probe.txt" | tail -40
      ;;
    vit-tma)  # issue 14: timm and ours at b256 default and b4 reduce-overhead; autotuned with persistent TMA; ours under pinned op policies
      $py benchmarks/vit_probe.py --tma --policies ${VIT_TMA_ARGS:-} --csv "$OUT/vit_tma_h200.csv" 2>&1 | tee "$OUT/vit_tma.txt" | tail -20
      ;;
    load)  # issue 31: each callable from 1, 4 and 16 threads, warm and cold; any wrong output or exception fails a run
      # LOAD_MODELS (of benchmarks/targets/serve.py), LOAD_CALLABLES (compiled bucketed precompiled package serial
      # package-cuda-graphs package-default: load's defaults on a GPU, nogil with 2 runners), LOAD_STARTS (warm cold),
      # LOAD_SECONDS (10), LOAD_THREADS (1,4,16) and LOAD_MEMORY_CALLS (10000: each callable's memory over at least
      # that many calls, the issue's mark) warm, LOAD_COLD_SECONDS (3) and LOAD_COLD_THREADS (4,16) cold. Each package
      # is exported once into LOAD_PACKAGES (out/load-packages: outside $OUT, kept while the machine stays warm) and
      # serves both starts, with and without --cuda-graphs. Writes $OUT/load_h200.csv and $OUT/load_h200.txt; failed
      # runs are listed last. Time (H100, 2026-12-05, export included): 300 s ViT-S/16 b4, 333 s ViT-B/16 b64, 298 s
      # the DiT; ViT-B/16 b64 makes ~5,000 timed calls per callable, so its memory calls add ~30 s per callable.
      # One model per device call.
      wanted=" ${LOAD_CALLABLES:-compiled bucketed precompiled package-default package-cuda-graphs} "
      pkgs=${LOAD_PACKAGES:-out/load-packages}
      mkdir -p "$pkgs"
      failed=()
      for model in ${LOAD_MODELS:-vit_s16_b4 vit_b16_b64 dit_b_1024}; do
        target=benchmarks/targets/serve.py:$model pkg=$pkgs/$model.pt2
        kinds=$(for k in compiled bucketed precompiled package serial locked; do [[ $wanted == *" $k "* ]] && printf %s, $k; done)
        kinds=${kinds%,}
        if [[ $wanted == *" package"* || $wanted == *" serial "* ]]; then
          export_served "$model" "$pkg" "$OUT/load_h200.txt"
        fi
        for start in ${LOAD_STARTS:-warm cold}; do
          if [ "$start" = cold ]; then timing="--cold --threads ${LOAD_COLD_THREADS:-4,16} --seconds ${LOAD_COLD_SECONDS:-3}"
          else timing="--threads ${LOAD_THREADS:-1,4,16} --seconds ${LOAD_SECONDS:-10} --memory-calls ${LOAD_MEMORY_CALLS:-10000}"; fi
          runs=()  # each: TARGET and its flags
          [ -n "$kinds" ] && runs+=("$target --callable $kinds$([[ $kinds == *package* || $kinds == *serial* ]] && echo " --package $pkg")")
          [[ $wanted == *" package-cuda-graphs "* ]] && runs+=("$pkg --cuda-graphs")
          [[ $wanted == *" package-default "* ]] && runs+=("$pkg --callable nogil --runners 2")
          for r in "${runs[@]}"; do
            echo "--- $model $start: $r $(date -u +%H:%M:%S)" | tee -a "$OUT/load_h200.txt"
            # shellcheck disable=SC2086 # $r and $timing are word lists
            $py -m fullgraph bench load $r $timing --csv "$OUT/load_h200.csv" 2>&1 | tee -a "$OUT/load_h200.txt" \
              | grep -v '^\[' | tail -22 || failed+=("$model $start: $r")
          done
        done
      done
      echo "load: ${#failed[@]} failed run(s)"; for f in "${failed[@]}"; do echo "  FAILED $f"; done
      ;;
    dit-threads)  # issue 31: the uncaptured DiT package from 1 and 4 threads: the runtime's pool through torch's
      # loader (`package`, which holds the GIL through each run), the same through the library's C interface with the
      # GIL released (`nogil`, deploy/direct.py), and the single-threaded runtime on the package's own thread
      # (`serial`, and `nogil-serial` with the GIL released), the thread counts taking turns in 4 rounds; then
      # `package` and `nogil` with two model instances (~7 min with the export); then the GPU tests of those paths.
      # Writes $OUT/dit_threads_h200.{csv,txt}.
      pkg=${LOAD_PACKAGES:-out/load-packages}/dit_b_1024.pt2
      export_served dit_b_1024 "$pkg" "$OUT/dit_threads_h200.txt"
      $py -m fullgraph bench load "$pkg" --callable "${DIT_THREADS_CALLABLES:-package,nogil,serial,nogil-serial}" \
        --threads 1,4 --seconds "${DIT_THREADS_SECONDS:-16}" --rounds 4 ${DIT_THREADS_ARGS:-} --csv "$OUT/dit_threads_h200.csv" 2>&1 \
        | tee -a "$OUT/dit_threads_h200.txt" | grep -v '^\[' | tail -11
      # two model instances: with the GIL released two calls can launch at once (CPU: 1.73x at 4 threads)
      $py -m fullgraph bench load "$pkg" --callable package,nogil --runners 2 --threads 1,4 \
        --seconds "${DIT_THREADS_SECONDS:-16}" --rounds 4 --csv "$OUT/dit_threads_h200.csv" 2>&1 \
        | tee -a "$OUT/dit_threads_h200.txt" | grep -v '^\[' | tail -6
      PYTHONPATH="$PWD/src:$PWD" $py -m pytest -p no:cacheprovider -q tests/compile/test_concurrency.py \
        tests/deploy/test_package.py tests/deploy/test_direct.py -k "owner or serial or thread or gil or direct or \
        replays" 2>&1 | tail -3
      ;;
    zoo)  # issue 33: timm, transformers and torchvision models, eager / plain torch.compile / plain again /
      # fullgraph.compile with its rewrites, two batches each, both modes (docs/zoo.md). One device call runs at most
      # 10 minutes: ZOO_ARGS picks a part (ZOO_ARGS="--models timm"), and `bench zoo --from-csv A,B` reads parts together.
      $py -m fullgraph bench zoo --reps 30 --prewarm "${ZOO_PREWARM:-8}" --csv "$OUT/zoo_h200.csv" ${ZOO_ARGS:-} 2>&1 \
        | tee -a "$OUT/zoo_h200.txt" \
        | grep -v '^\[' | tail -40
      ;;
    gemm-gelu)  # issue 33: our exact-GELU GEMM's tiles against cuBLAS + Inductor's GELU pass at the ViT MLP shapes
      # shellcheck disable=SC2086 # a word list
      $py benchmarks/tune_gemm_gelu.py ${GEMM_GELU_ARGS:-} --csv "$OUT/tune_gemm_gelu_h200.csv" \
        --write-decisions "$OUT/decisions_gemm_gelu.json" 2>&1 \
        | tee "$OUT/tune_gemm_gelu_h200.txt" | tail -40
      ;;
    native-gap)  # issue 32, item 3: where ours with every op native loses to the plain twin, kernel by kernel
      # (benchmarks/dit_kernels.py --by diff; GAP_SHAPES, GAP_MODES; the losses of the H100 sweep of 2026-12-06 by
      # default: 1536x24 b8 n256 0.967x, 1152x16 b2 n1024 0.970x, 1280x16 b2 n1024 0.971x under reduce-overhead)
      for mode in ${GAP_MODES:-reduce-overhead}; do
        for shape in ${GAP_SHAPES:-1536x24:8:256 1152x16:2:1024 1280x16:2:1024}; do
          echo "--- $shape $mode $(date -u +%H:%M:%S)" | tee -a "$OUT/native_gap.txt"
          timeout "${GAP_SECONDS:-150}" $py benchmarks/dit_kernels.py --shape "$shape" --mode "$mode" \
            --variants plain,native --by diff --top 30 2>&1 | grep -v Warning | tee -a "$OUT/native_gap.txt" \
            | grep -E "^(# |plain |native )"
        done
      done
      ;;
    dit-host)  # issue 32, default mode: where ours loses at the host-bound points (plain's default-mode median there
      # is its host time: 1152x16 b8 n256 0.938 ms default against 0.779 under CUDA graphs, H100 2026-12-06): each
      # variant's host ms, kernels, launchers and cProfile (probes/dit_host_probe.py), kernel by kernel the
      # one-kernel variant that lost 17-27% in default mode but 2-5% graphed (dit_kernels.py), the same with our
      # kernels through Inductor's static launcher, and that kernel's error (lnm_error.py). HOST_SECONDS caps each.
      for shape in ${HOST_SHAPES:-1280x16:8:256}; do  # one shape fits a call (1152x16:2:1024 lost too)
        echo "--- $shape $(date -u +%H:%M:%S)" | tee -a "$OUT/dit_host.txt"
        timeout "${HOST_SECONDS:-120}" $py benchmarks/probes/dit_host_probe.py --shape "$shape" \
          --variants plain,auto,native,native+layer_norm_modulate --profile plain,native --code "$OUT/dit_code" 2>&1 \
          | grep -v Warning \
          | tee -a "$OUT/dit_host.txt" | grep -v "^ "
        timeout "${HOST_SECONDS:-120}" $py benchmarks/dit_kernels.py --shape "$shape" --mode default --by diff \
          --variants native+layer_norm_modulate,native,plain --top 20 2>&1 | grep -v Warning \
          | tee -a "$OUT/dit_host.txt" | grep -E "^(# |plain |native)"
      done
      # user-defined kernels take Triton's own launcher unless this is set; a fresh Inductor cache, since a cached
      # kernel keeps the launcher it was loaded with: does the kernel variant's default-mode loss go?
      echo "--- static launch of user kernels $(date -u +%H:%M:%S)" | tee -a "$OUT/dit_host.txt"
      TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) \
        timeout "${HOST_SECONDS:-120}" $py benchmarks/probes/dit_host_probe.py --shape 1280x16:8:256 \
        --variants plain,native,native+layer_norm_modulate --profile none 2>&1 | grep -v Warning \
        | tee -a "$OUT/dit_host.txt" | grep -v "^ "
      timeout "${HOST_SECONDS:-120}" $py benchmarks/lnm_error.py 2>&1 | grep -v Warn | tee "$OUT/lnm_error.txt"
      ;;
    host-cut)  # issue 32, default mode: ways to cut the host time of a host-bound call (probes/dit_host_probe.py's
      # @flash: SDPA pinned to FlashAttention, cuDNN's costing ~50 us of host a call; @mm: linear as mm + bias add,
      # cuBLASLt's bias epilogue costing ~20 us), at the three points where ours lost in default mode
      for shape in ${HOST_SHAPES:-1152x16:2:1024 1280x16:8:256 1280x16:2:1024}; do
        echo "--- $shape $(date -u +%H:%M:%S)" | tee -a "$OUT/host_cut.txt"
        timeout "${HOST_SECONDS:-150}" $py benchmarks/probes/dit_host_probe.py --shape "$shape" \
          --variants "${HOST_VARIANTS:-plain,auto,auto@flash,auto@mm,auto@flash@mm,plain@flash}" \
          --profile "${HOST_PROFILE:-auto@flash@mm}" 2>&1 | grep -v Warning | tee -a "$OUT/host_cut.txt" | grep -v "^ "
      done
      ;;
    sweep)  # issue 32: the grid (DiT by head dim, ViT B/L/H/S), ours auto against the plain twin, a process per point,
      # each point compiled first by 8 processes at once (--prewarm), then timed alone from Inductor's warm cache.
      # The grid is ~1 h: a call runs the points that fit SWEEP_DEADLINE (540 s) and prints the --only for the rest
      # (SWEEP_ARGS="--only '...'"). Parts join on the CPU: `fullgraph bench sweep --from-csv A,B --write-decisions
      # src/fullgraph/ops/data/decisions.json`. SWEEP_CSV in an ignored folder (build/) outlives the call on a warm
      # machine: with SWEEP_ARGS="--resume ..." the same call sent again carries on (carry build/ to a fresh one);
      # the CSV is copied to $OUT either way.
      sweep_csv=${SWEEP_CSV:-$OUT/sweep_h200.csv}
      mkdir -p "$(dirname "$sweep_csv")"
      # shellcheck disable=SC2086 # a word list
      eval "$py -m fullgraph bench sweep --prewarm ${SWEEP_PREWARM:-8} --deadline ${SWEEP_DEADLINE:-540} --csv $sweep_csv ${SWEEP_ARGS:-}" \
        2>&1 | tee -a "$OUT/sweep_h200.txt" | grep -v '^\[' | tail -40
      [ "$sweep_csv" = "$OUT/sweep_h200.csv" ] || cp "$sweep_csv" "$OUT/"
      ;;
    grad-mode)
      $py benchmarks/probes/vit_grad_mode.py 2>&1 | tee "$OUT/vit_grad_mode.txt"
      ;;
    fleet)  # issue 35: replicas against one Redis (cold, sequential, together, published), timm ViT-B/16 b4 bf16
      # perception. The image has no Redis: carry .gpu/ (Debian's redis-server, redis-tools, libjemalloc2 and
      # liblzf1 unpacked with dpkg -x into .gpu/redis, the pure-Python `redis` client in .gpu/py: built by
      # benchmarks/carry_redis.sh). 4 replicas x 4 variants, steady rounds and profiles took ~160 s on the H100
      # (2026-12-05; a cold replica ~11 s since the window's imports moved out).
      carried_redis
      redis-server --version || { echo "fleet: no redis-server (carry .gpu)"; continue; }
      $py -m fullgraph bench fleet ${FLEET_ARGS:---replicas 4} --csv "$OUT/fleet_h200.csv" 2>&1 \
        | tee "$OUT/fleet_h200.txt" | grep -v '^\[' | tail -25
      ;;
    percall)  # one caller's time per call at small batch, host part apart, and cProfile (benchmarks/percall_probe.py)
      timeout "${PERCALL_SECONDS:-420}" $py benchmarks/percall_probe.py ${PERCALL_ARGS:-} 2>&1 | grep -v Warning \
        | tee "$OUT/percall.txt" | grep -v '^ *[0-9]' | tail -40
      ;;
    lock-bound)  # issue 31 at ViT-S/16 b4: ours against plain torch.compile from 1 thread (the most a per-model lock
      # can give; plain runs under torch.no_grad since the twenty-fourth session), then the GIL-released package
      # against itself behind one lock (nogil,nogil-locked, 2 runners, 1 and 4 threads, taking turns; the package
      # exported into LOAD_PACKAGES unless the load step left it there); LOCKED=1 adds the locked 4-thread baseline
      # in its own process (it aborted on torch 2.11 twice); LOCKBOUND_PLAIN=0 skips the compiled,plain row
      for model in ${LOAD_MODELS:-vit_s16_b4}; do
        t=benchmarks/targets/serve.py:$model pkg=${LOAD_PACKAGES:-out/load-packages}/$model.pt2
        if [ "${LOCKBOUND_PLAIN:-1}" = 1 ]; then
          echo "--- $model lock bound: compiled,plain 1 thread $(date -u +%H:%M:%S)" | tee -a "$OUT/load_lockbound.txt"
          timeout 150 $py -m fullgraph bench load "$t" --callable compiled,plain --threads 1 \
            --seconds "${LOAD_SECONDS:-10}" --csv "$OUT/load_lockbound.csv" 2>&1 | tee -a "$OUT/load_lockbound.txt" \
            | grep -v '^\[' | tail -12
        fi
        export_served "$model" "$pkg" "$OUT/load_lockbound.txt"
        echo "--- $model lock bound: nogil,nogil-locked $(date -u +%H:%M:%S)" | tee -a "$OUT/load_lockbound.txt"
        timeout 150 $py -m fullgraph bench load "$pkg" --callable nogil,nogil-locked --runners 2 --threads 1,4 \
          --seconds "${LOAD_SECONDS:-10}" --csv "$OUT/load_lockbound.csv" 2>&1 | tee -a "$OUT/load_lockbound.txt" \
          | grep -v '^\[' | tail -12
        [ "${LOCKED:-0}" = 1 ] || continue
        echo "--- $model locked, 4 threads $(date -u +%H:%M:%S)" | tee -a "$OUT/load_lockbound.txt"
        timeout 120 $py -m fullgraph bench load "$t" --callable locked --threads 4 --seconds "${LOAD_SECONDS:-10}" \
          --csv "$OUT/load_lockbound.csv" 2>&1 | tee -a "$OUT/load_lockbound.txt" | grep -v '^\[' | tail -12
      done
      ;;
    bisect)  # issue 33: which step of `bench zoo`'s flow loses on ResNet-50 b4 default (BISECT_STEPS, BISECT_SECONDS)
      timeout "${BISECT_SECONDS:-300}" $py benchmarks/resnet_zoo_bisect.py \
        --steps "${BISECT_STEPS:-cli,cli-inproc,parser,zoo,rewrites-none}" 2>&1 \
        | tee "$OUT/resnet_zoo_bisect.txt" | grep -v '^\[' | tail -60
      ;;
    gpu-tests)  # the tests marked gpu (GPU_TESTS: paths, default deploy and compile), Redis from .gpu when carried
      carried_redis
      # shellcheck disable=SC2086 # a word list
      PYTHONPATH="$PYTHONPATH:$PWD" timeout "${GPU_TESTS_SECONDS:-540}" $py -m pytest -p no:cacheprovider -q -ra \
        $($py -c 'import pytest_timeout' 2>/dev/null && echo --timeout=300) -m gpu ${GPU_TESTS:-tests/deploy tests/compile} 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
