#!/usr/bin/env bash
# `hide`: leave assets/, demos/ and data/responses/ out of the working tree that a device call
# sends (untracked and ignored; the shards moved to /tmp/specviz-responses), so that the tree is
# ~2 MB; `restore`: put everything back as it was (nothing is committed in between).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
case ${1:-} in
  hide)
    git diff --quiet HEAD || { echo "commit or stash first"; exit 1; }
    git rm -r -q --cached assets demos data/responses
    printf '/assets/\n/demos/\n' >> .git/info/exclude
    mv data/responses /tmp/specviz-responses ;;
  restore)
    [ -d data/responses ] || mv /tmp/specviz-responses data/responses
    git reset -q
    sed -i '/^\/assets\/$/d; /^\/demos\/$/d' .git/info/exclude
    git status --short ;;
  *) echo "usage: tools/device/tree.sh hide|restore"; exit 2 ;;
esac
