/* A fixture for scripts/check_doc_refs.py's own test (tests/layout/
 * selftest.sh); not built.  Good: docs/design.md, "Pipelining" and
 * "server/ layout"; "Scheduler" (a heading's name before its colon).
 * Stale: docs/nowhere.md; docs/design.md, "No such section". */
