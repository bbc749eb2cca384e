#!/usr/bin/env bash
# Copies the header-only dependencies (nlohmann-json, CLI11, Catch2) from this
# machine's Debian packages into .vendor/ (git-ignored), and the cudnn-frontend
# headers from PyPI (scripts/cudnn-frontend.sh, ~3 MB), for the GPU machine,
# whose image has no Debian dev packages. Run here before the device run, then
# carry .vendor with it:  run(command="bash scripts/gpu-check.sh", carry=[".vendor"]).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
rm -rf .vendor
mkdir -p .vendor
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/catch2 .vendor/
bash scripts/cudnn-frontend.sh
echo "gpu-vendor: $(du -sh .vendor | cut -f1) in .vendor (nlohmann, CLI, catch2$([ -d .vendor/cudnn_frontend ] && echo ", cudnn_frontend"))"
