# Install rules (the layout is in cmake/InstallLayout.cmake): `cmake --install BUILD --prefix P`,
# and the pip wheel through scikit-build-core (pyproject.toml), which installs the same rules into
# site-packages/harness/.

# The binary finds LibTorch through its RPATH: the torch it was built against, and for a wheel also
# the torch beside it in site-packages (the `harness` console script puts torch/lib on
# LD_LIBRARY_PATH as well, so a venv moved or a torch reinstalled at another path still works).
set(_harness_torch_lib "${HARNESS_TORCH_PREFIX}/lib")
if(SKBUILD)
  set(_harness_rpath "$ORIGIN/../../torch/lib;${_harness_torch_lib}")
else()
  set(_harness_rpath "${_harness_torch_lib}")
endif()
set_target_properties(harness PROPERTIES INSTALL_RPATH "${_harness_rpath}")
# OPTIONAL: `pip install . -C build.targets=harness_ops` builds only the torch ops (a lean install
# for `import harness` alone; the console script then says that there is no binary).
install(TARGETS harness RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT harness OPTIONAL)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/experiments/ DESTINATION ${HARNESS_INSTALL_EXPERIMENTS_DIR} COMPONENT harness
        FILES_MATCHING PATTERN "*.json" PATTERN "python/*.py" PATTERN "README.md"
        PATTERN "kinds" EXCLUDE PATTERN "__pycache__" EXCLUDE)

if(TARGET harness_ops)
  set_target_properties(harness_ops PROPERTIES INSTALL_RPATH "${_harness_rpath}")
  install(TARGETS harness_ops LIBRARY DESTINATION ${HARNESS_INSTALL_OPS_DIR} COMPONENT harness)
  configure_file(${PROJECT_SOURCE_DIR}/python/harness/_install.py.in ${CMAKE_BINARY_DIR}/python/_install.py @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/python/_install.py DESTINATION ${HARNESS_INSTALL_PYTHON_DIR} COMPONENT harness)
  if(NOT SKBUILD)
    # A wheel takes the sources from pyproject.toml's wheel.packages.
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/harness/ DESTINATION ${HARNESS_INSTALL_PYTHON_DIR} COMPONENT harness
            FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
  endif()
  if(SKBUILD AND DEFINED SKBUILD_PLATLIB_DIR)
    # One line in site-packages itself, run by the interpreter at start: with HARNESS_CAPTURE=DIR in
    # a launcher's environment it starts harness.capture in every worker (python/README.md, Capture).
    install(FILES ${PROJECT_SOURCE_DIR}/python/site/harness-capture.pth DESTINATION ${SKBUILD_PLATLIB_DIR}
            COMPONENT harness)
  endif()
endif()

install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT harness)
install(FILES ${PROJECT_SOURCE_DIR}/python/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/python COMPONENT harness)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT harness)

# find_package(harness) for C++ users of the kernels library (not in a wheel: nothing there
# links C++). harness::kernels brings LibTorch (find_dependency(Torch)) and, in a CUDA build,
# the CUDA kernels.
if(NOT SKBUILD)
  set(_harness_export harness_kernels harness_maskdesc harness_core)
  if(TARGET harness_kernels_cuda)
    list(APPEND _harness_export harness_kernels_cuda harness_build_info)
  endif()
  install(TARGETS ${_harness_export} EXPORT harnessTargets COMPONENT devel
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/harness)
  foreach(_harness_folder kernels core)
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_harness_folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/harness/${_harness_folder}
            COMPONENT devel FILES_MATCHING PATTERN "*.h")
  endforeach()
  install(EXPORT harnessTargets NAMESPACE harness:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/harness COMPONENT devel)
  include(CMakePackageConfigHelpers)
  set(HARNESS_CONFIG_HAVE_CUDA ${HARNESS_HAVE_CUDA})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/harnessConfig.cmake.in
                                ${CMAKE_BINARY_DIR}/harnessConfig.cmake
                                INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/harness)
  write_basic_package_version_file(${CMAKE_BINARY_DIR}/harnessConfigVersion.cmake COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_BINARY_DIR}/harnessConfig.cmake ${CMAKE_BINARY_DIR}/harnessConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/harness COMPONENT devel)
endif()
