#!/bin/sh
# rooms.sh BUILD_DIR SRC_DIR: calls between server/'s rooms go one way
# (docs/design.md, "server/ layout").  A room is a folder of server/ with a
# library or program of its own; the loop is server/'s top (slotd_server
# and slotd's main.c).  The table below says which rooms each may call.
# From the object files' symbol tables, every function or object one
# room defines and another names is a call; one not in the table is
# printed.  From the sources, a file that includes a header of another
# room must be allowed to call that room and include its shown header.
# Exits 1 if there is a break.
#
# rooms.sh --calls FILE SRC_DIR reads "caller callee" room lines instead
# of object files, so that the check itself can be tested
# (tests/layout/selftest.sh).
set -eu

# A room: the rooms it may call, then the headers it shows the others.
order() {
    cat <<'EOF'
loop   | sched admin base | -
sched  | -                | sched.h
admin  | base             | admin.h
base   | -                | log.h auth.h
cli    | base             | -
EOF
}
may() { # caller callee: whether the table allows the call
    order | awk -F'|' -v a="$1" -v b="$2" '
        { gsub(/^ +| +$/, "", $1) }
        $1 == a { n = split($2, r, " "); for (i = 1; i <= n; i++) if (r[i] == b) ok = 1 }
        END { exit !ok }'
}
shows() { # room header: whether the room shows that header
    order | awk -F'|' -v a="$1" -v h="$2" '
        { gsub(/^ +| +$/, "", $1) }
        $1 == a { n = split($3, r, " "); for (i = 1; i <= n; i++) if (r[i] == h) ok = 1 }
        END { exit !ok }'
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
if [ "${1:-}" = --calls ]; then
    cp "${2:?usage: rooms.sh --calls FILE SRC_DIR}" "$tmp/calls"
    src=${3:?usage: rooms.sh --calls FILE SRC_DIR}
else
    build=${1:?usage: rooms.sh BUILD_DIR SRC_DIR}
    src=${2:?usage: rooms.sh BUILD_DIR SRC_DIR}
    # The rooms' libraries (an archive holds what the library is built of
    # now, where a folder of objects may keep those of a moved file), and
    # the two programs' own objects.
    for o in "$build"/server/libslotd_server.a "$build"/server/*/libslotd_*.a \
        "$build"/server/CMakeFiles/slotd.dir/*.o "$build"/server/*/CMakeFiles/*.dir/*.o; do
        [ -e "$o" ] || continue
        case $o in
        */CMakeFiles/slotd_*) continue ;; # a library's objects: read in its archive
        "$build"/server/libslotd_server.a | "$build"/server/CMakeFiles/*) room=loop ;;
        *) room=${o#"$build"/server/}; room=${room%%/*} ;;
        esac
        nm "$o" | awk '$2 ~ /^[TDRB]$/ { print $3 }' >>"$tmp/$room.def"
        nm "$o" | awk '$1 == "U" { print $2 }' >>"$tmp/$room.use"
    done
    [ -s "$tmp/loop.def" ] || { echo "rooms.sh: no object files under $build/server" >&2; exit 2; }
    : >"$tmp/calls"
    for d in "$tmp"/*.def; do
        b=$(basename "$d" .def)
        sort -u "$d" -o "$d"
        for u in "$tmp"/*.use; do
            a=$(basename "$u" .use)
            [ "$a" = "$b" ] && continue
            names=$(sort -u "$u" | comm -12 "$d" - | tr '\n' ' ')
            [ -n "$names" ] && echo "$a $b $names" >>"$tmp/calls"
        done
    done
fi
while read -r a b names; do
    [ -n "$a" ] || continue
    if may "$a" "$b"; then
        echo "$a -> $b: $names"
    else
        echo "$a calls $b, which it may not: $names"
        bad=1
    fi
done <"$tmp/calls"

# The includes: "server/ROOM/NAME.h" from another room, or a header of
# server/'s top (the loop's) from a room's folder.
cd "$src"
for f in $(find server -name '*.[ch]' | sort); do
    case $f in
    server/*/*) from=${f#server/}; from=${from%%/*} ;;
    *) from=loop ;;
    esac
    grep -o '#include "server/[^"]*"' "$f" | sed 's/#include "server\///; s/"$//' | while read -r inc; do
        case $inc in
        */*) to=${inc%%/*}; hdr=${inc#*/} ;;
        *) to=loop; hdr=$inc ;;
        esac
        [ "$to" = "$from" ] && continue
        if ! may "$from" "$to"; then
            echo "$f includes server/$inc: $from may not call $to"
            echo x >>"$tmp/badinc"
        elif ! shows "$to" "$hdr"; then
            echo "$f includes server/$inc: $to shows the others only $(order | awk -F'|' -v a="$to" '{ gsub(/^ +| +$/, "", $1); gsub(/^ +| +$/, "", $3) } $1 == a { print $3 }')"
            echo x >>"$tmp/badinc"
        fi
    done
done
[ -s "$tmp/badinc" ] && bad=1
[ $bad -eq 0 ] && echo "calls between the rooms go one way"
exit $bad
