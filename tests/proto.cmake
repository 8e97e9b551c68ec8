# proto/: framing, request parsing and validation, reply writing.
slotd_check_test(test_proto SOURCES test_proto.c LIBS slotd_proto cjson ${MATH_LIB})
