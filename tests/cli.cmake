# slotd-cli against the real daemon on loopback (tests/test_cli.py):
#   test_cli      commands from arguments and stdin, every command's output,
#                 --raw byte for byte, unknown commands, exit statuses
#   test_cli_pty  at a pseudo-terminal: arrow-up, history across runs, Tab
#                 completion, colour and NO_COLOR
# Each then checks the token against a second daemon started with
# --auth-token-file (and, at the terminal, that auth lines stay out of the
# history).
# Both start their own daemon and get the binaries in SLOTD_BIN and
# SLOTD_CLI; `ctest -L cli` runs them.  Neither is labelled valgrind: that
# stage wraps only daemons started through itest.c, while the ASan and TSan
# stages run both with the sanitized client and daemon.  A missing python3
# fails them (scripts/deps.sh --test installs it).

find_package(Python3 COMPONENTS Interpreter)
set(_cli_env "SLOTD_BIN=$<TARGET_FILE:slotd>;SLOTD_CLI=$<TARGET_FILE:slotd-cli>")
foreach(_cli_test IN ITEMS "test_cli;batch" "test_cli_pty;pty")
  list(GET _cli_test 0 _name)
  list(GET _cli_test 1 _mode)
  if(Python3_Interpreter_FOUND)
    add_test(NAME ${_name}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_cli.py ${_mode})
  else()
    add_test(NAME ${_name}
             COMMAND sh -c "echo 'FAIL: python3 not installed (scripts/deps.sh --test)'; exit 1")
  endif()
  set_tests_properties(${_name} PROPERTIES
    ENVIRONMENT "${_cli_env}" REQUIRED_FILES "$<TARGET_FILE:slotd>;$<TARGET_FILE:slotd-cli>"
    TIMEOUT 120 LABELS "integration;cli")
endforeach()
