/* A fixture for scripts/names.sh's own test (tests/layout/selftest.sh):
 * `twin` again (static, as in a.c), and `shared_proto` only declared there;
 * each program has its own `main`. */
static int
twin(int x,
     int y)
{
    return x + y;
}

int shared_proto(int x)
{
    return x;
}

int main(void)
{
    return twin(0, 1);
}
