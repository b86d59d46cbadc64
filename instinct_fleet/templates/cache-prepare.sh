#!/bin/sh
# Managed by instinct-fleet (instinct_fleet/templates/cache-prepare.sh): a serving unit's ExecStartPre for the
# compile cache of its image. cache-prepare.sh DIR IMAGE KEEP
#  - DIR holds the caches of one image id (IMAGE_ID): started on another id (a tag moved), it is emptied first;
#  - stale build locks are removed: AITER's FileBaton records pid, host, PID namespace, start time and "flock",
#    and holds a kernel flock for the whole build, released when its process dies; a lock naming a PID namespace
#    no process on this host is in has lost its holder too. The oldest lock (pid and host only) cannot be told
#    alive from a container's other namespace (aiter#5266): it is stale when no running container has DIR
#    mounted, and left alone otherwise;
#  - the KEEP most recently started image directories under DIR's parent stay; older ones go, unless in use.
set -u
dir=$1 image=$2 keep=$3
root=${dir%/*}
in_use() { [ -n "$(docker ps --quiet --filter "volume=$1" 2>/dev/null)" ]; }
mkdir -p "$dir/vllm" "$dir/aiter" "$dir/tunableop" || exit 1
id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) || id=
if [ -n "$id" ] && [ -f "$dir/IMAGE_ID" ] && [ "$(cat "$dir/IMAGE_ID")" != "$id" ] && ! in_use "$dir"; then
    echo "instinct-fleet: $image is now $id; emptying the compile cache built with $(cat "$dir/IMAGE_ID")"
    find "$dir" -mindepth 1 -maxdepth 1 ! -name IMAGE_ID -exec rm -rf {} +
    mkdir -p "$dir/vllm" "$dir/aiter" "$dir/tunableop" || exit 1
fi
if [ -n "$id" ]; then
    printf '%s\n' "$id" > "$dir/IMAGE_ID.tmp" && mv "$dir/IMAGE_ID.tmp" "$dir/IMAGE_ID"  # and its mtime: last started
fi
ns_alive() { for ns in /proc/[0-9]*/ns/pid; do [ "$(readlink "$ns" 2>/dev/null)" = "$1" ] && return 0; done; return 1; }
find "$dir" -type f \( -name lock -o -name '*.lock' \) 2>/dev/null | while read -r lock; do
    namespace=$(sed -n 3p "$lock" 2>/dev/null)
    if [ "$(sed -n 5p "$lock" 2>/dev/null)" = flock ]; then
        flock --nonblock "$lock" true 2>/dev/null || continue  # its builder holds it: alive
    elif [ -n "$namespace" ]; then
        ! ns_alive "$namespace" || continue  # a process of its namespace still runs: maybe its builder
    elif in_use "$dir"; then
        continue  # another unit's container shares this cache and may be building
    fi
    echo "instinct-fleet: removing stale build lock $lock (holder pid $(head -n 1 "$lock" 2>/dev/null), no longer running)"
    rm -f "$lock"
done
ls -1t "$root"/*/IMAGE_ID 2>/dev/null | tail -n "+$((keep + 1))" | while read -r used; do
    old=${used%/IMAGE_ID}
    if [ "$old" != "$dir" ] && ! in_use "$old"; then
        echo "instinct-fleet: removing the compile cache $old (compile_cache_keep $keep)"
        rm -rf "$old"
    fi
done
exit 0
