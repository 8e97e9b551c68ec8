/*
 * session_map.h: a connection's sessions by id, an intrusive hash map.
 *
 * The map indexes nodes that the caller embeds in its own records (the
 * server's session record); it owns only its slot array.  Keys are the ids
 * of the protocol (1..64 bytes), hashed with SipHash-1-3 under a key drawn
 * at random once per process, so a client cannot choose ids that collide.
 *
 * Open addressing with linear probing: each slot holds an id's full 64-bit
 * hash, its node and an inline copy of the id's first 16 bytes, 32 bytes,
 * two to a cache line.  A find compares in the slot array only: an id of
 * at most SESSION_MAP_INLINE_MAX bytes is decided there (the copy holds all
 * of it), and a longer one is compared in the caller's record only when
 * hash and copy both match.  So a lookup of a short id touches the slot
 * array's line (rarely two) and no record; the caller then reads the one
 * record it asked for.  Removal shifts the rest of the probe run back
 * (no tombstones).  The array doubles when an insert would fill it past
 * three quarters and halves when an insert finds it less than an eighth
 * full (never on remove, so that an iteration may remove what it visits).
 * Insert, find and remove are O(1) on average.  One thread at a time.
 */
#ifndef SLOTD_SERVER_SESSION_MAP_H
#define SLOTD_SERVER_SESSION_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/** Embedded in the caller's record.  Before session_map_insert() the
 * caller points `id` at the id (1..PROTO_ID_MAX bytes and a NUL), stored
 * where it stays, unchanged, while the node is linked (the server's
 * session record keeps it once, in its cache owner); the map owns `hash`
 * while the node is linked. */
typedef struct session_map_node {
    uint64_t hash;
    const char *id;
} session_map_node_t;

/** Ids of at most this many bytes are compared in the slot alone. */
#define SESSION_MAP_INLINE_MAX 15

/** One slot of the array: empty when `node` is NULL. */
typedef struct session_map_slot {
    uint64_t hash;            /* node->hash */
    session_map_node_t *node; /* not owned */
    uint64_t key[2];          /* the id's first 16 bytes, zero-padded */
} session_map_slot_t;

/** The map.  Owns `slots` (malloc), freed by session_map_free(); never the
 * nodes. */
typedef struct session_map {
    session_map_slot_t *slots;
    size_t nbuckets; /* slots in the array, a power of two */
    size_t count;    /* nodes linked, at most 3/4 of nbuckets */
} session_map_t;

/** Position of an iteration; start it with SESSION_MAP_ITER_INIT.  It
 * visits the slots downwards from an empty one, so that the shifts of a
 * removal only move nodes it has already visited. */
typedef struct session_map_iter {
    size_t pos;  /* the slot last visited */
    size_t left; /* slots still to visit */
    int started;
} session_map_iter_t;

#define SESSION_MAP_ITER_INIT                                                                      \
    {                                                                                              \
        0, 0, 0                                                                                    \
    }

/** Initialises an empty map with a small slot array.  SLOTD_OK or
 * SLOTD_ENOMEM. */
int session_map_init(session_map_t *m);

/** Frees the slot array.  Nodes still linked are left as they are. */
void session_map_free(session_map_t *m);

/** The node with id `id`, or NULL. */
session_map_node_t *session_map_find(const session_map_t *m, const char *id);

/** session_map_find() for an id at the start of a buffer of
 * PROTO_ID_MAX + 1 bytes that are all initialised, past the id's NUL too
 * (a parsed request's `id`): the same node, found with fewer instructions
 * (it reads the id a word at a time, and hashes an id of at most 15 bytes
 * in line). */
session_map_node_t *session_map_find_idbuf(const session_map_t *m,
                                           const char id[PROTO_ID_MAX + 1]);

/** Links `n` under n->id, which must not be in the map.  SLOTD_OK, or
 * SLOTD_ENOMEM if the map had to grow and could not (then `n` is not
 * linked).  The map does not own `n`. */
int session_map_insert(session_map_t *m, session_map_node_t *n);

/** Unlinks `n`, which must be in the map. */
void session_map_remove(session_map_t *m, session_map_node_t *n);

/** The next node of an iteration, or NULL at the end.  Removing the node
 * just returned is allowed; inserting during an iteration is not. */
session_map_node_t *session_map_next(const session_map_t *m, session_map_iter_t *it);

/** The hash of the `len` bytes of an id: SipHash-1-3 under the process's
 * key.  A test may point it at a weak function to force collisions, while
 * no map holds a node; nothing else may change it. */
extern uint64_t (*session_map__hash)(const unsigned char *id, size_t len);

/** Checks the map's invariants: every linked node's hash, every node
 * reachable from its home slot without crossing an empty one, the count
 * and the load.  0 when they hold, -1 otherwise.  For tests; O(n) and
 * more. */
int session_map_check(const session_map_t *m);

#endif
