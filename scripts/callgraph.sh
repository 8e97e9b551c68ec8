#!/bin/sh
# callgraph.sh BUILD_DIR [MODULE]: for each pair of object files of one
# module's libraries (server by default, with its rooms' libraries:
# slotd_admin, ...), the functions defined in one and named in the other,
# from the symbol tables; then every circle among the
# files, of any length (a -> b -> c -> a as well as a <-> b), which the
# module's layout forbids (docs/design.md, "server/ layout").  Exits 1 if
# there is a circle.
#
# callgraph.sh --edges FILE reads "caller callee" lines instead of object
# files, so that the circle finder itself can be tested (tests/server.cmake).
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/pairs"
if [ "${1:-}" = --edges ]; then
    cp "${2:?usage: callgraph.sh --edges FILE}" "$tmp/pairs"
else
    build=${1:?usage: callgraph.sh BUILD_DIR [MODULE]}
    mod=${2:-server}
    # The module's library and those of its rooms (server/admin/, ...).
    for o in "$build/$mod"/CMakeFiles/slotd_"$mod".dir/*.o "$build/$mod"/*/CMakeFiles/slotd_*.dir/*.o; do
        [ -e "$o" ] || continue
        f=$(basename "$o" .c.o)
        nm "$o" | awk '$2 ~ /^[TDRB]$/ { print $3 }' | sort -u >"$tmp/$f.def"
        nm "$o" | awk '$1 == "U" { print $2 }' | sort -u >"$tmp/$f.use"
    done
    for a in "$tmp"/*.def; do
        fa=$(basename "$a" .def)
        for b in "$tmp"/*.use; do
            fb=$(basename "$b" .use)
            [ "$fa" = "$fb" ] && continue
            names=$(comm -12 "$a" "$b" | tr '\n' ' ')
            if [ -n "$names" ]; then
                echo "$fb -> $fa: $names"
                echo "$fb $fa" >>"$tmp/pairs"
            fi
        done
    done | sort
fi

# Circles: the strongly connected components of the file graph with more
# than one file (Tarjan's algorithm; a file never calls itself here).
echo "--- circles among the files (each a set of files reaching each other):"
awk '
function visit(v,   i, w) {
    index_of[v] = idx; low[v] = idx; idx++
    stack[++sp] = v; on[v] = 1
    for (i = 1; i <= nout[v]; i++) {
        w = out[v, i]
        if (!(w in index_of)) {
            visit(w)
            if (low[w] < low[v]) low[v] = low[w]
        } else if (on[w] && index_of[w] < low[v]) {
            low[v] = index_of[w]
        }
    }
    if (low[v] == index_of[v]) {
        n = 0; comp = ""
        do { w = stack[sp--]; on[w] = 0; comp = comp " " w; n++ } while (w != v)
        if (n > 1) { print "circle:" comp; bad++ }
    }
}
NF == 2 { if (!(($1, $2) in seen)) { seen[$1, $2] = 1; out[$1, ++nout[$1]] = $2 }
          node[$1] = 1; node[$2] = 1 }
END {
    idx = 0; sp = 0; bad = 0
    for (v in node) if (!(v in index_of)) visit(v)
    if (bad == 0) print "none"
    exit bad > 0
}' "$tmp/pairs"
