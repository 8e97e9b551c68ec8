#!/bin/sh
# names.sh SRC_DIR: no two functions of the product (core/, cache/,
# proto/, server/, headers included) share a name, static or not, so that
# a name found in one file means one function.  Read from the sources, one
# definition per function: a declaration that begins at column 0 and is
# followed by a `{` at column 0 (the house style's shape); `main`, one per
# program (slotd, slotd-cli), is not counted.  Prints each
# name defined in more than one file, with the files, and exits 1 if there
# is one.
#
# names.sh --files FILE... checks those files instead (its own test,
# tests/layout/selftest.sh).
set -eu
if [ "${1:-}" = --files ]; then
    shift
    files=$*
else
    cd "${1:?usage: names.sh SRC_DIR}"
    files=$(find core cache proto server -name '*.[ch]' | sort)
fi
# shellcheck disable=SC2086
awk '
FNR == 1 { decl = "" }
/^[A-Za-z_]/ && !/^(typedef|struct|union|enum|extern|#)/ && !/;[ \t]*$/ && decl == "" { decl = $0; next }
decl != "" {
    if ($0 ~ /^\{/) {
        d = decl
        gsub(/__attribute__ *\(\([^)]*\)\)/, "", d)
        if (match(d, /[A-Za-z_][A-Za-z0-9_]*[ ]*\(/)) {
            name = substr(d, RSTART, RLENGTH)
            sub(/[ ]*\($/, "", name)
            if (!((name, FILENAME) in seen)) {
                seen[name, FILENAME] = 1
                where[name] = where[name] " " FILENAME
                n[name]++
            }
        }
        decl = ""
    } else if ($0 ~ /;[ \t]*$/ || $0 ~ /^$/ || $0 ~ /^#/) {
        decl = ""
    } else {
        decl = decl " " $0
    }
    next
}
{ if ($0 ~ /;[ \t]*$/) decl = "" }
END {
    bad = 0
    for (k in n) if (n[k] > 1 && k != "main") { print k ":" where[k]; bad++ }
    if (bad == 0) print "no two functions share a name"
    exit bad > 0
}' $files
