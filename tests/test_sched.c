/*
 * test_sched.c: the worker queue's policy alone
 * (server/sched/sched_int.h), with synthetic flows and costs: backlogged flows get equal shares of cost
 * whatever their jobs cost, within 10 % over long runs and within the
 * fairness bound of start-time fair queuing at every step; no flow
 * starves, a flow of huge jobs among many of cheap ones included; a flow
 * that was idle banks no credit; ties go to the flow activated first;
 * weighted flows (a tenant's) get cost in proportion to their weights.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "server/sched/sched_int.h"

#define MAXF 16

/* A synthetic flow: its jobs' costs come from `cost` (fixed, or random
 * below it), and it has `left` jobs queued (-1: always backlogged). */
typedef struct flow {
    sched_flow_t f;
    uint64_t cost;
    bool random;
    long left;
    uint64_t jobs; /* jobs served */
} flow_t;

static uint64_t rng = 88172645463325252ull;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint64_t job_cost(const flow_t *fl)
{
    return fl->random ? 1 + next_rand() % fl->cost : fl->cost;
}

/* Serves one job; returns the flow served. */
static flow_t *serve_one(sched_t *s)
{
    sched_flow_t *sf = sched_peek(s);
    flow_t *fl;

    if (sf == NULL) /* (ck_assert marks each pass: slow in this loop) */
        ck_abort_msg("no flow to serve");
    fl = (flow_t *)sf;
    if (fl->left > 0)
        fl->left--;
    fl->jobs++;
    sched_serve(s, job_cost(fl), fl->left != 0);
    return fl;
}

static void flows_init(sched_t *s, flow_t *fl, size_t n)
{
    sched_init(s);
    for (size_t i = 0; i < n; i++) {
        sched_flow_init(&fl[i].f);
        fl[i].left = -1;
        fl[i].jobs = 0;
        fl[i].random = false;
    }
}

/* Flows whose jobs cost 1, 10, 100 and 1000 units, always backlogged: each
 * gets a quarter of the service, within 10 %, and at every step any two
 * differ by no more than the largest jobs of both (SFQ's bound). */
START_TEST(test_equal_shares)
{
    sched_t s;
    flow_t fl[4];
    uint64_t total = 0, maxc = 0;

    flows_init(&s, fl, 4);
    for (int i = 0; i < 4; i++) {
        fl[i].cost = i == 0 ? 1 : i == 1 ? 10 : i == 2 ? 100 : 1000;
        fl[i].random = _i == 1;
        sched_activate(&s, &fl[i].f);
    }
    for (long k = 0; k < 400000; k++) {
        serve_one(&s);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                uint64_t a = sched_served(&fl[i].f), b = sched_served(&fl[j].f);
                /* Check marks every assertion it passes: test, then fail. */
                if (a > b && a - b > fl[i].cost + fl[j].cost)
                    ck_abort_msg("flow %d served %llu, flow %d %llu", i, (unsigned long long)a, j,
                                 (unsigned long long)b);
            }
    }
    for (int i = 0; i < 4; i++) {
        total += sched_served(&fl[i].f);
        if (fl[i].cost > maxc)
            maxc = fl[i].cost;
    }
    for (int i = 0; i < 4; i++) {
        double share = (double)sched_served(&fl[i].f) / (double)total;
        ck_assert_msg(share > 0.25 * 0.9 && share < 0.25 * 1.1, "flow %d: share %.4f", i, share);
    }
    ck_assert_uint_eq(sched_active(&s), 4);
}
END_TEST

/* Backlogged flows of weights 3, 1 and 6: served cost in
 * proportion to the weights within 2 %, whatever their jobs cost; weights
 * changed midway (1, 1 and 1000) apply from then on. */
START_TEST(test_weighted_shares)
{
    sched_t s;
    flow_t fl[3];
    static const uint32_t w[3] = {3, 1, 6};
    uint64_t base[3], total = 0;

    flows_init(&s, fl, 3);
    for (int i = 0; i < 3; i++) {
        fl[i].cost = i == 0 ? 7 : i == 1 ? 1000 : 33;
        fl[i].random = true;
        sched_flow_set_weight(&fl[i].f, w[i]);
        sched_activate(&s, &fl[i].f);
    }
    for (long k = 0; k < 300000; k++)
        serve_one(&s);
    for (int i = 0; i < 3; i++)
        total += sched_served(&fl[i].f);
    for (int i = 0; i < 3; i++) {
        double share = (double)sched_served(&fl[i].f) / (double)total, want = w[i] / 10.0;
        ck_assert_msg(share > want * 0.98 && share < want * 1.02, "flow %d (weight %u): share %.4f",
                      i, w[i], share);
    }
    /* Weights 1 : 1 : 1000 from now on. */
    sched_flow_set_weight(&fl[0].f, 1);
    sched_flow_set_weight(&fl[2].f, 1000);
    for (int i = 0; i < 3; i++)
        base[i] = sched_served(&fl[i].f);
    for (long k = 0; k < 300000; k++)
        serve_one(&s);
    total = 0;
    for (int i = 0; i < 3; i++)
        total += sched_served(&fl[i].f) - base[i];
    double heavy = (double)(sched_served(&fl[2].f) - base[2]) / (double)total;
    ck_assert_msg(heavy > 0.99, "weight 1000 against 1 and 1: share %.4f", heavy);
    ck_assert_msg(sched_served(&fl[0].f) - base[0] > 0, "weight 1 starved");
    /* Equal weights 1 and 1 give equal shares between the other two. */
    double a = (double)(sched_served(&fl[0].f) - base[0]),
           b = (double)(sched_served(&fl[1].f) - base[1]);
    ck_assert_msg(a / b > 0.8 && a / b < 1.25, "weights 1 and 1: %.0f against %.0f", a, b);
}
END_TEST

/* One flow of jobs a thousand times dearer than those of fifteen others:
 * it is served, regularly, and every cheap flow as often as the others. */
START_TEST(test_no_starvation)
{
    sched_t s;
    flow_t fl[MAXF];
    uint64_t last_big = 0, served = 0;

    flows_init(&s, fl, MAXF);
    for (int i = 0; i < MAXF; i++) {
        fl[i].cost = i == 0 ? 1000 : 1;
        sched_activate(&s, &fl[i].f);
    }
    for (long k = 0; k < 200000; k++) {
        flow_t *f = serve_one(&s);
        served++;
        if (f == &fl[0]) {
            /* Fifteen flows of cost 1 fill its 1000 units between two of
             * its jobs: 15,000 jobs, and never many more. */
            if (served - last_big > 15u * 1000u + 16u)
                ck_abort_msg("%llu jobs between two of the big flow's",
                             (unsigned long long)(served - last_big));
            last_big = served;
        }
    }
    ck_assert_uint_ge(fl[0].jobs, 200000 / 15001);
    for (int i = 1; i < MAXF; i++)
        ck_assert_uint_ge(fl[i].jobs, (200000 - fl[0].jobs) / (MAXF - 1) - 1);
}
END_TEST

/* Flow A runs alone for a long time while B is idle; when B becomes
 * active it does not get the service A had to itself: from then on the
 * two share equally, to within one job. */
START_TEST(test_idle_banks_no_credit)
{
    sched_t s;
    flow_t fl[2];
    uint64_t a0, b0;

    flows_init(&s, fl, 2);
    fl[0].cost = fl[1].cost = 7;
    sched_activate(&s, &fl[0].f);
    for (int k = 0; k < 100000; k++)
        serve_one(&s);
    ck_assert_uint_eq(sched_served(&fl[1].f), 0);
    a0 = sched_served(&fl[0].f);
    b0 = sched_served(&fl[1].f);
    sched_activate(&s, &fl[1].f);
    for (int k = 0; k < 1000; k++) {
        uint64_t a, b;
        serve_one(&s);
        a = sched_served(&fl[0].f) - a0;
        b = sched_served(&fl[1].f) - b0;
        if ((a > b ? a - b : b - a) > 14)
            ck_abort_msg("after %d: A %llu, B %llu", k, (unsigned long long)a,
                         (unsigned long long)b);
    }

    /* B goes idle (its last job served), A runs on; B comes back with one
     * job: it is served next, once, then they alternate again. */
    fl[1].left = 1;
    while (sched_flow_active(&fl[1].f))
        serve_one(&s);
    for (int k = 0; k < 5000; k++)
        serve_one(&s);
    fl[1].left = 3;
    sched_activate(&s, &fl[1].f);
    ck_assert_ptr_eq(serve_one(&s), &fl[1]);
    ck_assert_ptr_eq(serve_one(&s), &fl[0]);
    ck_assert_ptr_eq(serve_one(&s), &fl[1]);
}
END_TEST

/* A flow served more than its share just before it went idle keeps that
 * debt when it comes back (its finish is later than the virtual time). */
START_TEST(test_debt_kept)
{
    sched_t s;
    flow_t fl[2];

    flows_init(&s, fl, 2);
    fl[0].cost = 1000;
    fl[1].cost = 1;
    fl[0].left = 1;
    sched_activate(&s, &fl[0].f);
    sched_activate(&s, &fl[1].f);
    ck_assert_ptr_eq(serve_one(&s), &fl[0]); /* 1000 units at once; then idle */
    ck_assert(!sched_flow_active(&fl[0].f));
    fl[0].left = -1;
    sched_activate(&s, &fl[0].f);
    /* B catches up (about 1000 jobs of 1) before A is served again. */
    for (int k = 0; k < 990; k++)
        ck_assert_ptr_eq(serve_one(&s), &fl[1]);
}
END_TEST

/* Flows activated at the same virtual time are served in activation
 * order; pop and put back keep a flow's place. */
START_TEST(test_ties_and_put_back)
{
    sched_t s;
    flow_t fl[5];
    sched_flow_t *p, *q;

    flows_init(&s, fl, 5);
    for (int i = 0; i < 5; i++) {
        fl[i].cost = 10;
        fl[i].left = 1;
        sched_activate(&s, &fl[i].f);
    }
    p = sched_pop(&s);
    q = sched_pop(&s);
    ck_assert_ptr_eq(p, &fl[0].f);
    ck_assert_ptr_eq(q, &fl[1].f);
    ck_assert_uint_eq(sched_active(&s), 3);
    sched_put_back(&s, q);
    sched_put_back(&s, p);
    for (int i = 0; i < 5; i++)
        ck_assert_ptr_eq(serve_one(&s), &fl[i]);
    ck_assert_ptr_null(sched_peek(&s));
    ck_assert_uint_eq(sched_active(&s), 0);
}
END_TEST

/* Flows that come and go at random, with random costs: at every step the
 * flow served has the least start, and among the flows backlogged
 * throughout a window, shares stay within 10 % of equal. */
START_TEST(test_random_churn)
{
    sched_t s;
    flow_t fl[MAXF];
    uint64_t base[MAXF];

    flows_init(&s, fl, MAXF);
    for (int i = 0; i < MAXF; i++) {
        fl[i].cost = 1 + next_rand() % 500;
        fl[i].random = true;
        fl[i].left = i < 4 ? -1 : 0; /* four always backlogged */
        if (fl[i].left != 0)
            sched_activate(&s, &fl[i].f);
    }
    for (int i = 0; i < 4; i++)
        base[i] = sched_served(&fl[i].f);
    for (long k = 0; k < 300000; k++) {
        int j = 4 + (int)(next_rand() % (MAXF - 4));
        if (!sched_flow_active(&fl[j].f) && next_rand() % 4 == 0) {
            fl[j].left = 1 + (long)(next_rand() % 20);
            sched_activate(&s, &fl[j].f);
        }
        {
            const sched_flow_t *least = sched_peek(&s);
            for (int i = 0; i < MAXF; i++)
                if (sched_flow_active(&fl[i].f) && fl[i].f._start < least->_start)
                    ck_abort_msg("flow %d starts before the one served", i);
        }
        serve_one(&s);
    }
    {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < 4; i++) {
            uint64_t v = sched_served(&fl[i].f) - base[i];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        ck_assert_msg((double)hi <= (double)lo * 1.1, "backlogged shares %llu .. %llu",
                      (unsigned long long)lo, (unsigned long long)hi);
    }
}
END_TEST

/* Many clients with one request at a time (the spread sessions of a
 * load generator): each flow comes back as soon as it is served, so the
 * flows mostly return in order and skip the heap (sched.c).  At every step
 * the flow served has the least start of all; with equal costs the flows
 * take turns, each once per round; with random costs (returning out of
 * order, through the heap) the service stays within 10 % of equal. */
#define RR_FLOWS 64
START_TEST(test_one_at_a_time)
{
    static flow_t fl[RR_FLOWS];
    sched_t s;
    uint64_t lo = UINT64_MAX, hi = 0;

    flows_init(&s, fl, RR_FLOWS);
    for (int i = 0; i < RR_FLOWS; i++) {
        fl[i].cost = 100;
        fl[i].random = _i == 1;
        fl[i].left = 1;
        sched_activate(&s, &fl[i].f);
    }
    for (long k = 0; k < 200000; k++) {
        const sched_flow_t *least = sched_peek(&s);
        flow_t *served;
        for (int i = 0; i < RR_FLOWS; i++)
            if (sched_flow_active(&fl[i].f) && fl[i].f._start < least->_start)
                ck_abort_msg("flow %d starts before the one served", i);
        served = serve_one(&s);
        if (_i == 0 && k % RR_FLOWS == RR_FLOWS - 1)
            for (int i = 0; i < RR_FLOWS; i++)
                if (fl[i].jobs != (uint64_t)(k / RR_FLOWS + 1))
                    ck_abort_msg("round %ld: flow %d served %llu times", k / RR_FLOWS, i,
                                 (unsigned long long)fl[i].jobs);
        served->left = 1; /* its client sends the next request */
        sched_activate(&s, &served->f);
    }
    for (int i = 0; i < RR_FLOWS; i++) {
        uint64_t v = sched_served(&fl[i].f);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    ck_assert_msg((double)hi <= (double)lo * 1.1, "shares %llu .. %llu", (unsigned long long)lo,
                  (unsigned long long)hi);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("sfq");
    tcase_add_loop_test(tc, test_equal_shares, 0, 2);
    tcase_add_test(tc, test_weighted_shares);
    tcase_add_test(tc, test_no_starvation);
    tcase_add_test(tc, test_idle_banks_no_credit);
    tcase_add_test(tc, test_debt_kept);
    tcase_add_test(tc, test_ties_and_put_back);
    tcase_add_test(tc, test_random_churn);
    tcase_add_loop_test(tc, test_one_at_a_time, 0, 2);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    int failed;
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
