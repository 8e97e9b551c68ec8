#!/usr/bin/env bash
# Builds the Dockerfile into an image with podman (no Docker engine, no
# registry), runs it, opens a session against it and waits for its
# HEALTHCHECK to report healthy.  The `image` stage of scripts/test.sh.
#
#   tests/test_image.sh [WORK_DIR]   (default build-image/)
#
# The base: Debian 12 made from Debian's packages with debootstrap, from
# the mirror this machine's apt already uses, imported as
# localhost/slotd-base:12 and passed as --build-arg BASE.  Everything
# (the base's rootfs, podman's storage with its cached layers) stays under
# WORK_DIR, so a second run rebuilds only what changed.  Exit status 0 if
# every check passed, 1 if one failed, 77 (skipped) only where this
# machine cannot run a container at all, saying why.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build-image}
mkdir -p "$dir" && dir=$(cd "$dir" && pwd) || exit 1
. "$root/tests/lib.sh"
passed=0
failed=0
base=localhost/slotd-base:12
image=localhost/slotd:ci

skip() { echo "SKIP: $*"; echo "image: $passed passed, $failed failed, 1 skipped"; exit 77; }
[ "$(id -u)" = 0 ] || skip "podman builds here as root (rootful); run as root"
for t in podman debootstrap; do
  command -v $t >/dev/null || { fail "$t not installed (scripts/deps.sh --test)"; exit 1; }
done

# podman with its storage under WORK_DIR.  runc where installed: crun 1.8
# refuses a host with cgroup v1 and v2 mounted together ("hybrid mode"),
# runc runs there.  No systemd as PID 1 on such a machine: cgroupfs, and
# events to a file.
pm=(podman --root "$dir/storage" --runroot "$dir/run" --cgroup-manager cgroupfs --events-backend file)
command -v runc >/dev/null && pm+=(--runtime runc)
# podman raises RLIMIT_NOFILE and RLIMIT_NPROC to its own defaults, which a
# root without CAP_SYS_RESOURCE cannot; ask for what this shell may have.
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
limits=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)

cid=""
decoy=""
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-image.XXXXXX") || exit 1
cleanup() {
  if [ -n "$cid" ]; then
    [ $failed -gt 0 ] && { echo "--- container log"; "${pm[@]}" logs "$cid" 2>&1 | tail -n 20; }
    "${pm[@]}" rm -f -t 0 "$cid" >/dev/null 2>&1
  fi
  [ -n "$decoy" ] && rm -f "$decoy"
  rm -rf "$work"
  echo "image: $passed passed, $failed failed"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# ---- The base, from Debian's packages ----
if ! "${pm[@]}" image exists "$base"; then
  # The mirror this machine's apt takes Debian 12's main component from.
  mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Identifier: Packages' 2>/dev/null |
    awk '$2 == "bookworm" && $3 == "main" { print $1; exit }')
  [ -n "$mirror" ] || { fail "no Debian 12 (bookworm main) source in this machine's apt sources"; exit 1; }
  echo "image: debootstrap a minimal Debian 12 from $mirror"
  t0=$SECONDS
  # Up to three tries: debootstrap failed once here with "Invalid Release
  # signature" from the same mirror that passed a minute later.
  ok=0
  for try in 1 2 3; do
    rm -rf "$dir/rootfs"
    if debootstrap --variant=minbase bookworm "$dir/rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1; then
      ok=1; break
    fi
    echo "image: debootstrap try $try failed: $(grep -m 1 '^E:' "$dir/debootstrap.log")"
  done
  [ $ok = 1 ] || { tail -n 20 "$dir/debootstrap.log"; fail "debootstrap"; exit 1; }
  # As Debian's own images: no package lists or caches in the base.
  rm -rf "$dir"/rootfs/var/lib/apt/lists/* "$dir"/rootfs/var/cache/apt/*.bin
  tar -C "$dir/rootfs" -c . | "${pm[@]}" import --change 'CMD ["bash"]' - "$base" >"$dir/import.log" 2>&1 ||
    { cat "$dir/import.log"; fail "podman import of the base"; exit 1; }
  rm -rf "$dir/rootfs"
  echo "image: base $base made in $((SECONDS - t0)) s"
fi

# Can this machine run a container at all?  If not, nothing below can be
# checked: say why and skip.
if ! out=$("${pm[@]}" run --rm --network host "${limits[@]}" "$base" true 2>&1); then
  skip "podman cannot run a container on this machine: $out"
fi

# ---- Build ----
# A token where docs/operations.md puts Prometheus's copy, if there is none:
# .dockerignore must keep it out of the build stage.
if [ ! -e "$root/deploy/slotd_token" ]; then
  decoy=$root/deploy/slotd_token
  (umask 077 && echo image-test-decoy-token-0123456789 >"$decoy")
fi
build=("${pm[@]}" build --format docker --network host "${limits[@]}" --build-arg "BASE=$base" -f "$root/Dockerfile")
t0=$SECONDS
if "${build[@]}" -t "$image" "$root" >"$dir/build.log" 2>&1; then
  pass "podman build of the Dockerfile on $base ($((SECONDS - t0)) s; log: $dir/build.log)"
else
  tail -n 30 "$dir/build.log"; fail "podman build (log: $dir/build.log)"; exit 1
fi
# The build stage again, from the cache, to look inside it.
if "${build[@]}" --target build -t localhost/slotd-build:ci "$root" >>"$dir/build.log" 2>&1; then
  leaked=$("${pm[@]}" run --rm --network host "${limits[@]}" localhost/slotd-build:ci \
    sh -c 'ls -d /src/deploy/slotd_token /src/build-* /src/.git 2>/dev/null')
  check "the build stage holds no token and no host build tree${leaked:+ (found: $leaked)}" test -z "$leaked"
else
  fail "podman build --target build"
fi

hc=$("${pm[@]}" image inspect --format '{{json .Config.Healthcheck}}' "$image" 2>/dev/null)
check "the image keeps its HEALTHCHECK ($hc)" bash -c '[[ $1 == *slotd-cli* ]]' _ "$hc"
uid=$(sed -n 's/.*useradd.*--uid \([0-9]*\).*/\1/p' "$root/Dockerfile")

# ---- Run ----
port=$(free_port) && admin=$(free_port "$port") || { fail "no free port"; exit 1; }
run=("${pm[@]}" run --network host "${limits[@]}" -e SLOTD_PORT="$port" -e SLOTD_ADMIN_PORT="$admin"
  --health-interval disable)

out=$("${run[@]}" --rm "$image" 2>&1)
rc=$?
# (podman also logs that it cannot reach systemd for a health check timer:
# the checks below run the health check themselves.)
said=$(grep -m 1 '^slotd:' <<<"$out")
check "without a token the image refuses to start (exit $rc): ${said:-$(head -c 200 <<<"$out")}" \
  bash -c '[ "$1" = 2 ] && [[ $2 == *"protected mode"* ]]' _ "$rc" "$said"

# As docs/operations.md runs it: the token in a file of mode 600 owned by
# the image's slotd user, mounted read-only.
token=image-test-token-0123456789abcdef
printf '%s\n' "$token" >"$work/token"
chmod 600 "$work/token"
chown "${uid:-10001}:${uid:-10001}" "$work/token"
cid=$("${run[@]}" -d -v "$work/token:/run/secrets/slotd_token:ro" \
  -e SLOTD_AUTH_TOKEN_FILE=/run/secrets/slotd_token "$image" 2>"$work/run.err")
[ -n "$cid" ] || { cat "$work/run.err"; fail "podman run -d"; exit 1; }
echo "image: container ${cid:0:12}, SLOTD_PORT=$port SLOTD_ADMIN_PORT=$admin"

healthy() {
  "${pm[@]}" healthcheck run "$cid" >/dev/null 2>&1
  [ "$("${pm[@]}" inspect --format '{{.State.Health.Status}}' "$cid" 2>/dev/null)" = healthy ]
}
check "its HEALTHCHECK reports healthy" wait_for 20 healthy
pid=$("${pm[@]}" inspect --format '{{.State.Pid}}' "$cid")
puid=$(ps -o uid= -p "$pid" 2>/dev/null | tr -d ' ')
check "the daemon runs as the image's user, UID ${uid:-?} (found ${puid:-none})" test -n "$uid" -a "$puid" = "$uid"

replies=()
if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
  printf '%s\n' "{\"op\":\"auth\",\"token\":\"$token\"}" '{"op":"start","id":"a","prompt":[0,1,2]}' \
    '{"op":"step","id":"a","n":5}' '{"op":"finish","id":"a"}' >&3
  for _ in 1 2 3 4; do
    IFS= read -r -t 5 line <&3 || break
    replies+=("$line")
  done
  exec 3>&-
fi
check "a session against the container: ${replies[*]:-no reply}" \
  bash -c '[ "$1" = "{\"ok\":true}" ] && [ "$2" = "{\"id\":\"a\",\"model\":\"tiny\",\"entries\":3,\"cached\":0}" ] &&
           [[ $3 == "{\"id\":\"a\",\"tokens\":[4,0,0,0,0],"*"\"entries\":8}" ]] &&
           [ "$4" = "{\"id\":\"a\",\"released\":8}" ]' _ "${replies[@]:0:4}" "" "" "" ""

"${pm[@]}" stop -t 15 "$cid" >/dev/null 2>&1
rc=$("${pm[@]}" inspect --format '{{.State.ExitCode}}' "$cid" 2>/dev/null)
check "podman stop: the daemon drains and exits 0 (got ${rc:-none})" test "$rc" = 0

# Images left by earlier builds (a cached layer of this one is kept).
"${pm[@]}" image prune -f >/dev/null 2>&1

[ $failed -eq 0 ]
