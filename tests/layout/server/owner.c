/* A fixture for scripts/writers.sh's own test (tests/server.cmake): the
 * owner of `count` writes it; not built. */
void owner_bump(struct rec *r)
{
    r->count++;
}
