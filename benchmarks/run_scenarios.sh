#!/usr/bin/env bash
# Full-size acceptance scenarios: the default policy, two reference presets and round-robin,
# 5 seeds each. Writes benchmarks/results/scenarios/{scenarios.json,scenarios.md,table.txt}.
# Takes a few minutes on 2 cores; pass JOBS=N to use more processes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/scenarios
mkdir -p "$out"
fleetwise scenarios --seeds 5 --jobs "${JOBS:-2}" \
  --policy fleetwise-default --policy prefix-affinity --policy least-outstanding \
  --no-fail --out "$out" | tee "$out/table.txt"
