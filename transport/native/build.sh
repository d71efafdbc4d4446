#!/bin/sh
# Builds the native transport (transport/native/*.c) into
# prebuilds/linux-x64/nyala.node at the package root (or into the folder
# NYALA_NATIVE_OUT names: the sanitizer build of .ci/run), where
# transport/native/load.ts looks first. N-API only: one build loads in
# every Node >= 18. Headers: NODE_INCLUDE (node_api.h and uv.h), else the
# running node's own include/node, else /usr/include/node, else the
# node-api-headers package with /usr/include/uv.h. liburing is
# linked statically (Debian's liburing-dev). Exits 0 without building when
# `--if-possible` is given and there is no compiler, headers or liburing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${NYALA_NATIVE_OUT:-$root/prebuilds/linux-x64}
cc=${CC:-gcc}
node_prefix=$(dirname "$(dirname "$(command -v node)")")
include=${NODE_INCLUDE:-}
[ -z "$include" ] && [ -f "$node_prefix/include/node/uv.h" ] && include="$node_prefix/include/node"
[ -z "$include" ] && [ -f /usr/include/node/uv.h ] && include=/usr/include/node
# Else node_api.h from the node-api-headers package (npm) and uv.h from libuv's own headers in /usr/include (libuv1-dev; libuv 1.x keeps its ABI).
[ -z "$include" ] && [ -f /usr/include/uv.h ] && napi=$(cd "$root" && node -p "require('node-api-headers').include_dir" 2>/dev/null) && [ -f "$napi/node_api.h" ] && include="$napi"
uring=${LIBURING_A:-/usr/lib/x86_64-linux-gnu/liburing.a}
missing=""
command -v "$cc" >/dev/null 2>&1 || missing="a C compiler ($cc)"
[ -n "$include" ] || missing="${missing:+$missing, }node_api.h and uv.h (set NODE_INCLUDE, or install node-api-headers and libuv1-dev)"
[ -f "$uring" ] || missing="${missing:+$missing, }liburing.a (liburing-dev; or set LIBURING_A)"
if [ -n "$missing" ]; then
  if [ "${1:-}" = "--if-possible" ]; then echo "native transport not built: no $missing (node:net is used)"; exit 0; fi
  echo "cannot build the native transport: no $missing" >&2
  exit 1
fi
mkdir -p "$out"
# -fvisibility=hidden: only the module's init is exported; -Wl,-z,defs is not
# used, N-API and libuv symbols come from the node binary at load time.
if ! $cc -shared -fPIC -O2 -g -Wall -Wextra -Werror -std=gnu11 -fvisibility=hidden ${CFLAGS:-} \
  -I "$include" -o "$out/nyala.node.tmp" \
  "$here/addon.c" "$here/send.c" "$here/connections.c" "$here/epoll.c" "$here/uring.c" "$here/heap.c" "$uring"; then
  rm -f "$out/nyala.node.tmp"
  if [ "${1:-}" = "--if-possible" ]; then echo "native transport not built: the compile failed (node:net is used)"; exit 0; fi
  exit 1
fi
mv "$out/nyala.node.tmp" "$out/nyala.node"
echo "built $out/nyala.node"
