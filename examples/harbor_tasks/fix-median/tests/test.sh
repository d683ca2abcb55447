#!/bin/bash
# Harbor verifier: writes 1 to /logs/verifier/reward.txt if the task is done, else 0.
mkdir -p /logs/verifier
if python3 - <<'PY'
import sys

sys.path.insert(0, "/app")
from stats import mean, median

assert median([3, 1, 2]) == 2
assert median([4, 1, 3, 2]) == 2.5
assert median([7]) == 7
assert median([1, 2]) == 1.5
assert mean([1, 2, 3]) == 2
PY
then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
