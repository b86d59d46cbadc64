#!/bin/sh
# Managed by instinct-fleet (instinct_fleet/templates/cache-spread.sh): an image's compile cache copied from the host
# that built it to the hosts that restart later in the roll (instinct_fleet/fleet/spread.py carries it between them).
#   cache-spread.sh pack DIR OUT
#     writes OUT: a tar of DIR's caches, build locks left out; prints "id <image id>", "sha256 <sum>", "bytes <size>".
#     A cache that changes while it is read (a build still writing) is not packed: exit 3, why on stderr.
#   cache-spread.sh receive DIR IMAGE KEEP BUNDLE SHA256
#     refuses (exit 3, why on stderr) a BUNDLE whose sha256 is not SHA256 (a partial or damaged copy) or that was
#     built with another image id than IMAGE's here; else readies DIR as a unit's start does (cache-prepare.sh beside
#     this script: its image id, stale locks, pruning to KEEP), unpacks beside it, and moves in each entry DIR lacks
#     with one rename, so that nothing reads a half-copied entry; an entry DIR has is left as it is.
#     Prints "moved <entries>". BUNDLE is removed either way.
set -u
case ${1:-} in
pack)
    dir=$2 out=$3
    [ -s "$dir/IMAGE_ID" ] || { echo "no unit has started on $dir yet (no IMAGE_ID): nothing to pack" >&2; exit 3; }
    mkdir -p "${out%/*}" || exit 1
    members=$(cd "$dir" && ls -d IMAGE_ID vllm aiter tunableop 2>/dev/null)
    # shellcheck disable=SC2086  # the member names are fixed words
    if ! tar -C "$dir" --exclude=lock --exclude='*.lock' -cf "$out.part" $members 2>"$out.err"; then
        echo "not packed: the cache changed while it was read (a build still writing?): $(tail -n 1 "$out.err")" >&2
        rm -f "$out.part" "$out.err"
        exit 3
    fi
    rm -f "$out.err"
    mv "$out.part" "$out" || exit 1
    echo "id $(cat "$dir/IMAGE_ID")"
    echo "sha256 $(sha256sum "$out" | cut -d ' ' -f 1)"
    echo "bytes $(wc -c < "$out")"
    ;;
receive)
    dir=$2 image=$3 keep=$4 bundle=$5 want=$6
    stage="$bundle.d"
    trap 'rm -rf "$stage" "$bundle"' EXIT
    got=$(sha256sum "$bundle" 2>/dev/null | cut -d ' ' -f 1)
    if [ "$got" != "$want" ]; then
        echo "refused: the copy's sha256 is ${got:-missing}, the source's ${want} (a partial or damaged copy)" >&2
        exit 3
    fi
    rm -rf "$stage" && mkdir -p "$stage" || exit 1
    tar -C "$stage" -xf "$bundle" || { echo "refused: the copy does not unpack" >&2; exit 3; }
    built=$(cat "$stage/IMAGE_ID" 2>/dev/null)
    id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) || id=
    if [ -z "$id" ] || [ "$built" != "$id" ]; then
        echo "refused: built with image ${built:-unknown}, and $image is ${id:-not present} here" >&2
        exit 3
    fi
    sh "${0%/*}/cache-prepare.sh" "$dir" "$image" "$keep" >&2 || exit 1
    rm -f "$stage/IMAGE_ID"
    moved=0
    merge() {  # merge $1 into $2: what $2 lacks moves in whole (one rename); a directory both have is merged
        local entry name
        for entry in "$1"/* "$1"/.[!.]*; do
            [ -e "$entry" ] || continue
            name=${entry##*/}
            if [ ! -e "$2/$name" ]; then
                mv -T "$entry" "$2/$name" && moved=$((moved + 1))
            elif [ -d "$entry" ] && [ -d "$2/$name" ] && [ ! -L "$2/$name" ]; then
                merge "$entry" "$2/$name"
            fi
        done
    }
    merge "$stage" "$dir"
    echo "moved $moved"
    ;;
*)
    echo "usage: cache-spread.sh pack DIR OUT | receive DIR IMAGE KEEP BUNDLE SHA256" >&2
    exit 2
    ;;
esac
