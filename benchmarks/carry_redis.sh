#!/usr/bin/env bash
# Builds .gpu/ (ignored; carry it to the GPU machine, which installs nothing): Debian's redis-server, redis-tools,
# libjemalloc2 and liblzf1 unpacked with dpkg -x into .gpu/redis (redis-server a copy, not a link: the carry drops
# links), and the pure-Python `redis` client unzipped into .gpu/py. The `fleet` and `gpu-tests` steps of h200.sh use
# them. Run on this (CPU) machine: bash benchmarks/carry_redis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '.gpu/' >> .git/info/exclude; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download redis-server redis-tools libjemalloc2 liblzf1 >/dev/null)
rm -rf .gpu/redis .gpu/py && mkdir -p .gpu/redis .gpu/py
for deb in "$tmp"/*.deb; do dpkg -x "$deb" .gpu/redis; done
bin=.gpu/redis/usr/bin
[ -L "$bin/redis-server" ] && cp --remove-destination "$(readlink -f "$bin/redis-server")" "$bin/redis-server"
python3 -m pip download -q --no-deps redis -d "$tmp/whl"
python3 -m zipfile -e "$tmp"/whl/redis-*.whl .gpu/py
LD_LIBRARY_PATH=.gpu/redis/usr/lib/x86_64-linux-gnu "$bin/redis-server" --version
echo "carry_redis: .gpu ready ($(du -sh .gpu | cut -f1)); carry [\".gpu\"]"
