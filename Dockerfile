# slotd in a container.  The build stage installs and builds through the
# same scripts as the README and CI (scripts/deps.sh, scripts/build.sh); the
# runtime stage holds the two binaries, their shared libraries (libedit2 and
# the libbsd0 it links are for slotd-cli's line editing) and curl for
# the health check, and runs as an unprivileged user.
#   docker build -t slotd .
#   docker run -p 7070:7070 -p 127.0.0.1:7071:7071 -e SLOTD_ADMIN_LISTEN=0.0.0.0 \
#     -v /etc/slotd/token:/run/secrets/slotd_token:ro \
#     -e SLOTD_AUTH_TOKEN_FILE=/run/secrets/slotd_token slotd
# Protected mode: without a token (a file only the slotd user reads) or
# SLOTD_PROTECTED_MODE=no, the CMD below refuses to start.
# The admin port stays on the container's loopback (where the health check
# reaches it) unless SLOTD_ADMIN_LISTEN moves it; publish it privately.
# Settings come from SLOTD_* variables (docker run -e SLOTD_CACHE_MB=1024 ...);
# see docs/operations.md.
# tests/test_dockerfile.sh checks this file against the built daemon.
FROM debian:12-slim AS build
WORKDIR /src
COPY . .
RUN scripts/deps.sh && scripts/build.sh build none

FROM debian:12-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libuv1 libcjson1 libhttp-parser2.9 libedit2 libbsd0 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home --shell /usr/sbin/nologin slotd
COPY --from=build /src/build/server/slotd /src/build/server/slotd-cli /usr/local/bin/
USER slotd
EXPOSE 7070 7071
# Follows SLOTD_ADMIN_PORT when the admin port is moved.
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD curl -fsS "http://127.0.0.1:${SLOTD_ADMIN_PORT:-7071}/health" || exit 1
# Inside the container the session port must listen on all interfaces to be
# reached; --listen does not move the admin port (SLOTD_ADMIN_LISTEN does).
CMD ["slotd", "--listen", "0.0.0.0"]
