/*
 * sched.c: start-time fair queuing over the caller's flows (see sched_int.h).
 *
 * The active flows sit in a pairing heap ordered by (start, order): an
 * insert is one comparison, removing the least is a two-pass merge of its
 * children, amortised O(log n), and neither allocates, so a flow joins
 * the scheduler under the caller's lock whatever the number of flows.
 * Flows that start exactly at the virtual time (every flow that was idle
 * and became active, the common case with many clients each with a
 * request or a burst at a time) wait instead in a FIFO, `_ties`, served
 * before the heap: the heap holds only later starts (no flow starts
 * before the virtual time, and it moves only when the FIFO is empty), so
 * the FIFO's order is the heap's would be, at O(1) and without walking
 * the flows' records.  A later start that sorts after every flow of the
 * second FIFO, `_run`, joins it instead of the heap (each client with a
 * request at a time: they come back in about the order they were served,
 * their starts one job later), and the next flow is the lesser of that
 * FIFO's head and the heap's root: in order, in O(1), as long as the
 * flows come back in order.
 *
 * Virtual time counts cost units (the caller's: worker.c's jobs count
 * estimated nanoseconds).  Every value only grows: a start is at least the
 * virtual time, and the virtual time is the largest start served, so the
 * 64-bit counters wrap only after centuries of nanoseconds.
 *
 * No lock of its own: the caller serialises every call (worker.c holds
 * queue_lock).
 */
#include "sched_int.h"

#include <assert.h>
#include <string.h>

void sched_init(sched_t *s)
{
    memset(s, 0, sizeof(*s));
}

void sched_flow_init(sched_flow_t *f)
{
    memset(f, 0, sizeof(*f));
    f->_weight = 1;
}

void sched_flow_set_weight(sched_flow_t *f, uint32_t weight)
{
    f->_weight = weight > 0 ? weight : 1;
    f->_carry = 0;
}

/* What a job of `cost` moves flow `f` on in virtual time: its cost over
 * the flow's weight, the remainder carried to the flow's next job so that
 * over many jobs nothing is lost to rounding. */
static uint64_t charge(sched_flow_t *f, uint64_t cost)
{
    uint64_t c;

    if (f->_weight <= 1)
        return cost;
    c = cost + f->_carry;
    f->_carry = (uint32_t)(c % f->_weight);
    return c / f->_weight;
}

/* Whether a is served before b. */
static bool served_before(const sched_flow_t *a, const sched_flow_t *b)
{
    return a->_start < b->_start || (a->_start == b->_start && a->_order < b->_order);
}

/* The heap of two heaps (either may be NULL). */
static sched_flow_t *meld(sched_flow_t *a, sched_flow_t *b)
{
    if (a == NULL)
        return b;
    if (b == NULL)
        return a;
    if (served_before(b, a)) {
        sched_flow_t *t = a;
        a = b;
        b = t;
    }
    b->_sibling = a->_child;
    a->_child = b;
    return a;
}

/* The heap of a list of sibling heaps: melded in pairs left to right, then
 * the pairs right to left, without recursion. */
static sched_flow_t *merge_pairs(sched_flow_t *first)
{
    sched_flow_t *pairs = NULL, *a, *b, *root = NULL;

    while (first != NULL) {
        a = first;
        b = a->_sibling;
        first = b != NULL ? b->_sibling : NULL;
        a->_sibling = NULL;
        if (b != NULL)
            b->_sibling = NULL;
        a = meld(a, b);
        a->_sibling = pairs; /* a stack of the pairs: the last first */
        pairs = a;
    }
    while (pairs != NULL) {
        a = pairs;
        pairs = a->_sibling;
        a->_sibling = NULL;
        root = meld(root, a);
    }
    return root;
}

/* Makes `f` active: in the ties' FIFO if it starts at the virtual time
 * (at its end, or with `front` at its front), else in the heap. */
static void insert(sched_t *s, sched_flow_t *f, bool front)
{
    f->_child = f->_sibling = NULL;
    f->_active = true;
    s->_active++;
    if (f->_start > s->_vtime) {
        if (s->_run_tail == NULL) {
            s->_run = s->_run_tail = f;
        } else if (served_before(s->_run_tail, f)) {
            s->_run_tail->_sibling = f;
            s->_run_tail = f;
        } else {
            s->_root = meld(s->_root, f);
        }
    } else if (front) {
        f->_sibling = s->_ties;
        s->_ties = f;
        if (s->_ties_tail == NULL)
            s->_ties_tail = f;
    } else {
        if (s->_ties_tail != NULL)
            s->_ties_tail->_sibling = f;
        else
            s->_ties = f;
        s->_ties_tail = f;
    }
}

/* Whether the run's head, not the heap's root, is served next (the ties'
 * FIFO being empty). */
static bool run_first(const sched_t *s)
{
    return s->_run != NULL && (s->_root == NULL || served_before(s->_run, s->_root));
}

/* Takes the flow served next out. */
static sched_flow_t *remove_root(sched_t *s)
{
    sched_flow_t *f = s->_ties;

    if (f != NULL) {
        s->_ties = f->_sibling;
        if (s->_ties == NULL)
            s->_ties_tail = NULL;
    } else if (run_first(s)) {
        f = s->_run;
        s->_run = f->_sibling;
        if (s->_run == NULL)
            s->_run_tail = NULL;
    } else if ((f = s->_root) != NULL) {
        s->_root = merge_pairs(f->_child);
    } else {
        return NULL;
    }
    f->_child = f->_sibling = NULL;
    f->_active = false;
    s->_active--;
    return f;
}

void sched_activate(sched_t *s, sched_flow_t *f)
{
    assert(!f->_active);
    f->_start = f->_finish > s->_vtime ? f->_finish : s->_vtime;
    f->_order = ++s->_order;
    insert(s, f, false);
}

sched_flow_t *sched_peek(const sched_t *s)
{
    if (s->_ties != NULL)
        return s->_ties;
    return run_first(s) ? s->_run : s->_root;
}

void sched_serve(sched_t *s, uint64_t cost, bool more)
{
    sched_flow_t *f = remove_root(s);

    assert(f != NULL);
    if (f->_start > s->_vtime)
        s->_vtime = f->_start;
    f->_finish = f->_start + charge(f, cost);
    f->_served += cost;
    if (more) {
        f->_start = f->_finish;
        insert(s, f, false);
    }
}

sched_flow_t *sched_pop(sched_t *s)
{
    return remove_root(s);
}

void sched_put_back(sched_t *s, sched_flow_t *f)
{
    assert(!f->_active);
    insert(s, f, true);
}

size_t sched_active(const sched_t *s)
{
    return s->_active;
}

uint32_t sched_flow_weight(const sched_flow_t *f)
{
    return f->_weight;
}

uint64_t sched_served(const sched_flow_t *f)
{
    return f->_served;
}

bool sched_flow_active(const sched_flow_t *f)
{
    return f->_active;
}

uint64_t sched_flow_start(const sched_flow_t *f)
{
    assert(f->_active);
    return f->_start;
}

uint64_t sched_vtime(const sched_t *s)
{
    return s->_vtime;
}
