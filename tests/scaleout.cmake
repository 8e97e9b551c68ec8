# Operations: bash scripts that run the built binaries (test_run_sh alone
# builds, in a scratch tree of its own).
#   scaleout         three daemons with a token behind HAProxy on the
#                    committed deploy/haproxy.cfg (started under ulimit -n
#                    20000), driven by slotd-bench --verify with the token
#                    (and refused without it), with an instance
#                    killed, restarted and drained; Prometheus and
#                    Alertmanager on the deploy/ files deliver SlotdDown
#                    for the killed instance to a webhook receiver
#   test_dockerfile  the Dockerfile against the scripts, Debian 12's
#                    packages and the daemon started as its CMD says
#   test_config_env  flags and SLOTD_* variables, and their table in
#                    docs/operations.md
#   test_quickstart  the README's nc session word for word, and that
#                    scripts/deps.sh installs what the quick start runs
#   test_run_sh      scripts/run.sh in a scratch tree with no build/ and a
#                    stand-in deps.sh: one line per phase, only slotd and
#                    slotd-cli built, the daemon started on the ports given
#   test_haproxy_proxy  a client's address through HAProxy on the committed
#                    deploy/haproxy.cfg (send-proxy-v2) into an instance's
#                    GET /sessions and log with --proxy-from, and not without
#   test_units       deploy/slotd.service and slotd@.service: systemd-analyze
#                    verify, printed as they are in docs/operations.md, and
#                    their ExecStart run as systemd runs it, with a token
#   test_bench_prefix  slotd-bench --shared-prefix --verify against a daemon
#                    with the prefix cache on (0 mismatches, at least half
#                    the prompt entries cached) and one with it off (0
#                    cached)
# A missing tool (haproxy, prometheus, prometheus-alertmanager, socat,
# curl, openssl, python3, systemd-analyze) or binary fails a test; it is
# never skipped (scripts/deps.sh --test installs the tools).  `ctest -L
# scaleout` runs them.

find_program(BASH_EXECUTABLE bash REQUIRED)

set(_ops_bins "$<TARGET_FILE:slotd>;$<TARGET_FILE:slotd-bench>")
set(_ops_env "SLOTD_BIN=$<TARGET_FILE:slotd>;SLOTD_BENCH=$<TARGET_FILE:slotd-bench>")

add_test(NAME scaleout
  COMMAND ${BASH_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scaleout.sh ${PROJECT_BINARY_DIR})
# Serial: its checks have deadlines (HAProxy marks an instance down within
# 3 s) that a machine busy with other tests could miss.  About a minute,
# half of it waiting for SlotdDown's `for: 30s`.
set_tests_properties(scaleout PROPERTIES
  ENVIRONMENT "${_ops_env}" REQUIRED_FILES "${_ops_bins}"
  TIMEOUT 240 RUN_SERIAL TRUE LABELS "scaleout;integration")

foreach(_ops test_dockerfile test_config_env test_quickstart test_haproxy_proxy test_units)
  add_test(NAME ${_ops}
    COMMAND ${BASH_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/${_ops}.sh ${PROJECT_BINARY_DIR})
  set_tests_properties(${_ops} PROPERTIES
    ENVIRONMENT "${_ops_env}" REQUIRED_FILES "$<TARGET_FILE:slotd>"
    TIMEOUT 120 LABELS "scaleout;integration")
endforeach()

add_test(NAME test_bench_prefix
  COMMAND ${BASH_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_prefix.sh ${PROJECT_BINARY_DIR})
set_tests_properties(test_bench_prefix PROPERTIES
  ENVIRONMENT "${_ops_env}" REQUIRED_FILES "${_ops_bins}"
  TIMEOUT 120 LABELS "scaleout;integration")

# The committed deploy/ files: HAProxy accepts its configuration (with
# example addresses), promtool accepts the Prometheus configuration and its
# rules, the alert rules pass their unit tests (deploy/slotd_alerts_test.yml),
# amtool accepts the Alertmanager configuration, and it routes each
# severity the rules use to its receiver.  The token and the certificate
# the files name are made in a scratch copy.
add_test(NAME deploy_configs
  COMMAND sh -c [[
    for t in haproxy promtool amtool openssl; do
      command -v $t >/dev/null || { echo "FAIL: $t not installed (scripts/deps.sh --test)"; exit 1; }
    done
    tmp=$(mktemp -d) || exit 1
    trap 'rm -rf "$tmp"' EXIT
    cp "$1"/*.yml "$tmp"/ && umask 077 && echo deploy-check-token-0123456789 >"$tmp/slotd_token" &&
      openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=slotd -days 1 \
        -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null &&
      cat "$tmp/cert.pem" "$tmp/key.pem" >"$tmp/slotd.pem" || exit 1
    SLOTD_LB_TLS_BIND=127.0.0.1:7443 SLOTD_LB_TLS_CERT="$tmp/slotd.pem" \
    SLOTD_LB_BIND=127.0.0.1:7000 SLOTD_LB_STATS=127.0.0.1:7001 \
    SLOTD_S1=10.0.0.5:7070 SLOTD_S1_ADMIN_ADDR=127.0.0.1 SLOTD_S1_ADMIN_PORT=7171 \
    SLOTD_S2=10.0.0.6:7070 SLOTD_S2_ADMIN_ADDR=127.0.0.1 SLOTD_S2_ADMIN_PORT=7271 \
    SLOTD_S3=10.0.0.7:7070 SLOTD_S3_ADMIN_ADDR=127.0.0.1 SLOTD_S3_ADMIN_PORT=7371 \
    haproxy -c -f "$1/haproxy.cfg" || exit 1
    promtool check config "$tmp/prometheus.yml" || exit 1
    promtool test rules "$1/slotd_alerts_test.yml" || exit 1
    amtool check-config "$1/alertmanager.yml" || exit 1
    sevs=$(sed -n 's/.*labels: *{severity: *\([a-z]*\)}.*/\1/p' "$1/slotd_alerts.yml" | sort -u)
    [ "$sevs" = "$(printf 'page\nwarn')" ] || { echo "FAIL: severities in the rules: $sevs"; exit 1; }
    for sev in $sevs; do
      amtool config routes test --config.file="$1/alertmanager.yml" --verify.receivers="slotd-$sev" \
        severity=$sev alertname=SlotdDown instance=a:7171 || exit 1
    done
  ]] sh ${PROJECT_SOURCE_DIR}/deploy)
# run.sh builds from scratch, about a minute on two cores (more while
# other tests build): heavy, so the sanitizer stages and `ctest -LE heavy`
# leave it out.  It runs no sanitized binary and needs none built.
add_test(NAME test_run_sh COMMAND ${BASH_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_run_sh.sh)
set_tests_properties(test_run_sh PROPERTIES TIMEOUT 600 LABELS "scaleout;heavy")

# Not `unit`: the valgrind stage runs those under memcheck, and here that
# would check the shell (dash leaks a string of its `trap`), not slotd.
set_tests_properties(deploy_configs PROPERTIES TIMEOUT 60 LABELS "scaleout")
