# Runs a command that must FAIL: non-zero exit, within MAX_SECONDS, with output matching
# EXPECT. Used for the "one rank fails -> the whole job ends" tests.
#   cmake -DCMD="mpirun|-np|2|prog|mode" -DEXPECT=regex -DMAX_SECONDS=40 -P expect_failure.cmake
string(REPLACE "|" ";" cmd "${CMD}")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message("---- output (exit status: ${rc}, ${elapsed} s) ----\n${out}${err}----")
if("${rc}" STREQUAL "0")
  message(FATAL_ERROR "expected a non-zero exit status, got 0")
endif()
if("${rc}" MATCHES "timeout")
  message(FATAL_ERROR "the job hung: still running after ${MAX_SECONDS} s")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}'")
endif()
message("ok: failed with status ${rc} in ${elapsed} s, output matches '${EXPECT}'")
