#!/usr/bin/env bash
# Where a Docker engine answers: build the image, check it runs as a non-root user from the wheel alone,
# bring docker-compose.yml up, wait until both gateways are healthy, chat once through each, tear down.
set -euo pipefail
cd "$(dirname "$0")/.."
project=lgci$$
compose=(docker-compose -p "$project" -f docker-compose.yml)
cleanup() { "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true; }
trap cleanup EXIT

DOCKER_BUILDKIT=1 docker build -q -t lane-gateway:latest . >/dev/null
uid=$(docker run --rm lane-gateway:latest id -u)
[ "$uid" != 0 ] || { echo "the image runs as root"; exit 1; }
docker run --rm lane-gateway:latest sh -c '! test -e /src && python -c "import gateway,sys; assert \"site-packages\" in gateway.__file__"'

"${compose[@]}" up -d
for service in gateway gateway-2; do
  for _ in $(seq 90); do
    id=$("${compose[@]}" ps -q "$service")
    state=$(docker inspect --format '{{.State.Health.Status}}' "$id" 2>/dev/null || echo starting)
    [ "$state" = healthy ] && break
    sleep 2
  done
  [ "$state" = healthy ] || { "${compose[@]}" logs --tail 50 "$service"; echo "$service is $state"; exit 1; }
done
for port in 8080 8081; do
  curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}' >/dev/null
done
echo "docker: image built (non-root, wheel only), compose up, both gateways healthy and serving"
