# Helpers that keep the per-layer targets uniform.
#
# kiln_add_test(NAME name SOURCES ... LIBS ... [TIMEOUT seconds] [LABELS ...])
#   A GoogleTest executable registered with ctest as one test with a time budget
#   (default 60 s): every test has a budget so the suite stays well inside its limit.
function(kiln_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 60)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive;KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
