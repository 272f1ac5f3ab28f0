# call C: unpack the shipped weights, wait for the features (at most CUT s), fine-tune the drafters
# in parallel on the GPU until BUDGET s after this call's start, pack the new weights, cards and
# logs into $OUT (xz, 15 MB pieces). A run still going 40 s before the budget is stopped, so that
# the others come back.
K=/tmp/k; T0=$(date +%s); BUDGET=${BUDGET:-500}; CUT=${CUT:-150}; SHIP=${SHIP:-150}
elapsed() { echo $(( $(date +%s) - T0 )); }
mv .dev/ic/* $K/init/
cat $K/init/init.tar.xz.* | xz -d | { rm -rf $K/assets; mkdir -p $K/assets; tar -x -C $K/assets; }
export PYTHONPATH=$K/repo:$K/site:$K/pkg SPECVIZ_CACHE=$K/cache PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 \
  SPECVIZ_ASSETS=$K/assets
while [ ! -f $K/feat.done ] && [ $(elapsed) -lt $CUT ]; do sleep 3; done
[ -f $K/feat.done ] || { echo "cut at $(elapsed) s: stopping the feature passes"; pkill -f -- "--build-data"; sleep 3; }
mkdir -p $K/feat_all; ln -sf $K/feat/*/shard-*.safetensors $K/feat_all/
cat $K/feat.log; echo "features: $(ls $K/feat_all | wc -l) files, $(du -shL $K/feat_all | cut -f1)"
[ "$(ls $K/feat_all | wc -l)" -gt 0 ] || { echo "no features"; tail -3 $K/feat_*.log; exit 4; }
MIN=$(python3 -c "print(round(max(1.0, ($BUDGET - $(elapsed) - $SHIP) / 60), 2))")
echo "training $MIN min from $(elapsed) s"
settings() {   # batch 32 is 4-8x the CPU runs' batch: about twice their learning rates
  case $1 in
    dflash-b16|dspark) echo "--lr 6e-4 --position-decay 3" ;;
    dflash-b8|peagle) echo "--lr 6e-4" ;;
    mtp) echo "--lr 5e-4" ;;
    draft) echo "--lr 2e-4" ;;
    *) echo "--lr 3e-4" ;;
  esac
}
cd $K/repo; mkdir -p $K/logs; pids=()
for d in $(cat $K/sh/drafters); do
  ( python3 -m specviz train --drafter $d --init shipped --data $K/feat_all --shards $K/resp \
      --minutes $MIN --steps 0 --batch-size 32 --warmup 100 --eval-every 500 --out-dir $K/ck \
      --device ${DEV:-cuda} --threads 2 $(settings $d) > $K/logs/$d.log 2>&1
    echo "$d exit $?" >> $K/logs/exits ) &
  pids+=($!)
done
left=$(( BUDGET - 40 - $(elapsed) )); [ $left -gt 1 ] || left=1
( sleep $left; echo "budget: stopping"; pkill -f -- "train --drafter" ) &
watchdog=$!
sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv || true
wait "${pids[@]}"; kill $watchdog 2>/dev/null
cat $K/logs/exits
for d in $(cat $K/sh/drafters); do tr '\r' '\n' < $K/logs/$d.log | grep -h "^\[$d\]\|Error" | tail -3; done
mkdir -p $K/out; cp $K/logs/*.log $K/feat.log $K/out/
for d in $(cat $K/sh/drafters); do   # new weights, or for a failed export its last checkpoint
  if grep -qx "$d exit 0" $K/logs/exits; then cp $K/assets/$d.md $K/assets/$d.safetensors \
      $K/assets/$d-0*-of-*.safetensors $K/out/ 2>/dev/null
  elif [ -f $K/ck/$d/ckpt.safetensors ]; then
    python3 $K/sh/slim_ckpt.py $K/ck/$d/ckpt.safetensors $K/out/ckpt-$d.safetensors
    cp $K/ck/$d/ckpt.json $K/out/ckpt-$d.json; echo "$d: checkpoint packed"
  fi
done
cd $K/out; ls -la; tar -cf - * | xz -T0 -3 > $K/out.tar.xz
split -b 15000000 -d $K/out.tar.xz $OUT/out.tar.xz.
ls -la $OUT; echo "call C took $(elapsed) s"
