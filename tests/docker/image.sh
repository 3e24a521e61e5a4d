#!/bin/sh
# image.sh build|remove FIBER_TOOL PROGRAM TAG
#
# The ctest fixtures of the docker re-runs (tests/CMakeLists.txt):
#   build   makes TAG of PROGRAM with `fiber image build` (no registry);
#   remove  removes TAG again through the Engine API (DELETE /images/TAG),
#           with curl, else the docker command; an image already gone is
#           not an error.
# Where the engine's socket is absent both are skipped (exit 77; a failure
# under CI, see tests/skip.sh), and so are the cases that need the image.
set -u
. "$(dirname "$0")/../skip.sh"
sock=${FIBER_DOCKER_SOCKET:-/var/run/docker.sock}
[ -S "$sock" ] || skip_engine "$sock is absent: no Docker engine on this machine"
what=$1 tool=$2 program=$3 tag=$4
case $what in
build)
    exec "$tool" image build "$program" --tag "$tag"
    ;;
remove)
    # Containers of the re-runs end with their masters (AutoRemove), so
    # none pins the image; force anyway, in case a case was killed.
    if command -v curl >/dev/null 2>&1; then
        code=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$sock" \
                    -X DELETE "http://localhost/images/$tag?force=1")
        case $code in
        200 | 404) echo "removed $tag (HTTP $code)"; exit 0 ;;
        *) echo "cannot remove image $tag: HTTP $code" >&2; exit 1 ;;
        esac
    elif command -v docker >/dev/null 2>&1; then
        docker -H "unix://$sock" image rm -f "$tag" >/dev/null 2>&1 || true
        echo "removed $tag"
        exit 0
    fi
    echo "cannot remove image $tag: neither curl nor docker is installed" >&2
    exit 1
    ;;
esac
echo "usage: image.sh build|remove FIBER_TOOL PROGRAM TAG" >&2
exit 2
