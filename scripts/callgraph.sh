#!/bin/sh
# callgraph.sh BUILD_DIR [MODULE]: for each pair of object files of one
# module's library (server by default), the functions defined in one and
# named in the other, from the symbol tables; and every pair that names
# each other both ways, which the module's layout forbids (docs/design.md,
# "server/ layout").  Exits 1 if there is such a pair.
set -eu
build=${1:?usage: callgraph.sh BUILD_DIR [MODULE]}
mod=${2:-server}
dir=$build/$mod/CMakeFiles/slotd_$mod.dir
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in "$dir"/*.o; do
    f=$(basename "$o" .c.o)
    nm "$o" | awk '$2 ~ /^[TDRB]$/ { print $3 }' | sort -u >"$tmp/$f.def"
    nm "$o" | awk '$1 == "U" { print $2 }' | sort -u >"$tmp/$f.use"
done
bad=0
for a in "$tmp"/*.def; do
    fa=$(basename "$a" .def)
    for b in "$tmp"/*.use; do
        fb=$(basename "$b" .use)
        [ "$fa" = "$fb" ] && continue
        names=$(comm -12 "$a" "$b" | tr '\n' ' ')
        [ -n "$names" ] && echo "$fb -> $fa: $names" >>"$tmp/edges"
    done
done
[ -f "$tmp/edges" ] && sort "$tmp/edges"
echo "--- pairs calling each other both ways:"
if [ -f "$tmp/edges" ]; then
    awk '{ split($0, p, ":"); e[p[1]] = 1 } END {
        for (k in e) { split(k, x, " -> "); r = x[2] " -> " x[1];
            if ((r in e) && x[1] < x[2]) { print x[1] " <-> " x[2]; n++ } }
        exit n > 0 }' "$tmp/edges" || bad=1
fi
[ $bad -eq 0 ] && echo "none"
exit $bad
