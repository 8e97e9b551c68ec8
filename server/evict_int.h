/*
 * evict_int.h: what a request that finds the pool full does (evict.c,
 * --on-full refuse|wait|evict), for the other files of server/.  Loop
 * thread only (a worker's rebuild counts itself in metrics, from job.c).
 */
#ifndef SLOTD_SERVER_EVICT_INT_H
#define SLOTD_SERVER_EVICT_INT_H

#include "server_int.h"

/** Sets up the wait list and its timer (server start-up) and closes the
 * timer (server_finish(), through `close`). */
void evict__init(server_t *s);
uv_handle_t *evict__timer(server_t *s);

/** A job `r` came back refused for room (SLOTD_ECACHE_FULL) with nothing
 * earlier of its connection pending, its connection open and no drain.
 * Under --on-full evict, makes room by evicting idle sessions and runs `r`
 * again (with none idle, it waits as under wait); under --on-full wait,
 * puts it on the wait list (REQ_ROOM) until room frees or --full-wait-ms
 * passes.  True if it took `r` (the caller
 * stops there, as for a deferral, after giving the session what the job
 * left); false if `r` is to be answered cache_full (refuse; nothing left
 * to evict; its wait is over). */
bool evict__on_full(req_t *r);

/** Room came back to the pool (a slot released), or under evict a session
 * went idle (a victim): the waiting requests run again at the end of this
 * turn. */
void evict__room_freed(server_t *s);

/** Takes `r` (REQ_ROOM) off the wait list: its connection closes or
 * drains, and the caller answers or frees it (a fork no longer keeps the
 * session it forks: forks_out). */
void evict__unwait(server_t *s, req_t *r);

/** A request that waited for room (--on-full wait) is answered, or its
 * wait is over: its wait time goes to slotd_room_wait_seconds. */
void evict__room_done(req_t *r);

/** Every job back (dispatch.c), before the session takes its result: a
 * step or append that rebuilt its evicted session makes it hold a slot. */
void evict__job_back(req_t *r);

/** A released session was evicted: it held no slot; its count goes. */
void evict__forget(session_t *sess);


#endif
