# ctest step: regenerate a kernel header from its graph and compare it with the checked-in copy.
#   cmake -DCLI=fa4-schedule -DGRAPH=g.graph -DFRESH=out.h -DCHECKED_IN=ref.h -P check_generated.cmake
get_filename_component(fresh_dir "${FRESH}" DIRECTORY)
file(MAKE_DIRECTORY "${fresh_dir}")
execute_process(COMMAND "${CLI}" "${GRAPH}" --emit-header "${FRESH}"
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fa4-schedule failed on ${GRAPH} (exit ${rc}): ${err}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -E compare_files "${FRESH}" "${CHECKED_IN}"
                RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "${CHECKED_IN} is stale: the graph now gives ${FRESH}.\n"
                      "Regenerate: fa4-schedule ${GRAPH} --emit-header ${CHECKED_IN}")
endif()
