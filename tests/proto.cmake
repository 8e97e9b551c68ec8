# proto/: framing, request parsing and validation, reply writing, the PROXY
# protocol header.
slotd_check_test(test_proto SOURCES test_proto.c LIBS slotd_proto cjson ${MATH_LIB})
slotd_check_test(test_reply SOURCES test_reply.c LIBS slotd_proto ${MATH_LIB})
slotd_check_test(test_proxy SOURCES test_proxy.c LIBS slotd_proto)
