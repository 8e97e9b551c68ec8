# slotd in a container.  The build stage installs and builds through the
# same scripts as the README and CI (scripts/deps.sh, scripts/build.sh); the
# runtime stage holds the two binaries and their shared libraries (libedit2
# and the libbsd0 it links are for slotd-cli, which is also the health
# check), and runs as an unprivileged user.
#   docker build -t slotd .
#   docker run -p 7070:7070 -p 127.0.0.1:7071:7071 -e SLOTD_ADMIN_LISTEN=0.0.0.0 \
#     -v /etc/slotd/docker-token:/run/secrets/slotd_token:ro \
#     -e SLOTD_AUTH_TOKEN_FILE=/run/secrets/slotd_token slotd
# Protected mode: without a token (a file only the slotd user, UID 10001,
# reads) or SLOTD_PROTECTED_MODE=no, the CMD below refuses to start.
# The admin port stays on the container's loopback unless SLOTD_ADMIN_LISTEN
# moves it; publish it privately.
# Settings come from SLOTD_* variables (docker run -e SLOTD_CACHE_MB=1024 ...);
# see docs/operations.md.
# tests/test_dockerfile.sh checks this file against the built daemon, and
# the `image` stage of scripts/test.sh (tests/test_image.sh) builds and runs
# it with podman.
#
# The base: Debian 12 slim, pinned by digest.  Where no registry can be
# reached, as in CI, tests/test_image.sh makes a Debian 12 base from
# Debian's packages (debootstrap) and passes it as --build-arg BASE.
ARG BASE=docker.io/library/debian:12.11-slim@sha256:2424c1850714a4d94666ec928e24d86de958646737b1d113f5b2207be44d37d8

FROM ${BASE} AS build
WORKDIR /src
# The packages first, so that a change to the sources reuses this layer.
COPY scripts/deps.sh scripts/
RUN scripts/deps.sh
COPY . .
RUN scripts/build.sh build none

FROM ${BASE}
# A fixed UID and GID, so that the host can own the token file for it.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libuv1 libcjson1 libhttp-parser2.9 libedit2 libbsd0 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 slotd \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin slotd
COPY --from=build /src/build/server/slotd /src/build/server/slotd-cli /usr/local/bin/
USER slotd
EXPOSE 7070 7071
# slotd-cli asks /health where the admin port listens: SLOTD_ADMIN_LISTEN
# (loopback unless set; 0.0.0.0 and :: are reached on loopback too) and
# SLOTD_ADMIN_PORT.  Brackets keep an IPv6 address whole.  Its status is 1
# for an answer other than 200 and 3 for no answer: both are "unhealthy".
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD slotd-cli -t 2 -a "[${SLOTD_ADMIN_LISTEN:-127.0.0.1}]:${SLOTD_ADMIN_PORT:-7071}" health >/dev/null || exit 1
# Inside the container the session port must listen on all interfaces to be
# reached; --listen does not move the admin port (SLOTD_ADMIN_LISTEN does).
CMD ["slotd", "--listen", "0.0.0.0"]
