# Installs dlock from BUILD_DIR into a scratch prefix, builds the consumer
# project against it with find_package, and runs it on mem:// and file://.
set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" COMMAND_ERROR_IS_FATAL ANY
                OUTPUT_QUIET)
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/consumer"
                        "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
                        "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}"
                COMMAND_ERROR_IS_FATAL ANY OUTPUT_QUIET)
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/consumer" COMMAND_ERROR_IS_FATAL ANY OUTPUT_QUIET)
file(MAKE_DIRECTORY "${WORK_DIR}/locks")
foreach(url "mem://" "file://${WORK_DIR}/locks")
  execute_process(COMMAND "${WORK_DIR}/consumer/acceptance" "${url}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out STREQUAL "ok\n")
    message(FATAL_ERROR "acceptance program on ${url}: exit ${rc}, output '${out}' ${err}")
  endif()
  message(STATUS "acceptance program on ${url}: ok")
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
