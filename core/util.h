/*
 * util.h: the small things every module of slotd writes the same way,
 * written once: recovering a record from an embedded member, the cache
 * line size, and lists.
 *
 * Header only; no state, no thread, no lock.
 *
 * Lists are <sys/queue.h>'s (LIST_*, TAILQ_*, STAILQ_*, SLIST_*): one
 * implementation, well known, intrusive (the entry lives in the record, so
 * a list never allocates), and constant time for every insert and remove
 * the daemon does.  A module keeps a hand-written list only where it does
 * what queue.h cannot (a lock-free stack, a list threaded through atomics).
 */
#ifndef SLOTD_CORE_UTIL_H
#define SLOTD_CORE_UTIL_H

#include <stddef.h>
#include <sys/queue.h>

/** The record of type `type` whose member `member` is at `ptr`. */
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/** The cache line of every x86-64 and arm64 CPU slotd runs on: the unit of
 * alignment that keeps two threads' data apart, and of prefetch hints. */
#define SLOTD_CACHE_LINE 64

#endif
