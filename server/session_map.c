/*
 * session_map.c: the id -> session map of one connection (see
 * session_map.h): open addressing with linear probing over a power-of-two
 * array of (hash, node, inline id) slots, backward-shift deletion,
 * SipHash-1-3 keyed once per process from getrandom(2).
 */
#include "session_map.h"

#include <assert.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MIN_BUCKETS 8

static uint64_t sip_key[2];
/* SipHash's state before the first word, from the key: computed once with
 * it rather than for every id. */
static uint64_t sip_v0[4];
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
    sip_v0[0] = 0x736f6d6570736575ULL ^ sip_key[0];
    sip_v0[1] = 0x646f72616e646f6dULL ^ sip_key[1];
    sip_v0[2] = 0x6c7967656e657261ULL ^ sip_key[0];
    sip_v0[3] = 0x7465646279746573ULL ^ sip_key[1];
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

/* The 8 bytes at `p` as SipHash reads a word: little-endian. */
static inline uint64_t sip_word(const unsigned char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t m;
    memcpy(&m, p, sizeof(m));
    return m;
#else
    uint64_t m = 0;
    for (int i = 7; i >= 0; i--)
        m = (m << 8) | p[i];
    return m;
#endif
}

/* SipHash's end: the last word `b` (the 0-7 bytes left, with the length
 * in its top byte) into the state v0..v3, and the finalisation rounds. */
static inline uint64_t sip_finish(uint64_t v0, uint64_t v1, uint64_t v2, uint64_t v3, uint64_t b)
{
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* SipHash-1-3 of `nw` whole words `w` and the last word `b`. */
static inline uint64_t sip_words(const uint64_t *w, size_t nw, uint64_t b)
{
    uint64_t v0 = sip_v0[0], v1 = sip_v0[1], v2 = sip_v0[2], v3 = sip_v0[3];

    for (size_t i = 0; i < nw; i++) {
        v3 ^= w[i];
        SIPROUND;
        v0 ^= w[i];
    }
    return sip_finish(v0, v1, v2, v3, b);
}

/* SipHash-1-3 (one compression round, three finalisation rounds). */
static uint64_t siphash13(const unsigned char *in, size_t len)
{
    uint64_t v0 = sip_v0[0], v1 = sip_v0[1], v2 = sip_v0[2], v3 = sip_v0[3];
    uint64_t b = (uint64_t)len << 56;
    const unsigned char *end = in + (len & ~(size_t)7);

    for (; in != end; in += 8) {
        uint64_t m = sip_word(in);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    /* The last 0-7 bytes, without a loop: ids are short, so this is most
     * of the input. */
    switch (len & 7) {
    case 7:
        b |= (uint64_t)in[6] << 48;
        /* fall through */
    case 6:
        b |= (uint64_t)in[5] << 40;
        /* fall through */
    case 5:
        b |= (uint64_t)in[4] << 32;
        /* fall through */
    case 4:
        b |= (uint64_t)in[3] << 24;
        /* fall through */
    case 3:
        b |= (uint64_t)in[2] << 16;
        /* fall through */
    case 2:
        b |= (uint64_t)in[1] << 8;
        /* fall through */
    case 1:
        b |= (uint64_t)in[0];
        break;
    default:
        break;
    }
    return sip_finish(v0, v1, v2, v3, b);
}

uint64_t (*session_map__hash)(const unsigned char *id, size_t len) = siphash13;

/* Whether `count` nodes overfill `nbuckets` slots (more than 3/4). */
static bool too_full(size_t count, size_t nbuckets)
{
    return count > nbuckets / 4 * 3;
}

/* Moves every node into a new array of `nbuckets` slots.  On ENOMEM the map
 * is left as it was. */
static int rehash(session_map_t *m, size_t nbuckets)
{
    session_map_slot_t *a = calloc(nbuckets, sizeof(*a));
    size_t mask = nbuckets - 1;

    if (a == NULL)
        return SLOTD_ENOMEM;
    for (size_t i = 0; i < m->nbuckets; i++) {
        const session_map_slot_t *s = &m->slots[i];
        size_t j;
        if (s->node == NULL)
            continue;
        for (j = s->hash & mask; a[j].node != NULL; j = (j + 1) & mask)
            ;
        a[j] = *s;
    }
    free(m->slots);
    m->slots = a;
    m->nbuckets = nbuckets;
    return SLOTD_OK;
}

int session_map_init(session_map_t *m)
{
    pthread_once(&sip_once, sip_key_init);
    m->count = 0;
    m->nbuckets = MIN_BUCKETS;
    m->slots = calloc(MIN_BUCKETS, sizeof(*m->slots));
    return m->slots != NULL ? SLOTD_OK : SLOTD_ENOMEM;
}

void session_map_free(session_map_t *m)
{
    free(m->slots);
    m->slots = NULL;
    m->nbuckets = 0;
    m->count = 0;
}

/* The inline copy of an id of `len` bytes: the id zero-padded to 16 bytes
 * when it has at most SESSION_MAP_INLINE_MAX bytes (ids hold no NUL, so
 * the copy tells every short id apart from any other id), else its first
 * 16 bytes. */
static void inline_key(uint64_t key[2], const char *id, size_t len)
{
    char b[16] = {0};

    memcpy(b, id, len < 16 ? len : 16);
    memcpy(key, b, 16);
}

/* The node whose slot has hash `h` and inline copy `key`, for the id `id`
 * of `len` bytes. */
static inline session_map_node_t *find_slot(const session_map_t *m, const char *id, size_t len,
                                            uint64_t h, const uint64_t key[2])
{
    size_t mask = m->nbuckets - 1;

    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const session_map_slot_t *s = &m->slots[i];
        if (s->node == NULL)
            return NULL;
        if (s->hash != h || s->key[0] != key[0] || s->key[1] != key[1])
            continue;
        /* A short id is decided by the slot alone; only a long one is
         * compared in the record. */
        if (len <= SESSION_MAP_INLINE_MAX || memcmp(s->node->id, id, len + 1) == 0)
            return s->node;
    }
}

session_map_node_t *session_map_find(const session_map_t *m, const char *id)
{
    size_t len = strlen(id);
    uint64_t key[2];

    inline_key(key, id, len);
    return find_slot(m, id, len, session_map__hash((const unsigned char *)id, len), key);
}

#define ONES UINT64_C(0x0101010101010101)
#define HIGHS UINT64_C(0x8080808080808080)

/* The zero bytes of the word `w` (as sip_word() reads it) flagged by their
 * high bit: exact for the first one, which is all that is used. */
static inline uint64_t zero_bytes(uint64_t w)
{
    return (w - ONES) & ~w & HIGHS;
}

session_map_node_t *session_map_find_idbuf(const session_map_t *m,
                                           const char id[PROTO_ID_MAX + 1])
{
    const unsigned char *p = (const unsigned char *)id;
    uint64_t w[2], z, key[2];
    size_t len;

    /* The id's first one or two words, its length from the first NUL, and
     * what lies past the NUL masked off: the hash is SipHash-1-3 of the
     * id's bytes alone, as session_map_find() computes it.  A longer id,
     * or a hash a test put in place, goes the plain way. */
    if (session_map__hash != siphash13)
        return session_map_find(m, id);
    w[0] = sip_word(p);
    if ((z = zero_bytes(w[0])) != 0) {
        len = (size_t)__builtin_ctzll(z) >> 3;
        key[0] = w[0] & ((UINT64_C(1) << (len * 8)) - 1);
        key[1] = 0;
        return find_slot(m, id, len, sip_words(w, 0, key[0] | (uint64_t)len << 56), key);
    }
    w[1] = sip_word(p + 8);
    if ((z = zero_bytes(w[1])) != 0) {
        len = (size_t)__builtin_ctzll(z) >> 3;
        key[0] = w[0];
        key[1] = w[1] & ((UINT64_C(1) << (len * 8)) - 1);
        len += 8;
        return find_slot(m, id, len, sip_words(w, 1, key[1] | (uint64_t)len << 56), key);
    }
    return session_map_find(m, id);
}

int session_map_insert(session_map_t *m, session_map_node_t *n)
{
    size_t i, mask, len = strlen(n->id);
    session_map_slot_t s;

    assert(session_map_find(m, n->id) == NULL);
    if (too_full(m->count + 1, m->nbuckets) && rehash(m, m->nbuckets * 2) != SLOTD_OK)
        return SLOTD_ENOMEM;
    /* Shrinking happens here rather than in remove, so that an iteration
     * may remove nodes.  A failed allocation keeps the larger array. */
    if (m->nbuckets > MIN_BUCKETS && m->count < m->nbuckets / 8)
        (void)rehash(m, m->nbuckets / 2);
    n->hash = session_map__hash((const unsigned char *)n->id, len);
    s.hash = n->hash;
    s.node = n;
    inline_key(s.key, n->id, len);
    mask = m->nbuckets - 1;
    for (i = n->hash & mask; m->slots[i].node != NULL; i = (i + 1) & mask)
        ;
    m->slots[i] = s;
    m->count++;
    return SLOTD_OK;
}

void session_map_remove(session_map_t *m, session_map_node_t *n)
{
    size_t mask = m->nbuckets - 1, i, j;

    for (i = n->hash & mask; m->slots[i].node != n; i = (i + 1) & mask)
        assert(m->slots[i].node != NULL); /* `n` is in the map */
    /* Backward shift: each later node of the run whose home is not in
     * (i, j] moves into the hole at i, which then moves to j. */
    for (j = (i + 1) & mask; m->slots[j].node != NULL; j = (j + 1) & mask) {
        size_t home = m->slots[j].hash & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i] = (session_map_slot_t){0};
    m->count--;
}

session_map_node_t *session_map_next(const session_map_t *m, session_map_iter_t *it)
{
    size_t mask = m->nbuckets - 1;

    if (!it->started) {
        /* Start at an empty slot (there is one: the map is never full). */
        it->started = 1;
        it->pos = 0;
        while (m->slots[it->pos].node != NULL)
            it->pos++;
        it->left = m->nbuckets - 1;
    }
    while (it->left > 0) {
        it->pos = (it->pos - 1) & mask;
        it->left--;
        if (m->slots[it->pos].node != NULL)
            return m->slots[it->pos].node;
    }
    return NULL;
}

int session_map_check(const session_map_t *m)
{
    size_t mask = m->nbuckets - 1, count = 0;
    uint64_t key[2];

    if (m->nbuckets < MIN_BUCKETS || (m->nbuckets & mask) != 0 || too_full(m->count, m->nbuckets))
        return -1;
    for (size_t i = 0; i < m->nbuckets; i++) {
        const session_map_slot_t *s = &m->slots[i];
        if (s->node == NULL)
            continue;
        count++;
        inline_key(key, s->node->id, strlen(s->node->id));
        if (s->key[0] != key[0] || s->key[1] != key[1])
            return -1;
        if (s->hash != s->node->hash ||
            s->hash != session_map__hash((const unsigned char *)s->node->id, strlen(s->node->id)))
            return -1;
        /* No empty slot between its home and its slot. */
        for (size_t j = s->hash & mask; j != i; j = (j + 1) & mask)
            if (m->slots[j].node == NULL)
                return -1;
    }
    return count == m->count ? 0 : -1;
}
