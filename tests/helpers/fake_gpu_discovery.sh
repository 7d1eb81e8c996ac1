#!/usr/bin/env bash
# Fake GPU discovery for Spark (no GPU exists on CI). Each call hands out the next index,
# so the two workers of local-cluster[2,1,1024] own different "GPUs" as on a real cluster.
counter="${HVDRUNNER_FAKE_GPU_COUNTER:?set HVDRUNNER_FAKE_GPU_COUNTER to a file path}"
exec 9>>"$counter.lock"
flock 9
n=$(cat "$counter" 2>/dev/null || echo 0)
echo $((n + 1)) > "$counter"
echo "{\"name\": \"gpu\", \"addresses\": [\"$n\"]}"
