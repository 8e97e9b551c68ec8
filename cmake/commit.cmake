# Run at build time (cmake -DSRC=... -DOUT=... -P commit.cmake): writes OUT
# with the source tree's commit as SLOTD_COMMIT ("unknown" outside a git
# checkout, "-dirty" appended when tracked files differ from it), and
# rewrites it only when that changes, so nothing rebuilds for nothing.
# SLOTD_COMMIT in the environment wins (a build without .git, as in the
# Dockerfile's, can be told its commit).
if(DEFINED ENV{SLOTD_COMMIT} AND NOT "$ENV{SLOTD_COMMIT}" STREQUAL "")
  set(commit "$ENV{SLOTD_COMMIT}")
else()
  execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
    OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR commit STREQUAL "")
    set(commit "unknown")
  else()
    execute_process(COMMAND git -C "${SRC}" diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
    if(dirty EQUAL 1)
      set(commit "${commit}-dirty")
    endif()
  endif()
endif()
string(REGEX REPLACE "[^A-Za-z0-9._-]" "_" commit "${commit}")
set(text "#define SLOTD_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
