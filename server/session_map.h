/*
 * session_map.h: a connection's sessions by id, an intrusive hash map.
 *
 * The map links nodes that the caller embeds in its own records (the
 * server's session record); it owns only its bucket array.  Keys are the
 * ids of the protocol (1..64 bytes), hashed with SipHash-1-3 under a key
 * drawn at random once per process, so a client cannot choose ids that
 * collide.  Insert, find and remove are O(1) on average; the bucket array
 * doubles when an insert finds more nodes than buckets and halves when an
 * insert finds fewer than an eighth (never on remove, so that an iteration
 * may remove what it visits).  One thread at a time.
 */
#ifndef SLOTD_SERVER_SESSION_MAP_H
#define SLOTD_SERVER_SESSION_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/** Embedded in the caller's record.  The caller fills `id` before
 * session_map_insert(); the map owns `next` and `hash` while linked. */
typedef struct session_map_node {
    struct session_map_node *next; /* the bucket's next node */
    uint64_t hash;
    char id[PROTO_ID_MAX + 1];
} session_map_node_t;

/** The map.  Owns `buckets` (malloc), freed by session_map_free(); never
 * the nodes. */
typedef struct session_map {
    session_map_node_t **buckets;
    size_t nbuckets; /* a power of two */
    size_t count;
} session_map_t;

/** Position of an iteration; start it with SESSION_MAP_ITER_INIT. */
typedef struct session_map_iter {
    size_t bucket;
    session_map_node_t *next;
} session_map_iter_t;

#define SESSION_MAP_ITER_INIT                                                                      \
    {                                                                                              \
        0, NULL                                                                                    \
    }

/** Initialises an empty map with a small bucket array.  SLOTD_OK or
 * SLOTD_ENOMEM. */
int session_map_init(session_map_t *m);

/** Frees the bucket array.  Nodes still linked are left as they are. */
void session_map_free(session_map_t *m);

/** The node with id `id`, or NULL. */
session_map_node_t *session_map_find(const session_map_t *m, const char *id);

/** Links `n` under n->id, which must not be in the map.  SLOTD_OK, or
 * SLOTD_ENOMEM if the map had to grow and could not (then `n` is not
 * linked).  The map does not own `n`. */
int session_map_insert(session_map_t *m, session_map_node_t *n);

/** Unlinks `n`, which must be in the map. */
void session_map_remove(session_map_t *m, session_map_node_t *n);

/** The next node of an iteration, or NULL at the end.  Removing the node
 * just returned is allowed; inserting during an iteration is not. */
session_map_node_t *session_map_next(const session_map_t *m, session_map_iter_t *it);

#endif
