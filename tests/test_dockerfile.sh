#!/usr/bin/env bash
# Checks the Dockerfile without a container engine: what it says is
# compared with the scripts, the built daemon and Debian 12's packages, and
# the daemon is started exactly as the image's CMD would start it.
#
#   tests/test_dockerfile.sh [BUILD_DIR]   (or SLOTD_BUILD_DIR; default build/)
#
# SLOTD_BIN names the daemon if it is not BUILD_DIR/server/slotd (CTest
# passes it).  Each check prints PASS, FAIL or SKIP; the exit status is 1 if
# any failed.  A check is skipped only when this machine cannot answer it
# (no apt package lists, not a dpkg system).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${SLOTD_BUILD_DIR:-$root/build}}
slotd=${SLOTD_BIN:-$build/server/slotd}
dockerfile=$root/Dockerfile
. "$root/tests/lib.sh"

passed=0
failed=0
skipped=0
skip() { skipped=$((skipped + 1)); echo "SKIP: $*"; }

daemon=""
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-dockerfile.XXXXXX") || exit 1
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -KILL "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
  fi
  if [ $failed -gt 0 ] && [ -s "$work/daemon.log" ]; then
    echo "--- daemon log"; tail -n 20 "$work/daemon.log"
  fi
  rm -rf "$work"
  echo "dockerfile: $passed passed, $failed failed, $skipped skipped"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

[ -f "$dockerfile" ] || { fail "no $dockerfile"; exit 1; }
[ -x "$slotd" ] || { fail "no daemon at $slotd (build first: scripts/build.sh)"; exit 1; }

# ---- Parsing ----
# One line per instruction: "STAGE<TAB>KEYWORD<TAB>ARGUMENTS", continuation
# lines joined, comments dropped, STAGE counting FROMs from 0.
awk '
  function flush() {
    if (cur != "") {
      kw = toupper(cur); sub(/[ \t].*/, "", kw)
      args = cur; sub(/^[^ \t]+[ \t]*/, "", args)
      if (kw == "FROM") stage++
      printf "%d\t%s\t%s\n", stage, kw, args
    }
    cur = ""
  }
  BEGIN { stage = -1; cur = "" }
  /^[ \t]*#/ { next }
  /^[ \t]*$/ { if (cur == "") next }
  {
    line = $0
    if (line ~ /\\[ \t]*$/) { sub(/\\[ \t]*$/, "", line); cur = cur line; next }
    cur = cur line; flush()
  }
  END { flush() }
' "$dockerfile" >"$work/instructions"

# instr STAGE KEYWORD: the arguments of each such instruction, one a line.
instr() { awk -F'\t' -v s="$1" -v k="$2" '$1 == s && $2 == k { print $3 }' "$work/instructions"; }

last=$(awk -F'\t' '$2 == "FROM" { n = $1 } END { print n }' "$work/instructions")
# The build stage: the one the runtime stage copies from.
from_name=$(instr "$last" COPY | grep -o -- '--from=[^ ]*' | head -n 1 | cut -d= -f2)
build_stage=$(awk -F'\t' -v n="$from_name" '$2 == "FROM" && tolower($3) ~ ("[ \t]as[ \t]+" tolower(n) "$") { print $1 }' "$work/instructions")
if [ -z "$from_name" ] || [ -z "$build_stage" ]; then
  fail "the last stage copies nothing from a named build stage"
  exit 1
fi

# ---- The build stage runs exactly the scripts CI uses ----

cmds=()
while IFS= read -r run; do
  rest=$run
  while [ -n "$rest" ]; do
    part=${rest%%&&*}
    [ "$part" = "$rest" ] && rest="" || rest=${rest#*&&}
    cmds+=("$(trim "$part")")
  done
done < <(instr "$build_stage" RUN)
build_dir=""
build_san=""
shape=""
for c in "${cmds[@]}"; do
  case $c in
    scripts/deps.sh) shape+=D ;;
    "scripts/build.sh" | "scripts/build.sh "*)
      shape+=B
      read -r _ build_dir build_san extra <<<"$c"
      ;;
    *) shape+=X ;;
  esac
done
build_dir=${build_dir:-build}
check "build stage runs exactly scripts/deps.sh then scripts/build.sh (found: $(printf '[%s] ' "${cmds[@]}"))" \
  test "$shape" = DB
check "the image is built without a sanitizer (scripts/build.sh $build_dir ${build_san:-none}: Release)" \
  test "${build_san:-none}" = none -a -z "${extra:-}"

# The context is the working tree: a developer's build/ holds a CMakeCache.txt
# for another path, on which scripts/build.sh fails.  .dockerignore keeps it out.
ignored=1
if [ -f "$root/.dockerignore" ]; then
  while IFS= read -r pat; do
    pat=$(trim "$pat")
    case $pat in "" | "#"* | "!"*) continue ;; esac
    pat=${pat#/}; pat=${pat%/}
    # shellcheck disable=SC2053
    [[ $build_dir == $pat ]] && ignored=0
  done <"$root/.dockerignore"
fi
check ".dockerignore keeps the build tree '$build_dir/' out of the context" test $ignored -eq 0
# The token made next to deploy/prometheus.yml (docs/operations.md) is a
# secret: `COPY . .` must not put it into the build stage.
secret=1
if [ -f "$root/.dockerignore" ]; then
  while IFS= read -r pat; do
    pat=$(trim "$pat")
    case $pat in "" | "#"* | "!"*) continue ;; esac
    pat=${pat#/}
    # shellcheck disable=SC2053
    [[ deploy/slotd_token == $pat || deploy == "${pat%/}" ]] && secret=0
  done <"$root/.dockerignore"
fi
check ".dockerignore keeps the token file deploy/slotd_token out of the context" test $secret -eq 0

# Layer caching: the packages are installed before the sources are copied,
# so that a change to the sources does not install them again.
order=$(awk -F'\t' -v s="$build_stage" '$1 == s && $2 == "RUN" && $3 ~ /scripts\/deps\.sh/ { if (!d) d = NR }
  $1 == s && $2 == "COPY" && $3 ~ /^\.[ \t]/ { if (!c) c = NR } END { print (d && c && d < c) ? "ok" : "no" }' "$work/instructions")
check "the build stage runs scripts/deps.sh before COPY . ." test "$order" = ok

# The base image: every FROM names a digest, directly or through an ARG
# whose default does (the image stage of scripts/test.sh passes its own).
pinned=0
while IFS= read -r from; do
  img=${from%%[ 	]*}
  if [[ $img =~ ^\$\{?([A-Za-z_][A-Za-z_0-9]*)\}?$ ]]; then
    img=$(sed -n "s/^ARG[ \t]\{1,\}${BASH_REMATCH[1]}=//p" "$dockerfile" | head -n 1)
  fi
  [[ $img =~ @sha256:[0-9a-f]{64}$ ]] || { pinned=1; echo "not pinned by digest: FROM $from"; }
done < <(awk -F'\t' '$2 == "FROM" { print $3 }' "$work/instructions")
check "every FROM is pinned by digest" test $pinned -eq 0

# ---- The runtime stage ----

workdir=$(instr "$build_stage" WORKDIR | tail -n 1)
copy=$(instr "$last" COPY | grep -- "--from=$from_name" | head -n 1)
read -r -a copy_words <<<"${copy#--from="$from_name"}"
dest=${copy_words[${#copy_words[@]} - 1]}
unset 'copy_words[${#copy_words[@]}-1]'
want="$workdir/$build_dir/server/slotd"
copied=()
copy_ok=0
for src in "${copy_words[@]}"; do
  copied+=("$(basename "$src")")
  case $src in "$want" | "$want-cli") ;; *) copy_ok=1 ;; esac
done
case " ${copied[*]} " in *" slotd "*) ;; *) copy_ok=1 ;; esac
case $dest in /usr/local/bin/ | /usr/bin/ | /usr/local/bin | /usr/bin) ;; *) copy_ok=1 ;; esac
check "runtime copies the binaries scripts/build.sh made ($want...) into $dest" test $copy_ok -eq 0

user=$(instr "$last" USER | tail -n 1)
user=${user%%:*}
check "runtime runs as a non-root USER ('$user')" \
  test -n "$user" -a "$user" != root -a "$user" != 0
check "runtime stage creates user '$user'" \
  bash -c 'grep -Eq "(useradd|adduser)[^&;]*[[:space:]]$1([[:space:];&]|$)" <<<"$2"' _ "$user" "$(instr "$last" RUN)"
# The guide tells operators to give the token file to this UID.
uid=$(instr "$last" RUN | grep -Eo "useradd[^&;]*" | grep -Eo -- "--uid[ =]+[0-9]+" | grep -Eo "[0-9]+$" | head -n 1)
check "user '$user' has a fixed UID (${uid:-none}) that docs/operations.md gives" \
  bash -c '[ -n "$1" ] && [ "$1" -gt 0 ] && grep -q -- "$1" "$2"' _ "$uid" "$root/docs/operations.md"

help=$("$slotd" --help 2>&1)
default_of() { sed -n "s/^ *--$1 V .*(\([0-9]*\)).*/\1/p" <<<"$help"; }
def_port=$(default_of port)
def_admin=$(default_of admin-port)
exposed=" $(instr "$last" EXPOSE | tr '\n' ' ') "
check "EXPOSE has the daemon's default ports $def_port and $def_admin (EXPOSE$exposed)" \
  test -n "$def_port" -a -n "$def_admin" -a "${exposed/ $def_port /}" != "$exposed" -a "${exposed/ $def_admin /}" != "$exposed"

hc=$(instr "$last" HEALTHCHECK | tail -n 1)
hc_cmd=${hc#*CMD }
[ "$hc_cmd" = "$hc" ] && hc_cmd=""
check "HEALTHCHECK asks slotd-cli health at SLOTD_ADMIN_LISTEN and SLOTD_ADMIN_PORT ($hc_cmd)" \
  bash -c '[[ $1 == "slotd-cli "*" health"* ]] && [[ $1 == *"SLOTD_ADMIN_PORT:-$2}"* ]] &&
           [[ $1 == *"SLOTD_ADMIN_LISTEN:-127.0.0.1}"* ]]' _ "$hc_cmd" "$def_admin"

# CMD (and ENTRYPOINT, if any) as JSON arrays of plain strings.
json_array() { # prints one element a line; fails on anything else
  local s
  s=$(trim "$1")
  [[ $s == \[*\] ]] || return 1
  [[ $s == *\\* ]] && return 1
  s=${s#[}; s=${s%]}
  local rest
  rest=$(sed -E 's/"[^"]*"//g; s/[[:space:],]//g' <<<"$s")
  [ -z "$rest" ] || return 1
  grep -o '"[^"]*"' <<<"$s" | sed 's/^"//; s/"$//'
}
argv=()
entry=$(instr "$last" ENTRYPOINT | tail -n 1)
if [ -n "$entry" ]; then
  mapfile -t e < <(json_array "$entry") || true
  argv+=("${e[@]}")
fi
cmd=$(instr "$last" CMD | tail -n 1)
if mapfile -t c < <(json_array "$cmd") && [ ${#c[@]} -gt 0 ] && json_array "$cmd" >/dev/null; then
  argv+=("${c[@]}")
else
  fail "CMD is not a JSON array of strings: $cmd"
fi
envs=()
while IFS= read -r line; do # ENV K=V [K=V...] or ENV K V
  if [[ $line == *=* ]]; then
    read -r -a kv <<<"$line"; envs+=("${kv[@]}")
  else
    envs+=("${line%% *}=$(trim "${line#* }")")
  fi
done < <(instr "$last" ENV)

# ---- Runtime packages ----

mapfile -t pkgs < <(instr "$last" RUN | tr '&;\\' '\n\n\n' | grep 'apt-get install' |
  sed 's/.*apt-get install//' | tr ' ' '\n' | grep -v '^-' | grep -v '^$')
if [ ${#pkgs[@]} -eq 0 ]; then
  fail "the runtime stage installs no packages"
elif ! command -v apt-cache >/dev/null || ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then
  skip "runtime packages in Debian 12: no apt package lists here (apt-get update)"
elif ! grep -q '^VERSION_ID="12"' /etc/os-release 2>/dev/null; then
  skip "runtime packages in Debian 12: this machine is not Debian 12"
else
  # One apt-cache call: each package's block starts "name:" and gives its
  # "Candidate:"; an unknown package has no block at all.
  have=" $(apt-cache policy "${pkgs[@]}" 2>/dev/null | awk '
    /^[^ ]/ { sub(/:$/, ""); name = $0 }
    /^ *Candidate:/ && $2 != "(none)" { print name }' | tr '\n' ' ') "
  missing=()
  for p in "${pkgs[@]}"; do
    case $have in *" $p "*) ;; *) missing+=("$p") ;; esac
  done
  check "runtime packages exist in Debian 12: ${pkgs[*]}${missing:+ (no candidate: ${missing[*]})}" \
    test ${#missing[@]} -eq 0
fi

# Every shared library of the copied binaries comes from a runtime package
# or from the base image: an Essential package, or one an Essential package
# depends on (libc6), which debian:12-slim always has.
sanitized=$(ldd "$slotd" 2>/dev/null | grep -o 'lib[a-z]*san[.][^ ]*' | head -n 1)
if [ -n "$sanitized" ]; then
  skip "library coverage: $slotd is a sanitizer build ($sanitized); the image's is not"
elif command -v dpkg >/dev/null && command -v ldd >/dev/null; then
  base=" $(dpkg-query -W -f='${Package}\t${Essential}\t${Pre-Depends}, ${Depends}\n' |
    awk -F'\t' '$2 == "yes" { print $1; n = split($3, d, /,/)
      for (i = 1; i <= n; i++) { split(d[i], w, /[ :(|]+/); if (w[1] == "") print w[2]; else print w[1] } }' |
    sort -u | tr '\n' ' ') "
  uncovered=()
  for b in "${copied[@]}"; do
    bin=$(dirname "$slotd")/$b
    [ -x "$bin" ] || { uncovered+=("$b: not built"); continue; }
    while read -r lib; do
      owner=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null)
      owner=${owner%%:*}
      if [ -z "$owner" ]; then uncovered+=("$lib: no package"); continue; fi
      case " ${pkgs[*]} $base" in *" $owner "*) continue ;; esac
      uncovered+=("$lib ($owner)")
    done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
  done
  check "runtime packages and the base image provide every library of ${copied[*]}${uncovered:+: missing ${uncovered[*]}}" \
    test ${#uncovered[@]} -eq 0
else
  skip "library coverage: not a dpkg system"
fi

# ---- The daemon, started as the CMD starts it ----

[ ${#argv[@]} -gt 0 ] || exit 1
prog=${argv[0]}
case " ${copied[*]} " in
  *" $(basename "$prog") "*) ;;
  *) fail "CMD runs '$prog', which the image does not copy" ;;
esac
argv[0]=$slotd
port=$(free_port) && admin=$(free_port "$port") || { fail "no free port"; exit 1; }
case " ${argv[*]} " in
  *" --port"* | *" --admin-port"*) fail "CMD pins the ports with flags, so SLOTD_PORT cannot move them" ;;
esac

# As in the image: the ENV lines, no other SLOTD_* setting, and the USER's
# UID (nobody's if it has none) when this runs as root.
runas=()
who=$(id -un)
ruid=${uid:-65534}
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  runas=(setpriv --reuid="$ruid" --regid="$ruid" --clear-groups)
  who="uid $ruid"
fi
# Protected mode: the CMD opens the session port to the container's
# interfaces, so without a token it must refuse to start, naming both fixes.
env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ "${envs[@]}" \
  SLOTD_PORT="$port" SLOTD_ADMIN_PORT="$admin" "${runas[@]}" "${argv[@]}" >"$work/open.log" 2>&1
rc=$?
check "without a token the CMD refuses to start (exit $rc): $(head -c 200 "$work/open.log")" \
  bash -c '[ "$1" = 2 ] && grep -q -- "--auth-token-file" "$2" && grep -q -- "--protected-mode no" "$2"' \
  _ "$rc" "$work/open.log"

# As an operator runs the image: the token in a file only its owner (the
# daemon's user) reads, named by SLOTD_AUTH_TOKEN_FILE.
token=dockerfile-test-token-0123456789
printf '%s\n' "$token" >"$work/token"
chmod 600 "$work/token"
[ ${#runas[@]} -gt 0 ] && { chmod 711 "$work"; chown "$ruid:$ruid" "$work/token"; }
env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ "${envs[@]}" SLOTD_AUTH_TOKEN_FILE="$work/token" \
  SLOTD_PORT="$port" SLOTD_ADMIN_PORT="$admin" "${runas[@]}" "${argv[@]}" >"$work/daemon.log" 2>&1 &
daemon=$!
echo "dockerfile: started '${argv[*]}' as $who, SLOTD_PORT=$port SLOTD_ADMIN_PORT=$admin SLOTD_AUTH_TOKEN_FILE"

code=""
for _ in $(seq 100); do
  code=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/health")
  [ "$code" = 200 ] && break
  kill -0 "$daemon" 2>/dev/null || break
  sleep 0.1
done
check "the daemon started by CMD answers /health 200 on SLOTD_ADMIN_PORT (got '$code')" test "$code" = 200
# Every 127/8 address is loopback: one bound to 0.0.0.0 answers on 127.0.0.2,
# one bound to 127.0.0.1 does not.  The CMD opens the session port to the
# container's interfaces and leaves the admin port on its loopback.
code2=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "http://127.0.0.2:$admin/health")
check "the CMD keeps the admin port on loopback (127.0.0.2:$admin answers '$code2')" test "$code2" = 000

if [ -n "$hc_cmd" ]; then
  if [[ $hc_cmd == \[* ]]; then
    mapfile -t h < <(json_array "$hc_cmd")
    hc_run=("${h[@]}")
  else
    hc_run=(sh -c "$hc_cmd")
  fi
  # The image's PATH, with the built slotd-cli where the image has it;
  # as the image's user, with the token file the daemon was given.
  healthcheck() {
    env -i PATH="$(dirname "$slotd"):/usr/local/bin:/usr/bin:/bin" "${envs[@]}" SLOTD_PORT="$port" \
      SLOTD_ADMIN_PORT="$admin" SLOTD_AUTH_TOKEN_FILE="$work/token" "$@" "${runas[@]}" "${hc_run[@]}" >/dev/null 2>&1
  }
  healthcheck_fails() { ! healthcheck "$@"; }
  check "the HEALTHCHECK command passes against it, in the container's environment" healthcheck
  check "the HEALTHCHECK command passes with SLOTD_ADMIN_LISTEN=0.0.0.0" healthcheck SLOTD_ADMIN_LISTEN=0.0.0.0
  check "the HEALTHCHECK command fails when the admin port is elsewhere" \
    healthcheck_fails SLOTD_ADMIN_LISTEN=127.0.0.2
fi

replies=()
if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
  printf '%s\n' "{\"op\":\"auth\",\"token\":\"$token\"}" '{"op":"start","id":"a","prompt":[0,1,2]}' \
    '{"op":"step","id":"a","n":5}' '{"op":"finish","id":"a"}' >&3
  IFS= read -r -t 5 line <&3
  check "auth with the token: ${line:-no reply}" test "$line" = '{"ok":true}'
  for _ in 1 2 3; do
    IFS= read -r -t 5 line <&3 || break
    replies+=("$line")
  done
  exec 3>&-
fi
check "start/step/finish on the session port: ${replies[*]:-no reply}" \
  bash -c '[ "$1" = "{\"id\":\"a\",\"model\":\"tiny\",\"entries\":3,\"cached\":0}" ] &&
           [[ $2 == "{\"id\":\"a\",\"tokens\":[4,0,0,0,0],"*"\"entries\":8}" ]] &&
           [ "$3" = "{\"id\":\"a\",\"released\":8}" ]' _ "${replies[@]:0:3}" "" "" ""

kill -TERM "$daemon"
rc=timeout
for _ in $(seq 100); do
  if ! kill -0 "$daemon" 2>/dev/null; then
    wait "$daemon"; rc=$?; break
  fi
  sleep 0.1
done
check "SIGTERM: the daemon exits with status 0 (got $rc)" test "$rc" = 0
daemon=""
if [ -n "$hc_cmd" ]; then
  check "the HEALTHCHECK command fails once the daemon is gone" healthcheck_fails
fi

[ $failed -eq 0 ]
