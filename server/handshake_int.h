/*
 * handshake_int.h: a session connection before it is served (handshake.c):
 * its client's address, the PROXY header of a --proxy-from peer, and the
 * bounds on a connection that has not authenticated yet.  For the other
 * files of server/; loop thread only.
 */
#ifndef SLOTD_SERVER_HANDSHAKE_INT_H
#define SLOTD_SERVER_HANDSHAKE_INT_H

#include "server_int.h"

/* The longest line a connection may send before its auth when a token is
 * set: the longest token with every byte escaped (\" or \\), and room for
 * the op and a tag.  Past it the line is line_too_long, and the
 * connection closes, so that a connection that never authenticates pins
 * at most this much of a partial line rather than --max-line. */
#define HANDSHAKE_LINE_MAX (2 * AUTH_TOKEN_MAX + 512)

/** Initialises server->handshake and its timer (closed by the server's
 * finish with the other timers). */
void handshake__init(server_t *s);

/** The line limit a new connection's framer gets at handshake__begin():
 * HANDSHAKE_LINE_MAX with a token (if --max-line is larger), else
 * --max-line.  handshake__authed() raises it to --max-line. */
size_t handshake__line_max(const server_config_t *cfg);

/** conn_hooks_t.accepted: at accept, the socket open and read: sets the
 * framer's limit (handshake__line_max()) and c->peer, gives a peer that
 * --proxy-from lists a PROXY reader (c->proxy, freed by handshake.c), and
 * puts a connection with a handshake ahead on server->handshake with its
 * --auth-timeout deadline.  May close `c` (no memory). */
void handshake__begin(conn_t *c);

/** conn_hooks_t.preamble: the bytes `data` (`len`) read while c->proxy is
 * set: returns how many
 * of them were the header's; the rest are the stream's.  Once the header
 * is read, c->peer names the client it gives and c->proxy is NULL; a
 * malformed header closes `c` (logged; check c->closed). */
size_t handshake__proxy_read(conn_t *c, const char *data, size_t len);

/** An auth succeeded on `c` (c->authed is set): the line limit becomes
 * --max-line, and the handshake is over unless a PROXY header is awaited. */
void handshake__authed(conn_t *c);

/** conn_hooks_t.make_room: the connections are at --max-connections.  If
 * some connection is in its handshake, the oldest gets one
 * too_many_connections line and is closed once it is written, and the new
 * connection may take its place (true); with a token, failing that, the
 * oldest lingering close of a connection that never authenticated ends at
 * once (true); false if there is neither. */
bool handshake__make_room(server_t *s);

/** conn_hooks_t.closing: `c` stops serving: off the handshake list, its
 * PROXY reader freed. */
void handshake__end(conn_t *c);

#endif
