# lunajit_gtest(<target> [BATCH [<name>=]<pattern>...] [LABELS ...] [TIMEOUT s]
#               [DISCOVERY_TIMEOUT s])
#
# Registers a GoogleTest executable with ctest: each BATCH pattern (a
# --gtest_filter wildcard, e.g. "Families/LinearAttentionOp.*") becomes one
# ctest test, named <name> or the pattern less its trailing ".*", that runs
# every matching case in one process (COST 1000: a fresh clone, which has no
# timing data yet, starts the batches first, so none of them is a tail at the
# end of the run), and every other case
# is discovered one ctest test per case (gtest_discover_tests, TEST_FILTER
# excluding the batches), so a suite added later is never missed.
#
# Why batches: each ctest test is a process, and a process of these
# executables pays for loading LibTorch (0.7-1.0 s here) or LLVM and the host
# JIT's first compile before its first case. Measured on the 2-core CI machine
# (2026-12-06): Families/LinearAttentionOp's 156 cases took 148 s as 156
# processes and 2.5 s as one; AllFamilies/ForwardHost's 108 took 122 s and 74 s
# (cold kernel cache, -j1). The big parameterised suites are batched; the
# failing cases of a batch are named in its output (ctest --output-on-failure),
# and `<exe> --gtest_filter=...` reruns one.
#
# Each batch is labelled gtest_batch_<target> (the Makefile's asan-test skips
# the batches of executables it did not build). A batch that selects no case fails (gtest prints "[  PASSED  ] 0 tests."
# and exits 0 when a filter matches nothing, e.g. after a rename).
function(lunajit_gtest target)
  cmake_parse_arguments(ARG "" "TIMEOUT;DISCOVERY_TIMEOUT" "BATCH;LABELS" ${ARGN})
  if(NOT ARG_DISCOVERY_TIMEOUT)
    set(ARG_DISCOVERY_TIMEOUT 60)
  endif()
  set(props "")
  if(ARG_TIMEOUT)
    list(APPEND props TIMEOUT ${ARG_TIMEOUT})
  endif()
  if(ARG_LABELS)
    list(JOIN ARG_LABELS "\\;" labels_escaped)
    list(APPEND props LABELS "${labels_escaped}")
  endif()
  set(excluded "")
  foreach(entry IN LISTS ARG_BATCH)
    if(entry MATCHES "^([^=]+)=(.+)$")
      set(name "${CMAKE_MATCH_1}")
      set(pattern "${CMAKE_MATCH_2}")
    else()
      set(pattern "${entry}")
      string(REGEX REPLACE "\\.\\*$" "" name "${pattern}")
    endif()
    add_test(NAME "${name}" COMMAND ${target} "--gtest_filter=${pattern}")
    set_tests_properties("${name}" PROPERTIES FAIL_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests" COST 1000)
    if(ARG_TIMEOUT)
      set_tests_properties("${name}" PROPERTIES TIMEOUT ${ARG_TIMEOUT})
    endif()
    # gtest_batch_<target>: a build that builds only some test executables
    # (make asan-test) excludes the batches of the others by this label, as
    # gtest_discover_tests names their cases <target>_NOT_BUILT.
    set(batch_labels ${ARG_LABELS} "gtest_batch_${target}")
    set_tests_properties("${name}" PROPERTIES LABELS "${batch_labels}")
    list(APPEND excluded "${pattern}")
  endforeach()
  set(filter_args "")
  if(excluded)
    list(JOIN excluded ":" joined)
    set(filter_args TEST_FILTER "-${joined}")
  endif()
  if(props)
    gtest_discover_tests(${target} DISCOVERY_TIMEOUT ${ARG_DISCOVERY_TIMEOUT} ${filter_args} PROPERTIES ${props})
  else()
    gtest_discover_tests(${target} DISCOVERY_TIMEOUT ${ARG_DISCOVERY_TIMEOUT} ${filter_args})
  endif()
endfunction()
