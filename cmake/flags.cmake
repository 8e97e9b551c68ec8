# Per-target flags: every slotd target links slotd_flags (warnings and the
# sanitizer); model code additionally links slotd_fp_strict.  Nothing here
# touches the global CMAKE_C_FLAGS.  -Wswitch-enum: a switch over an enum
# names every value, so that a new op, type or state is an error wherever
# it must be handled (a `default:` does not silence it).

set(SANITIZER "none" CACHE STRING "Sanitizer build: none, address (ASan+UBSan), undefined, thread")
set_property(CACHE SANITIZER PROPERTY STRINGS none address undefined thread)
option(SLOTD_FAULT_INJECTION "Build test-only fault hooks (cache corruption, wedged worker)" OFF)

add_library(slotd_flags INTERFACE)
target_compile_options(slotd_flags INTERFACE
  -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wswitch-enum
  -Wno-unused-parameter -fno-strict-aliasing)
target_compile_definitions(slotd_flags INTERFACE _POSIX_C_SOURCE=200809L _DEFAULT_SOURCE)

if(SANITIZER STREQUAL "address")
  set(_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(SANITIZER STREQUAL "undefined")
  set(_san -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(SANITIZER STREQUAL "thread")
  set(_san -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT SANITIZER STREQUAL "none")
  message(FATAL_ERROR "SANITIZER must be none, address, undefined or thread (got '${SANITIZER}')")
endif()
if(_san)
  target_compile_options(slotd_flags INTERFACE ${_san})
  target_link_options(slotd_flags INTERFACE ${_san})
endif()
if(SLOTD_FAULT_INJECTION)
  target_compile_definitions(slotd_flags INTERFACE SLOTD_FAULT_INJECTION=1)
endif()

# The model code must evaluate every floating-point expression exactly as
# written: no fused multiply-add, no reassociation.
add_library(slotd_fp_strict INTERFACE)
target_compile_options(slotd_fp_strict INTERFACE -ffp-contract=off -fno-fast-math)
