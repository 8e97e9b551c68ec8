/* A fixture for scripts/names.sh's own test (tests/layout/selftest.sh):
 * `twin` is defined here and in b.c; not built. */
static int shared_proto(int x);

__attribute__((noinline)) static int twin(int x)
{
    return shared_proto(x);
}

int main(void)
{
    return twin(0);
}
