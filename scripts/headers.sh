#!/bin/sh
# headers.sh SRC_DIR: the one internal-header convention.  A header that
# only its own folder may include is named NAME_int.h (no _impl.h,
# __internal.h or _private.h), and no file of the product outside that
# folder includes it; tests/ and bench/ may, to look inside.  Prints each
# break and exits 1 if there is one.
set -eu
cd "${1:?usage: headers.sh SRC_DIR}"
rc=0
for h in $(find core cache proto server -name '*.h' | sort); do
    case $h in
    *_impl.h | *_internal.h | *_private.h | *_priv.h)
        echo "$h: an internal header is named NAME_int.h"
        rc=1
        ;;
    esac
done
for h in $(find core cache proto server -name '*_int.h' | sort); do
    dir=${h%/*}
    base=${h##*/}
    for f in $(grep -rl --include='*.[ch]' "#include \"\(.*/\)\?$base\"" core cache proto server || true); do
        case $f in
        "$dir"/*) ;;
        *)
            echo "$f includes $h, internal to $dir/"
            rc=1
            ;;
        esac
    done
done
exit $rc
