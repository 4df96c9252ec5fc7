#!/usr/bin/env bash
# A session's final measuring call on the GPU box (H200, carry [".whl"]; docs/gpu-box.md), on the merged main, one part
# on a cold box. Copy it as run into docs/runs/<date>-sN-final/call.sh with the environment it ran with (its log's first
# line). Steps, each bounded by a timeout and all by END_S (seconds from the start; a step that no longer fits is
# logged as SKIPPED with the time it needed, never left out silently):
# - the gpu-marked test groups (G below, or TESTS's ';'-separated ones; ONLY="5 8 9" picks groups, ONLY=none runs none) in
#   parallel pytest processes, TEST_TIMEOUT each,
#   while the models are made: the 12-layer qwen3-30b-a3b-shaped Q4_K model always, BIG=1 a 2-layer
#   qwen3-235b-a22b-shaped Q8_0 one (4096 wide, experts 1536), Q8=1 the 12-layer model in Q8_0;
# - MOE=1: the MoE layer rows (bench/moe_tiles_bench.py; MOE_SHAPES e.g. 4096x1536x8, MOE_TYPES e.g. Q8_0,Q4_KXD,
#   MOE_S its timeout); IGEMM=1: the prefill GEMM, int8 against the float GEMM (bench/igemm_bench.py IGEMM_ARGS);
#   IQ=1: the i-quants' integer steps against their float dots (bench/kernels_bench.py IQ_ARGS under IQ_ENV, IQ_S its
#   timeout; iq50, session 22; on by default since session 23), then a 2-layer model's decode for each type of
#   IQ_MODELS (default IQ2_XXS) with the integer step and without (IQ_ROUNDS);
#   DRAW=1: the top-p draw graph alone, its select at 4096 / 2048 / 1024 / 512 bins;
# - `generate -n 128` a process each, interleaved, ROUNDS rounds: greedy; PAIRX=1 greedy again under PAIRX_OFF's
#   switches; unless SAMPLED=0 top_k 0, top_k 40 (TOP40=0 leaves it out), top_p 0.95 and 0.9; Q8=1 the Q8_0 model under
#   the defaults and under Q8_OFF's switches (Q8_ROUNDS); BIG=1 the 4096-wide model under the defaults and BIG_OFF's
#   switches (BIG_ROUNDS);
# - the OpenAI server's streamed decode (SERVE_PLAIN=1: serve --top-k 0; always: top_p 0.95 in the requests, SERVE_S
#   its timeout, default 90);
#   FIRST=1: first_request_bench's fresh servers (FIRST_SERVERS, default auto,auto:off);
# - OSS=1: a gpt-oss-20b-shaped model (OSS_LAYERS, default 24; not niced: session 24's first call lost its 12 GB
#   to the timeout behind 6 test groups and the llama.cpp build) with MXFP4 experts (as its GGUFs ship them; biased
#   experts through the MoE kernels since session 24), made at the start: its decode (90 s each, OSS_ROUNDS rounds,
#   after the llama.cpp build where LLAMA=1) with the MXFP4 integer step
#   on the tiled resident experts (the default since session 25), on the file's blocks (SPARKD_MOE_MXFP4_LAYOUT=gguf)
#   and, with OSS_FLOAT=1, SPARKD_MXFP4_INT=0; OSS_PROFILE=1 its replayed step kernel by kernel (decode_kernels.py);
#   with LLAMA=1 llama-bench built with CUDA (cuda_side_by_side.sh BUILD_ONLY=1, started at the call's start; carry
#   .cache) on the same file; OSS_STREAM=1 its streamed decode on the GPU (--budget OSS_BUDGET, default 3G: the
#   experts read from the file each token) zero-copy (--unified on) and with the VRAM cache (auto);
# - Q40=1: a Q4_0 model (Q40_PRESET, default qwen3-30b-a3b; Q40_LAYERS, default 12): its decode on the tiled Q4_0
#   projections and experts (the default since session 26) and on the file's blocks (SPARKD_Q4_0_LAYOUT=gguf
#   SPARKD_MOE_Q4_0_LAYOUT=gguf),
#   Q40_ROUNDS rounds after the llama.cpp build, and under Q40_OFF's switches where set (e.g. Q40_OFF="SPARKD_X=off"),
#   Q40_PROFILE=1 its replayed step kernel by kernel, and llama-bench on it with LLAMA=1;
# - MXT=1: the 4-bit types' GEMV and MoE on the GGUF blocks against their tiled layouts (bench/nibble_tiles_bench.py,
#   MXT_S its timeout, MXT_ARGS e.g. --sweep none --types Q4_0);
# - LONG=1: greedy decode after a LONG_PROMPT-token prompt (default 8000, --ctx 16384: attention over long spans),
#   LONG_ROUNDS rounds, each also under LONG_OFF's switches where set (e.g.
#   LONG_OFF="SPARKD_DECODE_ATTENTION_SPLIT=auto"; ';'-separated: each in turn); with LLAMA=1 then llama-bench's
#   decode on the same file after 0 and LONG_PROMPT tokens (-d) and its LONG_PROMPT-token prompt (-p, session 32);
#   every decode's generate takes GEN_FLAGS's flags too,
#   so an _OFF variable may set flags as well as switches (session 30: LONG_OFF="GEN_FLAGS='--kv-type f32'");
# - MLA=1: the decodes (rounds, LONG, llama-bench) on a DeepSeek-V3-shaped Q4_K model (MLA_LAYERS, default 5: three
#   dense layers and two MoE layers of 16 experts) instead of the 12-layer Qwen3-30B-A3B-shaped one;
# - ATTN=1: the step's attention alone, rope_kv + decode_attention against rope_attention by position
#   (bench/gpu_box/decode_attention_bench.py; ATTN_ARGS, default --fused, may hold ';'-separated runs; ATTN_S the
#   timeout of each).
# Results: $OUT/res.tgz + $OUT/log.txt (snapshotted after every step, so a timeout keeps what ran).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); END=${END_S:-400}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
fits() {  # need what: true when need seconds are left before END_S, else a SKIPPED line (session 21's second call
  # lost its decodes to a silent skip)
  [ $(left) -gt $1 ] && return 0; log "SKIPPED $2: $(left) s left, it needs $1 (raise END_S)"; return 1
}
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
log "call: $(env | grep -E '^(ONLY|MOE|MOE_[A-Z]+|DRAW|ROUNDS|TOP40|SAMPLED|BIG|BIG_[A-Z]+|SERVE_PLAIN|TEST_TIMEOUT|END_S|Q8|Q8_ROUNDS|Q8_OFF|PAIRX|PAIRX_OFF|FIRST|FIRST_SERVERS|IGEMM|IGEMM_S|IGEMM_ARGS|IQ|IQ_ARGS|IQ_ENV|IQ_S|IQ_ROUNDS|IQ_MODELS|OSS|OSS_LAYERS|OSS_ROUNDS|OSS_FLOAT|OSS_PROFILE|OSS_STREAM|OSS_BUDGET|Q40|Q40_ROUNDS|Q40_PROFILE|Q40_OFF|Q40_PRESET|Q40_LAYERS|LLAMA|TESTS|SERVE_S|MXT|MXT_S|MXT_ARGS|ATTN|ATTN_S|ATTN_ARGS|LONG|LONG_PROMPT|LONG_ROUNDS|LONG_OFF|MLA|MLA_LAYERS)=' | sort | tr '\n' ' ')"
if [ "${LLAMA:-0}" = 1 ]; then  # llama-bench with CUDA, built while the tests run (~180 s on 16 cores)
  OUT=$R/llama WORK=$W BUILD_ONLY=1 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
fi
O=$W/oss-${OSS_LAYERS:-24}-MXFP4.gguf
if [ "${OSS:-0}" = 1 ]; then
  ( [ -f $O ] || { timeout 240 python3 -m sparkd.engine.cli make-model $O.part --preset gpt-oss-20b \
      --layers ${OSS_LAYERS:-24} --quant Q8_0 --tensor-type _exps=MXFP4 --quiet && mv $O.part $O; } ) > $R/make_oss.log 2>&1 & MKO=$!
fi
Z=$W/${Q40_PRESET:-qwen3-30b-a3b}-${Q40_LAYERS:-12}-Q4_0.gguf
if [ "${Q40:-0}" = 1 ]; then  # session 26: the tiled Q4_0 layout
  ( [ -f $Z ] || { nice -n 10 timeout 200 python3 -m sparkd.engine.cli make-model $Z.part \
      --preset ${Q40_PRESET:-qwen3-30b-a3b} --quant Q4_0 --quiet --layers ${Q40_LAYERS:-12} && mv $Z.part $Z; } \
  ) > $R/make_q40.log 2>&1 & MKZ=$!
fi
if [ "${MLA:-0}" = 1 ]; then  # session 31: MLA's latent attention
  M=$W/dsv3-${MLA_LAYERS:-5}-Q4_K.gguf; MAKE="--preset deepseek-v3 --experts 16 --layers ${MLA_LAYERS:-5}"
else
  M=$W/q3-12-Q4_K.gguf; MAKE="--preset qwen3-30b-a3b --layers 12"
fi
( [ -f $M ] || { nice -n 10 timeout 150 python3 -m sparkd.engine.cli make-model $M.part $MAKE --quant Q4_K --quiet \
    && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
B=$W/q235-4-Q8_0.gguf
if [ "${BIG:-0}" = 1 ]; then
  ( [ -f $B ] || { nice -n 10 timeout 240 python3 -m sparkd.engine.cli make-model $B.part --preset qwen3-235b-a22b \
      --quant Q8_0 --quiet --layers 2 && mv $B.part $B; } ) > $R/make_big.log 2>&1 & MKB=$!
fi
Q=$W/q3-12-Q8_0.gguf
if [ "${IQ:-0}" = 1 ]; then  # iq50: a 2-layer qwen3-30b-a3b-shaped model a type for its decode with the integer step
  ( for t in ${IQ_MODELS:-IQ2_XXS}; do m=$W/q3-2-$t.gguf; [ -f $m ] || { nice -n 10 timeout 90 python3 -m \
      sparkd.engine.cli make-model $m.part --preset qwen3-30b-a3b --quant $t --quiet --layers 2 && mv $m.part $m; }; done
  ) > $R/make_iq.log 2>&1 & MKI=$!
fi
if [ "${Q8:-0}" = 1 ]; then  # the 2048-wide Q8_0 decode: moe46's down ahead against SPARKD_MOE_DOWN_AHEAD=off
  ( [ -f $Q ] || { nice -n 10 timeout 200 python3 -m sparkd.engine.cli make-model $Q.part --preset qwen3-30b-a3b \
      --quant Q8_0 --quiet --layers 12 && mv $Q.part $Q; } ) > $R/make_q8.log 2>&1 & MKQ=$!
fi
E=tests/engine
K="int8 or igemm or grouped or prefill or gemm"
G=("$E/test_kernels.py -k \"int8 or igemm\""
   "$E/test_kernels.py -k \"($K) and not (int8 or igemm)\""
   "$E/test_kernels.py -k \"not ($K)\""
   "$E/test_fused_kernels.py $E/test_norm_quant.py $E/test_norm_fold.py $E/test_split_fold.py"
   "$E/test_quants.py $E/test_iq_kernels.py $E/test_q6_k_int.py $E/test_q6_k_tiled.py $E/test_iq4_xs_int.py $E/test_q4_0_int.py $E/test_iq_grid_int.py"
   "$E/test_q4_k_tiled.py $E/test_row_tiles.py $E/test_q4t_compact.py $E/test_q4t_pair.py $E/test_q4t_relaid.py $E/test_q4t_tma.py $E/test_gemv_split.py"
   "$E/test_int_kernels.py $E/test_fused_qkv.py $E/test_kernel_determinism.py"
   "$E/test_kernel_engine.py $E/test_eager_decode.py $E/test_kimi_k3.py $E/test_kda_memory.py"
   "$E/test_moe_decode_fusion.py $E/test_moe_reference.py"
   "$E/test_device_sampler.py $E/test_device_sampler_fused.py $E/test_device_argmax.py"
   "$E/test_cuda_graphs.py $E/test_prompt_cache.py $E/test_decode_graphs.py"
   "tests/test_daemon_cgroupfs.py -k gpu_guard"
   "$E/test_moe_twin.py $E/test_moe_words_full.py $E/test_moe_pipe.py $E/test_moe_down_ahead.py"  # 13-14: group 9's rest
   "$E/test_moe_tiles.py $E/test_moe_tiled.py $E/test_moe_down_full.py"
   "$E/test_pdl.py $E/test_feed_tokens.py $E/test_decode_pipeline.py $E/streaming tests/guards/test_gpu_guard.py"  # 15: group 10's rest
   "$E/test_kernels.py -k \"IQ4_XS or Q4_0 or test_moe_decode_matches_reference\""  # 16: iq48's types, the MoE pairs
   "$E/test_moe_tiled.py $E/test_moe_pairx_down.py $E/test_moe_pairx_steps.py $E/test_int_steps.py")  # 17: after the call
[ -n "${TESTS:-}" ] && IFS=';' read -ra G <<< "$TESTS"  # TESTS="a.py -k x;b.py": these groups instead of G
P=(); I=()
for i in "${!G[@]}"; do
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $((i+1)) "* ]] && continue  # ONLY="8 10 11": those groups alone
  eval timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!); I+=($((i+1)))
done
for j in "${!P[@]}"; do wait ${P[$j]}; log "tests group ${I[$j]} rc $? $(tail -1 $R/gpu_tests_${I[$j]}.log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $OUT/log.txt; snap
if [ "${MOE:-0}" = 1 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout ${MOE_S:-110} python3 bench/moe_tiles_bench.py --defaults-only --floor \
    --types ${MOE_TYPES:-Q8_0,Q4_KXD} ${MOE_SHAPES:+--shapes $MOE_SHAPES} --variants again --compile-workers 8 --json $R/moe.json \
    > $R/moe.log 2>&1
  log "moe rc $?"; snap
fi
if [ "${IGEMM:-0}" = 1 ] && fits 60 "prefill GEMM bench"; then  # igemm50 (session 22): Q4_0 / IQ4_XS int8 vs float
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout ${IGEMM_S:-90} python3 bench/igemm_bench.py ${IGEMM_ARGS:---types Q4_0,IQ4_XS \
    --grouped-types Q4_0,IQ4_XS --shapes 2048x2048 --grouped 768x2048,2048x768 --tokens 512,2048 \
    --ways ieee,s13,tf32,64/32/4/1/2/0} --json $R/igemm.json > $R/igemm.log 2>&1
  log "igemm rc $?"; cat $R/igemm.log >> $OUT/log.txt; snap
fi
if [ "${IQ:-0}" = 1 ] && fits 150 "i-quant integer steps bench"; then  # iq50 (session 22): dp4a steps vs float dots
  env ${IQ_ENV:-} \
    timeout ${IQ_S:-140} python3 bench/kernels_bench.py ${IQ_ARGS:---types IQ2_XXS,IQ3_XXS,IQ2_XS,IQ1_S --unified off} \
    --json $R/iq.json > $R/iq.log 2>&1
  log "iq rc $?"; cat $R/iq.log >> $OUT/log.txt; snap
fi
if [ "${MXT:-0}" = 1 ] && fits 60 "nibble tiles bench"; then  # sessions 25-26: the tiled MXFP4 and Q4_0 layouts
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout ${MXT_S:-150} python3 bench/nibble_tiles_bench.py ${MXT_ARGS:-} \
    --json $R/mxt.json > $R/mxt.log 2>&1
  log "nibble tiles rc $?"; cat $R/mxt.log >> $OUT/log.txt; snap
fi
if [ "${ATTN:-0}" = 1 ]; then  # session 28: rope + KV write + attention in one launch; session 29: ';'-separated runs
  IFS=';' read -ra AA <<< "${ATTN_ARGS:---fused --positions 8,40,72,136,264,520,1000,2000,4000,8000}"
  for i in "${!AA[@]}"; do
    fits 60 "attention bench $((i+1))" || break
    timeout ${ATTN_S:-120} python3 bench/gpu_box/decode_attention_bench.py ${AA[$i]} --json $R/attn_$((i+1)).json \
      > $R/attn_$((i+1)).log 2>&1
    log "attention bench $((i+1)) rc $?"; cat $R/attn_$((i+1)).log >> $OUT/log.txt; snap
  done
fi
if [ "${DRAW:-0}" = 1 ] && fits 100 "top-p draw bench"; then  # the select's 4096, 2048, 1024 and 512 bins a stage
  timeout 95 python3 bench/gpu_box/draw_graph_bench.py --top-p-only --reps 200 --json $R/draw_graph.json > $R/draw_graph.log 2>&1
  log "draw bench rc $?"; cat $R/draw_graph.log >> $OUT/log.txt; snap
fi
wait $MK; log "model $(ls -la $M | awk '{print $5}')"
gen() {  # tag round [more flags]
  timeout ${GEN_S:-40} python3 -m sparkd.engine.cli generate $M --tokens ${TOKS:-1,2,3,4,5,6,7,8} -n 128 --device cuda \
    --resident --cuda-graphs on --json ${GEN_FLAGS:-} ${@:3} > $R/gen_$1_$2.json 2> $R/gen_$1_$2.err
  log "decode $1 round $2 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1_$2.json) tokens $(python3 -c "import hashlib, json, sys; print(hashlib.md5(str(json.load(open(sys.argv[1]))['tokens']).encode()).hexdigest()[:8])" $R/gen_$1_$2.json 2>/dev/null)"
}
for r in $(seq 1 ${ROUNDS:-2}); do
  fits 100 "decode round $r" || break
  gen greedy $r  # PAIRX=1: then with q4k48's steps off (or PAIRX_OFF's switches)
  [ "${PAIRX:-0}" = 1 ] && eval "${PAIRX_OFF:-SPARKD_MOE_PAIRX_STEPS=off} gen greedypxoff $r"
  if [ "${SAMPLED:-1}" = 1 ]; then  # SAMPLED=0: greedy only
    gen full $r --temp 0.8 --seed 1; [ "${TOP40:-1}" = 1 ] && gen top40 $r --temp 0.8 --top-k 40 --seed 1
    gen topp95 $r --temp 0.8 --top-p 0.95 --seed 1; gen topp90 $r --temp 0.8 --top-p 0.9 --seed 1
  fi; snap
done
if [ "${LONG:-0}" = 1 ]; then  # session 29: greedy decode after a LONG_PROMPT-token prompt, also under LONG_OFF
  LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(${LONG_PROMPT:-8000})))")
  for r in $(seq 1 ${LONG_ROUNDS:-1}); do
    fits 100 "long decode round $r" || break
    TOKS=$LT GEN_S=90 gen long $r --ctx 16384
    IFS=';' read -ra LO <<< "${LONG_OFF:-}"
    for i in "${!LO[@]}"; do eval "TOKS=$LT GEN_S=90 ${LO[$i]} gen longoff${i#0} $r --ctx 16384"; done; snap
  done
  if [ "${LLAMA:-0}" = 1 ] && fits 100 "llama-bench at depth"; then  # its decode after 0 and LONG_PROMPT tokens
    wait $LB 2>/dev/null
    [ -x $W/llama-cuda/llama-bench ] && timeout 95 $W/llama-cuda/llama-bench -o json -m $M -ngl 99 -p 0 -n 128 \
      -d 0,${LONG_PROMPT:-8000} -r 2 > $R/llama_long.json 2> $R/llama_long.err
    log "llama-bench Q4_K at depth 0,${LONG_PROMPT:-8000} rc $?: $(grep -o '"avg_ts": [0-9.e+]*' $R/llama_long.json \
      | tr '\n' ' ')"
    [ -x $W/llama-cuda/llama-bench ] && timeout 95 $W/llama-cuda/llama-bench -o json -m $M -ngl 99 \
      -p ${LONG_PROMPT:-8000} -n 0 -r 2 > $R/llama_pp.json 2> $R/llama_pp.err  # session 32: its prompt too
    log "llama-bench Q4_K prompt of ${LONG_PROMPT:-8000} rc $?: $(grep -o '"avg_ts": [0-9.e+]*' $R/llama_pp.json)"
    snap
  fi
fi
if [ "${Q8:-0}" = 1 ]; then
  wait $MKQ; log "q8 model $(ls -la $Q 2>&1 | awk '{print $5}') $(tail -1 $R/make_q8.log)"
  for r in $(seq 1 ${Q8_ROUNDS:-1}); do
    fits 90 "Q8_0 decode round $r" || break
    M=$Q gen q8 $r; eval "M=$Q ${Q8_OFF:-SPARKD_MOE_DOWN_AHEAD=off} gen q8aheadoff $r"; snap
  done
fi
if [ "${IQ:-0}" = 1 ]; then  # iq50: each IQ_MODELS model's decode, the integer step (the default) and SPARKD_<type>_INT=0
  wait $MKI; log "iq models $(tail -1 $R/make_iq.log)"
  for r in $(seq 1 ${IQ_ROUNDS:-1}); do
    for t in ${IQ_MODELS:-IQ2_XXS}; do
      fits 70 "$t decode round $r" || break 2
      m=$W/q3-2-$t.gguf; tl=$(echo $t | tr A-Z a-z | tr -d _)
      M=$m gen ${tl}int $r; eval "M=$m SPARKD_${t}_INT=0 gen ${tl}float $r"; snap
    done
  done
fi
if [ "${OSS:-0}" = 1 ]; then  # the gpt-oss-shaped model: tiled experts (the default), GGUF blocks, float, llama.cpp
  wait $MKO; log "oss model $(ls -la $O 2>&1 | awk '{print $5}') $(tail -1 $R/make_oss.log)"
  # the decodes after the llama.cpp build: its 16 compile jobs made the same decode 519-756 tok/s (session 25)
  [ "${LLAMA:-0}" = 1 ] && { wait $LB; log "llama build: $(tail -2 $R/llama_build.log | tr '\n' ' ')"; }
  for r in $(seq 1 ${OSS_ROUNDS:-1}); do
    fits 100 "gpt-oss decode round $r" || break
    M=$O GEN_S=90 gen ossint $r; M=$O GEN_S=90 SPARKD_MOE_MXFP4_LAYOUT=gguf gen ossgguf $r
    [ "${OSS_FLOAT:-0}" = 1 ] && M=$O GEN_S=90 SPARKD_MXFP4_INT=0 gen ossfloat $r; snap
  done
  if [ "${OSS_PROFILE:-0}" = 1 ] && fits 130 "gpt-oss decode profile"; then  # session 25: one replayed step
    timeout 125 python3 bench/gpu_box/decode_kernels.py $O --steps 8 --rounds 2 --json $R/profile_oss.json \
      > $R/profile_oss.log 2>&1; log "gpt-oss profile rc $?"; snap
  fi
  if [ "${LLAMA:-0}" = 1 ] && fits 60 "llama-bench gpt-oss"; then
    LBIN=$W/llama-cuda/llama-bench
    [ -x $LBIN ] && timeout 55 $LBIN -o json -m $O -ngl 99 -p 0 -n 128 -r 3 > $R/llama_oss.json 2> $R/llama_oss.err
    log "llama-bench gpt-oss rc $?: $(grep -o '"avg_ts": [0-9.e+]*' $R/llama_oss.json 2>/dev/null)"; snap
  fi
  if [ "${OSS_STREAM:-0}" = 1 ]; then  # session 26: streamed gpt-oss experts through the MoE kernels, biases and all
    for U in on auto; do
      fits 95 "streamed gpt-oss --unified $U" || break
      timeout 90 python3 -m sparkd.engine.cli generate $O --tokens 1,2,3,4,5,6,7,8 -n 32 --device cuda --unified $U \
        --budget ${OSS_BUDGET:-3G} --json > $R/gen_ossstream_$U.json 2> $R/gen_ossstream_$U.err
      log "streamed gpt-oss --unified $U rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_ossstream_$U.json) $(grep -o '"hit_rate": [0-9.]*' $R/gen_ossstream_$U.json | head -1) $(tail -1 $R/gen_ossstream_$U.err | cut -c1-200)"; snap
    done
  fi
fi
if [ "${Q40:-0}" = 1 ]; then  # session 26: the Q4_0 model on the tiled layout and on the file's blocks, llama.cpp
  wait $MKZ; log "q4_0 model $(ls -la $Z 2>&1 | awk '{print $5}') $(tail -1 $R/make_q40.log)"
  [ "${LLAMA:-0}" = 1 ] && { wait $LB 2>/dev/null; }
  for r in $(seq 1 ${Q40_ROUNDS:-2}); do
    fits 90 "Q4_0 decode round $r" || break
    M=$Z gen q40tiled $r; M=$Z SPARKD_Q4_0_LAYOUT=gguf SPARKD_MOE_Q4_0_LAYOUT=gguf gen q40gguf $r
    [ -n "${Q40_OFF:-}" ] && eval "M=$Z $Q40_OFF gen q40off $r"; snap
  done
  if [ "${Q40_PROFILE:-0}" = 1 ] && fits 130 "Q4_0 decode profile"; then
    timeout 125 python3 bench/gpu_box/decode_kernels.py $Z --steps 8 --rounds 2 --json $R/profile_q40.json \
      > $R/profile_q40.log 2>&1; log "Q4_0 profile rc $?"; snap
  fi
  if [ "${LLAMA:-0}" = 1 ] && fits 60 "llama-bench Q4_0"; then
    [ -x $W/llama-cuda/llama-bench ] && timeout 55 $W/llama-cuda/llama-bench -o json -m $Z -ngl 99 -p 0 -n 128 -r 3 \
      > $R/llama_q40.json 2> $R/llama_q40.err
    log "llama-bench Q4_0 rc $?: $(grep -o '"avg_ts": [0-9.e+]*' $R/llama_q40.json 2>/dev/null)"; snap
  fi
fi
if [ "${BIG:-0}" = 1 ]; then
  wait $MKB; log "big model $(ls -la $B 2>&1 | awk '{print $5}') $(tail -1 $R/make_big.log)"
  big() {  # tag round [env]
    env ${@:3} timeout 60 python3 -m sparkd.engine.cli generate $B --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda \
      --resident --cuda-graphs on --json > $R/big_$1_$2.json 2> $R/big_$1_$2.err
    log "big decode $1 round $2 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/big_$1_$2.json) tokens $(python3 -c "import hashlib, json, sys; print(hashlib.md5(str(json.load(open(sys.argv[1]))['tokens']).encode()).hexdigest()[:8])" $R/big_$1_$2.json 2>/dev/null)"
  }
  for r in $(seq 1 ${BIG_ROUNDS:-2}); do
    fits 90 "4096-wide decode round $r" || break
    big default $r; big off $r ${BIG_OFF:-SPARKD_MOE_PIPE=off}; snap
  done
fi
[ "${SERVE_PLAIN:-1}" = 1 ] && fits 55 "serve --top-k 0" && timeout 50 python3 bench/gpu_box/serve_decode_bench.py --model $M \
  --top-k 0 --reps 2 --json $R/serve.json > $R/serve.log 2>&1; log "serve rc $?: $(grep top-k $R/serve.log | tr '\n' ';')"; snap
# a cold box compiles the draw kernels at the server's load (~22 s in session 24): SERVE_S, default 90
fits $(( ${SERVE_S:-90} + 5 )) "serve top_p" && timeout ${SERVE_S:-90} python3 bench/gpu_box/serve_decode_bench.py --model $M --top-k 0 --top-p 0.95 --reps 2 \
  --tokens 192 --server-log $R/serve_topp.err --json $R/serve_topp.json > $R/serve_topp.log 2>&1
log "serve top_p rc $?: $(grep top-k $R/serve_topp.log | tr '\n' ';')"; grep -h "graphs at load" $R/serve_topp.err* | tee -a $OUT/log.txt
if [ "${FIRST:-0}" = 1 ] && fits 45 "first requests"; then  # srv48: fresh servers' first requests, the load's stream import on / off
  mkdir -p $R/first; timeout $(( $(left) - 5 )) python3 bench/gpu_box/first_request_bench.py --model $M \
    --servers ${FIRST_SERVERS:-auto,auto:off} --requests 3 --logs $R/first --json $R/first.json > $R/first.log 2>&1
  log "first requests rc $?"; cat $R/first.log >> $OUT/log.txt
fi
log done; snap
