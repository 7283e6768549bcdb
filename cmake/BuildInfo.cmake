# Build provenance for the env fingerprint: compilers and build type are known at configure
# time; the git commit is re-read on every build so that a binary never reports a stale commit.
set(HARNESS_GENERATED_DIR ${CMAKE_BINARY_DIR}/generated)
set(HARNESS_GIT_COMMIT_OVERRIDE "" CACHE STRING "Commit to report instead of asking git (copies of the tree without their own .git)")
file(MAKE_DIRECTORY ${HARNESS_GENERATED_DIR})

if(HARNESS_HAVE_CUDA)
  set(HARNESS_NVCC_VERSION "${CMAKE_CUDA_COMPILER_VERSION}")
  set(HARNESS_CUDA_ARCHS "${CMAKE_CUDA_ARCHITECTURES}")
else()
  set(HARNESS_NVCC_VERSION "")
  set(HARNESS_CUDA_ARCHS "")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/build_info.h.in ${HARNESS_GENERATED_DIR}/build_info.h @ONLY)

add_custom_target(harness_git_info
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DOUTPUT=${HARNESS_GENERATED_DIR}/git_info.h
          "-DCOMMIT_OVERRIDE=${HARNESS_GIT_COMMIT_OVERRIDE}"
          -P ${CMAKE_CURRENT_LIST_DIR}/GitInfo.cmake
  BYPRODUCTS ${HARNESS_GENERATED_DIR}/git_info.h
  COMMENT "Reading the git commit for the env fingerprint")

add_library(harness_build_info INTERFACE)
target_include_directories(harness_build_info INTERFACE $<BUILD_INTERFACE:${HARNESS_GENERATED_DIR}>)
add_dependencies(harness_build_info harness_git_info)
