/*
 * session_map.c: the id -> session map of one connection (see
 * session_map.h): separate chaining over a power-of-two bucket array,
 * SipHash-1-3 keyed once per process from getrandom(2).
 */
#include "session_map.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MIN_BUCKETS 8

static uint64_t sip_key[2];
static pthread_once_t sip_once = PTHREAD_ONCE_INIT;

static void sip_key_init(void)
{
    if (getrandom(sip_key, sizeof(sip_key), 0) != (ssize_t)sizeof(sip_key)) {
        /* No entropy source: still different per process and per start. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sip_key[0] = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15u ^ (uint64_t)getpid();
        sip_key[1] = (uint64_t)ts.tv_sec * 0xBF58476D1CE4E5B9u ^ (uintptr_t)&ts;
    }
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

/* SipHash-1-3 (one compression round, three finalisation rounds). */
static uint64_t siphash13(const unsigned char *in, size_t len)
{
    uint64_t k0 = sip_key[0], k1 = sip_key[1];
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0;
    uint64_t v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0;
    uint64_t v3 = 0x7465646279746573ULL ^ k1;
    uint64_t b = (uint64_t)len << 56;
    const unsigned char *end = in + (len & ~(size_t)7);

    for (; in != end; in += 8) {
        uint64_t m = 0;
        for (int i = 7; i >= 0; i--)
            m = (m << 8) | in[i];
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static uint64_t hash_id(const char *id)
{
    return siphash13((const unsigned char *)id, strlen(id));
}

/* Moves every node into a new array of `nbuckets`.  On ENOMEM the map is
 * left as it was. */
static int rehash(session_map_t *m, size_t nbuckets)
{
    session_map_node_t **b = calloc(nbuckets, sizeof(*b));
    if (b == NULL)
        return SLOTD_ENOMEM;
    for (size_t i = 0; i < m->nbuckets; i++) {
        session_map_node_t *n = m->buckets[i], *next;
        for (; n != NULL; n = next) {
            size_t j = n->hash & (nbuckets - 1);
            next = n->next;
            n->next = b[j];
            b[j] = n;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nbuckets;
    return SLOTD_OK;
}

int session_map_init(session_map_t *m)
{
    pthread_once(&sip_once, sip_key_init);
    m->count = 0;
    m->nbuckets = MIN_BUCKETS;
    m->buckets = calloc(MIN_BUCKETS, sizeof(*m->buckets));
    return m->buckets != NULL ? SLOTD_OK : SLOTD_ENOMEM;
}

void session_map_free(session_map_t *m)
{
    free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = 0;
    m->count = 0;
}

session_map_node_t *session_map_find(const session_map_t *m, const char *id)
{
    uint64_t h = hash_id(id);
    session_map_node_t *n = m->buckets[h & (m->nbuckets - 1)];
    for (; n != NULL; n = n->next)
        if (n->hash == h && strcmp(n->id, id) == 0)
            return n;
    return NULL;
}

int session_map_insert(session_map_t *m, session_map_node_t *n)
{
    size_t i;

    assert(session_map_find(m, n->id) == NULL);
    if (m->count >= m->nbuckets && rehash(m, m->nbuckets * 2) != SLOTD_OK)
        return SLOTD_ENOMEM;
    /* Shrinking happens here rather than in remove, so that an iteration
     * may remove nodes.  A failed allocation keeps the larger array. */
    if (m->nbuckets > MIN_BUCKETS && m->count < m->nbuckets / 8)
        (void)rehash(m, m->nbuckets / 2);
    n->hash = hash_id(n->id);
    i = n->hash & (m->nbuckets - 1);
    n->next = m->buckets[i];
    m->buckets[i] = n;
    m->count++;
    return SLOTD_OK;
}

void session_map_remove(session_map_t *m, session_map_node_t *n)
{
    session_map_node_t **pp = &m->buckets[n->hash & (m->nbuckets - 1)];

    while (*pp != n) {
        assert(*pp != NULL); /* `n` is in the map */
        pp = &(*pp)->next;
    }
    *pp = n->next;
    n->next = NULL;
    m->count--;
}

session_map_node_t *session_map_next(const session_map_t *m, session_map_iter_t *it)
{
    session_map_node_t *n = it->next;

    while (n == NULL && it->bucket < m->nbuckets)
        n = m->buckets[it->bucket++];
    if (n != NULL)
        it->next = n->next;
    return n;
}
