#!/bin/bash
# Harbor verifier: writes 1 to /logs/verifier/reward.txt if the task is done, else 0.
mkdir -p /logs/verifier
if [ "$(tr -d ' \n' < /app/total.txt 2>/dev/null)" = "39.00" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
