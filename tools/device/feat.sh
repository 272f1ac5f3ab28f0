# background (from b.sh): the shared feature folder, 8 feature passes on the GPU over disjoint
# shard lists (as many shards as the disk holds, evenly spread); c.sh links what is finished
K=/tmp/k; cd $K/repo
export PYTHONPATH=$K/repo:$K/site:$K/pkg SPECVIZ_CACHE=$K/cache PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
T0=$(date +%s)
python3 - "$(df -B1 --output=avail $K | tail -1)" <<'PY'
import glob, os, sys
free, names = int(sys.argv[1]), sorted(glob.glob("/tmp/k/resp/shard-*.safetensors"))
n = max(1, min(len(names), int((free - 10e9) / 2.45e8), int(os.environ.get("MAXSHARDS", 10**6))))
pick = sorted({names[round(i * (len(names) - 1) / max(1, n - 1))] for i in range(n)})
print(f"free {free / 1e9:.1f} GB: {len(pick)} of {len(names)} shards")
for j, p in enumerate(pick):
    os.makedirs(f"/tmp/k/links/{j % 8}", exist_ok=True)
    os.symlink(p, f"/tmp/k/links/{j % 8}/{os.path.basename(p)}")
PY
for i in 0 1 2 3 4 5 6 7; do
  [ -d $K/links/$i ] || continue
  python3 -m specviz train --build-data --shards $K/links/$i --data $K/feat/$i --device ${DEV:-cuda} \
    --feature-batch 32 --threads 2 ${MAXSEQS:+--max-seqs $MAXSEQS} > $K/feat_$i.log 2>&1 &
done
wait
echo "features done in $(( $(date +%s) - T0 )) s"; grep -h "built" $K/feat_*.log | tail -8
touch $K/feat.done
