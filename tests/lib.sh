# tests/lib.sh: helpers shared by the shell tests (scaleout.sh,
# test_config_env.sh, test_dockerfile.sh).  Sourced, not run.  The caller
# sets `passed` and `failed` to 0 before using pass/fail/check.

pass() { passed=$((passed + 1)); echo "PASS: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
# check DESCRIPTION COMMAND...: PASS if the command succeeds.
check() {
  local what=$1; shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

# wait_for SECONDS COMMAND...: polls every 0.1 s until the command succeeds.
wait_for() {
  local limit=$(($(now_ms) + $1 * 1000)); shift
  until "$@"; do
    [ "$(now_ms)" -ge $limit ] && return 1
    sleep 0.1
  done
}

# free_port [TAKEN...]: a loopback TCP port nothing listens on, below the
# usual ephemeral range, and none of TAKEN (ports picked but not yet bound;
# called as $(free_port), it cannot remember them itself).
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))
    case " $* " in *" $p "*) continue ;; esac
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}

trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; echo "${s%"${s##*[![:space:]]}"}"; }

# unsent PORT: bytes a daemon listening on PORT has written to a client
# connection and the kernel cannot send (the client's receive window is
# full): the tx_queue of the daemon's end in /proc/net/tcp, the largest if
# several.
unsent() {
  local hex
  hex=$(awk -v p="$(printf ':%04X' "$1")" '$2 ~ (p "$") && $4 == "01" { split($5, q, ":"); print q[1] }' \
    /proc/net/tcp 2>/dev/null | sort | tail -n 1)
  echo $((16#${hex:-0}))
}
