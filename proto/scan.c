/*
 * scan.c: the strict JSON syntax check every request line passes before
 * cJSON reads it (RFC 8259, a bounded depth, no "\u0000", no unpaired
 * surrogate escape), and the copy of a line in which each number literal
 * that is not a plain short integer is replaced by its exact value: the
 * tree path's second stage, after the UTF-8 check.  The scanner it walks
 * the line with is inline in scan_int.h, which the one-pass path (flat.c)
 * uses too, so neither calls the other.  Pure functions of their arguments: any thread, no lock.
 *
 * Design: docs/design.md, "Parsing a request line" (where cJSON is lenient).
 */
#include "proto/scan_int.h"

int proto__scan_line(proto__scan_t *j, slotd_error_t *err)
{
    proto__scan_ws(j);
    if (j->i >= j->n || j->s[j->i] != '{')
        return slotd_error_set(err, SLOTD_EBAD_JSON, "the line is not a JSON object");
    if (proto__scan_value(j, 0) != 0)
        return slotd_error_set(err, SLOTD_EBAD_JSON, "the line is not valid JSON: %s at byte %zu",
                               j->why, j->i);
    proto__scan_ws(j);
    if (j->i != j->n)
        return slotd_error_set(err, SLOTD_EBAD_JSON,
                               "the line is not one JSON object: more follows it at byte %zu",
                               j->i);
    if (j->out != NULL) {
        memcpy(j->out + j->outlen, j->s + j->copied, j->n - j->copied);
        j->outlen += j->n - j->copied;
        j->copied = j->n;
    }
    return SLOTD_OK;
}
