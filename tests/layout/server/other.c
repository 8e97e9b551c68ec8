/* A fixture for scripts/writers.sh's own test (tests/server.cmake): a file
 * that writes another's field in each way the check must see; not built. */
void other_reads(struct rec *r, struct rec **p)
{
    if (r->count == 0 && r->count != 1 && r->count <= 2) /* reads only */
        return;
    r->count = 1;
    r->count += 2;
    r->count <<= 1;
    --r->count;
    *p = (void *)&r->count;
}
