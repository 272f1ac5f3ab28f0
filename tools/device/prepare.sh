#!/usr/bin/env bash
# Build the payload of a GPU fine-tuning run in .dev/ (git-ignored; see README.md here): the
# embedded GGUF in two parts, the gguf wheel, the shipped weights of $DRAFTERS (xz, in three
# pieces), the response shards and these scripts; then print what each of the three calls sends.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
DRAFTERS=${DRAFTERS:-"dflash-b16 dspark peagle mtp eagle3 eagle1"}
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
rm -rf .dev && mkdir -p .dev/g1 .dev/g2 .dev/ia .dev/ib .dev/ic .dev/whl .dev/sh
gguf=$(python -c "from specviz.models.loading import embedded_gguf; print(embedded_gguf())")
head -c 58000000 "$gguf" > .dev/g1/part1
tail -c +58000001 "$gguf" > .dev/g2/part2
sha256sum "$gguf" | cut -d' ' -f1 > .dev/sh/gguf.sha256
python -c "from specviz.models.target import Target; print(Target.load('embedded', device='cpu').fingerprint)" \
  > .dev/sh/fingerprint
pin() { python -c "import importlib.metadata as m; print('$1==' + m.version('$1'))"; }
# gguf: the embedded target's loader; greenlet: specviz.bench (selfcheck imports it) takes turns
pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .dev/whl "$(pin gguf)" "$(pin greenlet)"
names=$(cd assets && for d in $DRAFTERS; do ls "$d.md" "$d".safetensors "$d"-0*-of-*.safetensors 2>/dev/null || true; done)
(cd assets && tar -cf - $names) | xz -T2 -6 > .dev/init.tar.xz
head -c 6000000 .dev/init.tar.xz > .dev/ia/init.tar.xz.00
tail -c +6000001 .dev/init.tar.xz | head -c 6000000 > .dev/ib/init.tar.xz.01
tail -c +12000001 .dev/init.tar.xz > .dev/ic/init.tar.xz.02
rm .dev/init.tar.xz
cp -r data/responses .dev/resp
cp tools/device/*.sh tools/device/*.py .dev/sh/
echo "$DRAFTERS" > .dev/sh/drafters
tree=$(git ls-files -z | grep -zv '^assets/\|^demos/\|^data/responses/' | xargs -0 du -cb | tail -1 | cut -f1)
for call in "A .dev/g1 .dev/ia .dev/sh" "B .dev/g2 .dev/ib .dev/resp .dev/whl .dev/sh" "C .dev/ic .dev/sh"; do
  set -- $call; name=$1; shift
  size=$(( tree + $(du -cb "$@" | tail -1 | cut -f1) ))
  echo "call $name sends $size bytes (limit 67108864): carry $*"
  [ "$size" -lt 66500000 ] || { echo "call $name is too large: fewer drafters"; exit 1; }
done
