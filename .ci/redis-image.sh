#!/bin/sh
# Build a registry-free Redis image from the host's packaged redis-server:
# FROM scratch plus the binary, the ELF interpreter and the shared libraries ldd lists.
# Usage: .ci/redis-image.sh [image-name]   (default ratebudget-test/redis:local)
set -eu
IMAGE="${1:-ratebudget-test/redis:local}"
SRC="$(command -v redis-server)"
ROOT="$(mktemp -d)"
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT/usr/local/bin" "$ROOT/data" "$ROOT/tmp"
# Debian's redis-server is a symlink to redis-check-rdb and Redis picks its mode from
# argv[0]: copy it dereferenced under the name redis-server.
cp -L "$SRC" "$ROOT/usr/local/bin/redis-server"
ldd "$SRC" | grep -o '/[^ ]*' | sort -u | while read -r f; do
	cp -L --parents "$f" "$ROOT/"
done
if [ "$(id -u)" = 0 ]; then
	chroot "$ROOT" /usr/local/bin/redis-server --version >/dev/null
fi
# protected-mode must be off: port-mapped connections do not come from loopback.
tar -C "$ROOT" -c . | docker import \
	--change 'ENTRYPOINT ["/usr/local/bin/redis-server","--protected-mode","no","--save","","--appendonly","no","--dir","/data"]' \
	--change 'EXPOSE 6379' - "$IMAGE" >/dev/null
echo "built $IMAGE"
