#!/bin/sh
# walk.sh BUILD_DIR: a request line's walk through proto/ is a pipeline,
# each file entered from one place.  From the object files of slotd_proto,
# the files whose functions each file calls (functions only: reading ops.c's
# table is no visit; the inline scanner and UTF-8 check of scan_int.h and
# utf8_int.h belong to the file that includes them), followed from the file
# that defines proto_request_parse().  Every file reached must be called
# from one file only, and the entry from none, so no file is entered by two
# stages and none calls back up the walk (docs/design.md, "Parsing a
# request line").  Prints the walk, each file under its caller, and exits 1
# on a break.
#
# walk.sh --edges FILE ENTRY reads "caller callee" lines instead, for its
# own test (tests/layout/selftest.sh).
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "${1:-}" = --edges ]; then
    cp "${2:?usage: walk.sh --edges FILE ENTRY}" "$tmp/edges"
    entry=${3:?usage: walk.sh --edges FILE ENTRY}
else
    dir=${1:?usage: walk.sh BUILD_DIR}/proto/CMakeFiles/slotd_proto.dir
    : >"$tmp/edges"
    entry=
    for o in "$dir"/*.o; do
        f=$(basename "$o" .o)
        nm "$o" | awk '$2 == "T" { print $3 }' | sort -u >"$tmp/$f.def"
        nm "$o" | awk '$1 == "U" { print $2 }' | sort -u >"$tmp/$f.use"
        grep -qx proto_request_parse "$tmp/$f.def" && entry=$f
    done
    [ -n "$entry" ] || { echo "walk.sh: no object defines proto_request_parse"; exit 1; }
    for a in "$tmp"/*.use; do
        fa=$(basename "$a" .use)
        for b in "$tmp"/*.def; do
            fb=$(basename "$b" .def)
            [ "$fa" = "$fb" ] && continue
            [ -n "$(comm -12 "$a" "$b")" ] && echo "$fa $fb" >>"$tmp/edges"
        done
    done
fi
# The files reached from the entry, each printed under its caller; then
# every file reached that more than one reached file calls, or that calls
# the entry.
awk -v entry="$entry" '
{ out[$1] = out[$1] " " $2; n[$1]++ }
function walk(f, depth,    k, list, i) {
    if (seen[f]++) return
    printf "%*s%s\n", 2 * depth, "", f
    k = split(out[f], list, " ")
    for (i = 1; i <= k; i++) walk(list[i], depth + 1)
}
END {
    walk(entry, 0)
    bad = 0
    for (f in out) {
        if (!(f in seen)) continue
        k = split(out[f], list, " ")
        for (i = 1; i <= k; i++) callers[list[i]] = callers[list[i]] " " f
    }
    for (g in callers) {
        if (!(g in seen)) continue
        c = split(callers[g], who, " ")
        if (g == entry || c > 1) {
            printf "%s is entered from%s: the walk goes back and forth\n", g, callers[g]
            bad = 1
        }
    }
    exit bad
}' "$tmp/edges"
