# ctest package.find_package: installs the build tree into a scratch prefix, checks that the only header
# installed is the single header, then configures, builds and runs tests/package against it.
# Inputs (-D): BUILD_DIR SOURCE_DIR GENERATOR CXX_COMPILER CUDA_COMPILER CONFIG
set(work "${BUILD_DIR}/package_test")
file(REMOVE_RECURSE "${work}")
set(prefix "${work}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})

file(GLOB_RECURSE headers RELATIVE "${prefix}" "${prefix}/include/*")
if(NOT headers STREQUAL "include/gemma4_t4.hpp")
  message(FATAL_ERROR "the install must ship exactly include/gemma4_t4.hpp (the single header), found: ${headers}")
endif()

set(consumer_args -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
                  "-DFIXTURE=${SOURCE_DIR}/tests/fixtures/mm_bf16")
if(CONFIG)
  list(APPEND consumer_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
if(CUDA_COMPILER)
  get_filename_component(cuda_bin "${CUDA_COMPILER}" DIRECTORY)
  get_filename_component(cuda_root "${cuda_bin}" DIRECTORY)
  list(APPEND consumer_args "-DCUDAToolkit_ROOT=${cuda_root}")
endif()
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/package" -B "${work}/build" ${consumer_args})
run("${CMAKE_COMMAND}" --build "${work}/build" ${config_args})
file(GLOB_RECURSE exe "${work}/build/consumer" "${work}/build/*/consumer")
run(${exe})
file(REMOVE_RECURSE "${work}")
