#!/bin/sh
# Start Docker's daemon in the background unless one answers (a machine without systemd, as CI's
# is), then wait until it does. Its log: /tmp/dockerd.log.
docker info >/dev/null 2>&1 && exit 0
nohup dockerd >/tmp/dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "dockerd did not answer within 60 s: $(tail -n 1 /tmp/dockerd.log)" >&2
exit 1
