#!/usr/bin/env bash
# Puts the cudnn-frontend C++ headers (NVIDIA's header-only graph API over
# cuDNN 9's backend, Apache-2.0/MIT) into .vendor/cudnn_frontend/include/, where
# CMake looks for them (the CUDA backend's cuDNN attention, exec/cuda/cudnn_attention.cpp).
# They come from the PyPI wheel nvidia-cudnn-frontend, whose include/ holds them;
# only the headers and the licences are kept (about 3 MB). Without network the
# script says so and exits 0: the build then keeps the own attention kernel.
#   bash scripts/cudnn-frontend.sh        # idempotent: nothing to do when the headers are there
set -uo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
dest=.vendor/cudnn_frontend
if [ -e "$dest/include/cudnn_frontend.h" ] && grep -q "MINOR_VERSION $(echo "$version" | cut -d. -f2)$" "$dest/include/cudnn_frontend_version.h" 2>/dev/null; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$version" \
    >"$tmp/pip.log" 2>&1; then
  echo "cudnn-frontend: could not download nvidia-cudnn-frontend==$version (the CUDA backend keeps its own attention):" \
    "$(tail -1 "$tmp/pip.log")" >&2
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$dest" <<'PY'
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        base = os.path.basename(name)
        if name.startswith("include/") and not name.endswith("/"):
            target = os.path.join(dest, name)
        elif base.startswith(("LICENSE", "NOTICE")):
            target = os.path.join(dest, base)
        else:
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(name) as src, open(target, "wb") as out:
            out.write(src.read())
PY
echo "cudnn-frontend: $(du -sh "$dest" | cut -f1) of headers $version in $dest"
