# Where `cmake --install` (and the pip wheel) put things, relative to the prefix. Included before
# build_info.h is generated: the binary carries the path from its own folder to the shipped specs,
# so an installed harness finds them wherever the prefix was moved to.
#
#   prefix/bin/harness                        the command line
#   prefix/share/harness/experiments/         the shipped specs (and their python/ scripts)
#   prefix/share/doc/harness/                 README.md, docs/, python/README.md
#   prefix/lib/libharness_kernels.a ...       the kernels library, with include/harness/ and
#   prefix/lib/cmake/harness/                 harnessConfig.cmake (find_package(harness))
#   prefix/lib/harness/python/harness/        the Python package (PYTHONPATH=prefix/lib/harness/python),
#                                             with lib/libharness_ops.so (the torch ops)
# A wheel (pip install .) uses the same tree with the package folder as the prefix: scikit-build-core
# installs into site-packages/harness/, which is also where the Python sources go.
include(GNUInstallDirs)
if(SKBUILD)
  set(HARNESS_INSTALL_PYTHON_DIR ".")
else()
  set(HARNESS_INSTALL_PYTHON_DIR "${CMAKE_INSTALL_LIBDIR}/harness/python/harness")
endif()
set(HARNESS_INSTALL_EXPERIMENTS_DIR "${CMAKE_INSTALL_DATADIR}/harness/experiments")
set(HARNESS_INSTALL_OPS_DIR "${HARNESS_INSTALL_PYTHON_DIR}/lib")

# Relative paths, computed under a stand-in prefix: they hold under any real one.
file(RELATIVE_PATH HARNESS_INSTALL_EXPERIMENTS_FROM_BIN "/prefix/${CMAKE_INSTALL_BINDIR}" "/prefix/${HARNESS_INSTALL_EXPERIMENTS_DIR}")
file(RELATIVE_PATH HARNESS_PY_TO_BINARY "/prefix/${HARNESS_INSTALL_PYTHON_DIR}" "/prefix/${CMAKE_INSTALL_BINDIR}/harness")
file(RELATIVE_PATH HARNESS_PY_TO_OPS "/prefix/${HARNESS_INSTALL_PYTHON_DIR}" "/prefix/${HARNESS_INSTALL_OPS_DIR}/libharness_ops.so")
file(RELATIVE_PATH HARNESS_PY_TO_EXPERIMENTS "/prefix/${HARNESS_INSTALL_PYTHON_DIR}" "/prefix/${HARNESS_INSTALL_EXPERIMENTS_DIR}")
