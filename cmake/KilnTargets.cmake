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
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)  # support/
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive;KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# kiln_add_isa_variant(TEST name FILTER gtest-filter [TIMEOUT seconds])
#   Registers `name_avx2`: the test program `name` again, for the tests that FILTER
#   selects, with oneDNN capped at AVX2 (DNNL_MAX_CPU_ISA=AVX2). There Debian's oneDNN
#   2.6 has no bf16/fp16 matrix kernels, so the fp32-compute path of low-precision GEMMs
#   (src/backend/cpu/gemm.h) is tested whatever CPU runs the suite; the plain test covers
#   the CPU's own path.
function(kiln_add_isa_variant)
  cmake_parse_arguments(V "" "TEST;FILTER;TIMEOUT" "ENV" ${ARGN})
  if(NOT V_TIMEOUT)
    set(V_TIMEOUT 120)
  endif()
  add_test(NAME ${V_TEST}_avx2 COMMAND ${V_TEST} --gtest_filter=${V_FILTER})
  get_test_property(${V_TEST} ENVIRONMENT env)
  get_test_property(${V_TEST} LABELS labels)
  set_tests_properties(${V_TEST}_avx2 PROPERTIES TIMEOUT ${V_TIMEOUT}
    ENVIRONMENT "${env};DNNL_MAX_CPU_ISA=AVX2")
  if(labels)
    set_tests_properties(${V_TEST}_avx2 PROPERTIES LABELS "${labels};avx2")
  else()
    set_tests_properties(${V_TEST}_avx2 PROPERTIES LABELS avx2)
  endif()
endfunction()
