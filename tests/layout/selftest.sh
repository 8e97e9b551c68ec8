#!/bin/sh
# The layout checks' own test: scripts/callgraph.sh must find the circle
# of three files in circle.edges (and name its three files, not the file
# outside it), and scripts/writers.sh must flag each of the five writes in
# server/other.c (lines 7 to 11) and none of its reads (line 5) nor the
# owner's own write; scripts/names.sh must find the static `twin` defined
# in both files of names/ and nothing else (not `main`, not a name only
# declared in one and defined in the other); scripts/check_doc_refs.py
# must name the two stale references of docrefs/cites.c and no good one;
# scripts/walk.sh must find, in walk.edges, rules entered from two files
# and the entry called back by decode, and not blame `other`, which the
# walk from `request` never reaches; scripts/rooms.sh must find, in
# rooms.calls, the two calls against the rooms' order (sched and cli
# calling the loop) and, in server/, the include reaching up
# (server/sched/up.c) and the header a room does not show (server/down.c),
# and nothing else.
# Run from CTest (tests/server.cmake): selftest.sh REPO.
set -u
repo=${1:?usage: selftest.sh REPO}
here=$repo/tests/layout
fail=0

out=$(sh "$repo/scripts/callgraph.sh" --edges "$here/circle.edges")
rc=$?
circle=$(echo "$out" | sed -n 's/^circle: //p' | tr ' ' '\n' | sort | tr '\n' ' ')
if [ $rc -ne 1 ] || [ "$circle" != "a b c " ]; then
    echo "callgraph.sh: rc $rc, circle '$circle' (want rc 1, 'a b c ')"; echo "$out"; fail=1
fi

out=$(sh "$repo/scripts/writers.sh" --table "$here/writers.table" "$here")
rc=$?
lines=$(echo "$out" | sed -n 's/^count written outside its owner: server\/other\.c:\([0-9]*\):.*/\1/p' | tr '\n' ' ')
if [ $rc -ne 1 ] || [ "$lines" != "7 8 9 10 11 " ] || echo "$out" | grep -q owner.c; then
    echo "writers.sh: rc $rc, lines '$lines' (want rc 1, '7 8 9 10 11 ')"; echo "$out"; fail=1
fi
out=$(sh "$repo/scripts/names.sh" --files "$here/names/a.c" "$here/names/b.c")
rc=$?
names=$(echo "$out" | cut -d: -f1 | tr '\n' ' ')
if [ $rc -ne 1 ] || [ "$names" != "twin " ]; then
    echo "names.sh: rc $rc, names '$names' (want rc 1, 'twin ')"; echo "$out"; fail=1
fi

out=$(python3 "$repo/scripts/check_doc_refs.py" --files "$repo" "$here/docrefs/cites.c")
rc=$?
want='tests/layout/docrefs/cites.c:4: no document docs/nowhere.md
tests/layout/docrefs/cites.c:4: docs/design.md has no section "No such section"'
if [ $rc -ne 1 ] || [ "$out" != "$want" ]; then
    echo "check_doc_refs.py: rc $rc (want 1), said:"; echo "$out"; fail=1
fi

out=$(sh "$repo/scripts/walk.sh" --edges "$here/walk.edges" request)
rc=$?
bad=$(echo "$out" | sed -n 's/^\([a-z]*\) is entered from.*/\1/p' | sort | tr '\n' ' ')
if [ $rc -ne 1 ] || [ "$bad" != "request rules " ]; then
    echo "walk.sh: rc $rc, files '$bad' (want rc 1, 'request rules ')"; echo "$out"; fail=1
fi

out=$(sh "$repo/scripts/rooms.sh" --calls "$here/rooms.calls" "$here")
rc=$?
bad=$(echo "$out" | sed -n 's/^\([a-z]*\) calls \([a-z]*\), which.*/\1>\2/p; s/^\(server\/[a-z/]*\.c\) includes \([a-z/.]*\):.*/\1:\2/p' | tr '\n' ' ')
want='sched>loop cli>loop server/down.c:server/admin/metrics.h server/sched/up.c:server/config.h '
if [ $rc -ne 1 ] || [ "$bad" != "$want" ]; then
    echo "rooms.sh: rc $rc, breaks '$bad' (want rc 1, '$want')"; echo "$out"; fail=1
fi

[ $fail -eq 0 ] && echo "the layout checks find what they must"
exit $fail
