# slotd in a container.  Both stages install and build through the same
# scripts as the README and CI (scripts/deps.sh, scripts/build.sh).
#   docker build -t slotd .
#   docker run -p 7070:7070 -p 7071:7071 slotd
FROM debian:12-slim AS build
WORKDIR /src
COPY . .
RUN scripts/deps.sh && scripts/build.sh build none

FROM debian:12-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libuv1 libcjson1 libhttp-parser2.9 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home --shell /usr/sbin/nologin slotd
COPY --from=build /src/build/server/slotd /src/build/server/slotd-cli /usr/local/bin/
USER slotd
EXPOSE 7070 7071
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:7071/health || exit 1
# Inside the container the daemon must listen on all interfaces to be reached.
CMD ["slotd", "--listen", "0.0.0.0"]
