# ctest step: fa4 as a dependency of another CMake project (tests/package/consumer).
#   MODE=install      cmake --install the build tree FA4_BUILD into WORK/prefix, configure and build
#                     the consumer with find_package(fa4), run it
#   MODE=subdirectory configure the consumer with add_subdirectory(FA4_SOURCE): fa4's tests,
#                     scheduler and tools must stay off there unless asked
# Other inputs: CONSUMER (its sources), WORK (a scratch directory), GENERATOR, CUDA_COMPILER.
file(REMOVE_RECURSE "${WORK}")
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
  run("cmake --install" ${CMAKE_COMMAND} --install "${FA4_BUILD}" --prefix "${WORK}/prefix")
  foreach(f include/fa4/attention.h lib/cmake/fa4/fa4Config.cmake lib/cmake/fa4/fa4ConfigVersion.cmake
            lib/cmake/fa4/fa4Targets.cmake)
    if(NOT EXISTS "${WORK}/prefix/${f}")
      message(FATAL_ERROR "the install lacks ${f}")
    endif()
  endforeach()
  run("configuring the consumer" ${CMAKE_COMMAND} -S "${CONSUMER}" -B "${WORK}/build" -G "${GENERATOR}"
      "-DCMAKE_PREFIX_PATH=${WORK}/prefix")
  run("building the consumer" ${CMAKE_COMMAND} --build "${WORK}/build")
  run("running the consumer" "${WORK}/build/consumer")
  message(STATUS "consumer said:\n${last_output}")
elseif(MODE STREQUAL "subdirectory")
  run("configuring the consumer over fa4's sources" ${CMAKE_COMMAND} -S "${CONSUMER}" -B "${WORK}/build"
      -G "${GENERATOR}" "-DFA4_SOURCE_DIR=${FA4_SOURCE}" "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}")
  file(STRINGS "${WORK}/build/CMakeCache.txt" cache REGEX "^FA4_(BUILD_TESTS|BUILD_SCHEDULER|BUILD_TOOLS|INSTALL):BOOL=")
  foreach(line IN LISTS cache)
    if(NOT line MATCHES "=OFF$")
      message(FATAL_ERROR "inside another project fa4 should build only its library, but ${line}")
    endif()
  endforeach()
  list(LENGTH cache n)
  if(NOT n EQUAL 4)
    message(FATAL_ERROR "expected four FA4_ options in the consumer's cache, found: ${cache}")
  endif()
  message(STATUS "add_subdirectory: ${cache}")
else()
  message(FATAL_ERROR "MODE must be install or subdirectory")
endif()
