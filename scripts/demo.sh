#!/usr/bin/env bash
# The main job: sets everything up, then decodes through a Mamba-2 layer in standard and replay modes
# (GPU when there is one, else CPU). Extra arguments go to `python -m replayssm demo`.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
python -m replayssm demo "$@"
