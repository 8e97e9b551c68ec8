#!/bin/sh
# writers.sh SRC_DIR: a record's fields are written only by the files that
# own it (docs/design.md, "server/ layout"); the others call its functions.
# For each row of the table below, every write of the field through a
# pointer (`->field =`, `+=`, `-=`, `++`, `--`, any other compound
# assignment, or its address taken with `&...->field`) in the product's
# C files and headers outside the owner's files is printed, and the exit
# status is 1 if there is one.
#
# writers.sh --table FILE SRC_DIR reads the rows from FILE instead, so that
# the check itself can be tested (tests/server.cmake).
#
# A row: FIELD OWNER_FILE... (paths relative to SRC_DIR).
set -eu
table=
if [ "${1:-}" = --table ]; then
    table=${2:?usage: writers.sh --table FILE SRC_DIR}
    [ -f "$table" ] || { echo "writers.sh: no table $table" >&2; exit 2; }
    table=$(cd "$(dirname "$table")" && pwd)/$(basename "$table")
    shift 2
fi
src=${1:?usage: writers.sh [--table FILE] SRC_DIR}
cd "$src" || exit 2

rows() {
    if [ -n "$table" ]; then
        cat "$table"
    else
        # conn_t's bounds: conn.c and its header (docs/design.md).
        cat <<'EOF'
held_bytes server/conn.c server/conn_int.h
pending_bytes server/conn.c server/conn_int.h
pending_slots server/conn.c server/conn_int.h
reserved server/conn.c server/conn_int.h
park_head server/conn.c server/conn_int.h
park_tail server/conn.c server/conn_int.h
EOF
    fi
}

files=$(find server proto cache core -name '*.[ch]' 2>/dev/null | sort)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rows | while read -r field owners; do
    [ -n "$field" ] || continue
    for f in $files; do
        case " $owners " in *" $f "*) continue ;; esac
        # A write: the field followed by an assignment operator (not ==)
        # or ++/--, or preceded by ++/-- or &.  Comment lines are skipped.
        grep -nE "(->|\.)$field[[:space:]]*(([-+*/%&|^]|<<|>>)?=[^=]|\+\+|--)|(\+\+|--|(^|[^&])&)[[:space:]]*[A-Za-z_][A-Za-z0-9_]*(->|\.)$field\b" "$f" |
            grep -vE "^[0-9]+:[[:space:]]*(/\*|\*([[:space:]/]|$)|//)" | sed "s|^|$field written outside its owner: $f:|" >>"$out" || true
    done
done
if [ -s "$out" ]; then
    cat "$out"
    exit 1
fi
echo "every listed field is written only by its owner"
