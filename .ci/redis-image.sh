#!/bin/sh
# Build a registry-free Redis image from the host's packaged redis-server:
# FROM scratch plus the binary, the ELF interpreter and the shared libraries ldd lists.
# The image is labelled with a digest of those files, and an image of that name and
# digest is kept as it is, so running this again (as `make test` does) costs a moment.
# Usage: .ci/redis-image.sh [image-name]   (default ratebudget-test/redis:local)
set -eu
IMAGE="${1:-ratebudget-test/redis:local}"
LABEL=ratebudget.files-sha256
SRC="$(command -v redis-server)" || { echo "redis-server is not installed (apt-get install redis-server)" >&2; exit 1; }
command -v docker >/dev/null 2>&1 || { echo "docker is not installed: the image is built with docker import (install a Docker engine)" >&2; exit 1; }
ROOT="$(mktemp -d)"
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT/usr/local/bin" "$ROOT/data" "$ROOT/tmp"
# Debian's redis-server is a symlink to redis-check-rdb and Redis picks its mode from
# argv[0]: copy it dereferenced under the name redis-server.
cp -L "$SRC" "$ROOT/usr/local/bin/redis-server"
ldd "$SRC" | grep -o '/[^ ]*' | sort -u | while read -r f; do
	cp -L --parents "$f" "$ROOT/"
done
DIGEST="$(cd "$ROOT" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-64)"
if [ "$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)" = "$DIGEST" ]; then
	echo "$IMAGE is up to date"
	exit 0
fi
if [ "$(id -u)" = 0 ]; then
	chroot "$ROOT" /usr/local/bin/redis-server --version >/dev/null
fi
# protected-mode must be off: port-mapped connections do not come from loopback.
tar -C "$ROOT" -c . | docker import \
	--change 'ENTRYPOINT ["/usr/local/bin/redis-server","--protected-mode","no","--save","","--appendonly","no","--dir","/data"]' \
	--change 'EXPOSE 6379' --change "LABEL $LABEL=$DIGEST" - "$IMAGE" >/dev/null
echo "built $IMAGE"
