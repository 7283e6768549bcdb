# Finds LibTorch in the Python environment that will import the package, when CMAKE_PREFIX_PATH
# does not already lead to it (scripts/setup.sh passes torch.utils.cmake_prefix_path; `pip install .`
# does not).
#
# Under `pip install .` the build runs in pip's isolated build environment: pip's sitecustomize
# hides the venv's site-packages from the build backend, so `import torch` fails there, and
# putting torch into build-system.requires would download a second torch into that environment
# and build against it. The interpreter itself is the venv's (scikit-build-core passes it as
# Python_EXECUTABLE), and `python -E` ignores PYTHONPATH, which is how pip installs its overlay: so
# `python -E -c "import torch"` sees the venv's own torch, the one the package will run with.
# HARNESS_TORCH_PYTHON names another interpreter to ask.
# (Checked by hand, not with find_package: the root's find_package(Torch) must be the first, after
# it has set USE_CUDA and TORCH_CUDA_ARCH_LIST.)
set(_harness_torch_given OFF)
if(Torch_DIR OR DEFINED ENV{Torch_DIR})
  set(_harness_torch_given ON)
endif()
foreach(_harness_prefix IN LISTS CMAKE_PREFIX_PATH)
  if(EXISTS "${_harness_prefix}/Torch/TorchConfig.cmake" OR EXISTS "${_harness_prefix}/share/cmake/Torch/TorchConfig.cmake")
    set(_harness_torch_given ON)
  endif()
endforeach()
if(NOT _harness_torch_given)
  set(_harness_python "${HARNESS_TORCH_PYTHON}")
  if(NOT _harness_python AND Python_EXECUTABLE)
    set(_harness_python "${Python_EXECUTABLE}")
  endif()
  if(NOT _harness_python)
    find_program(_harness_python NAMES python3 python)
  endif()
  if(_harness_python)
    execute_process(
      COMMAND "${_harness_python}" -E -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _harness_torch_prefix ERROR_VARIABLE _harness_torch_error
      RESULT_VARIABLE _harness_torch_status OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_harness_torch_status EQUAL 0 AND EXISTS "${_harness_torch_prefix}")
      message(STATUS "harness: LibTorch of ${_harness_python}: ${_harness_torch_prefix}")
      list(APPEND CMAKE_PREFIX_PATH "${_harness_torch_prefix}")
    else()
      message(FATAL_ERROR "harness: LibTorch not found: CMAKE_PREFIX_PATH has no Torch config and "
              "${_harness_python} cannot import torch (${_harness_torch_error}). Install torch into the "
              "venv first (pip install torch==2.11.0), or pass -DCMAKE_PREFIX_PATH=<torch.utils.cmake_prefix_path>; "
              "with a build frontend whose isolated environment has its own interpreter (not pip), build "
              "with --no-build-isolation or set HARNESS_TORCH_PYTHON.")
    endif()
  endif()
endif()
