# The Python wheel's build (pyproject.toml: scikit-build-core sets
# ARBITER_WHEEL=ON). The install prefix is then site-packages, and everything
# lands under site-packages/arbiter/:
#
#   arbiter/*.py                 the Python package (ARBITER_INSTALL_PYTHONDIR=.)
#   arbiter/bin/arbiter          the program (the console script `arbiter` execs it)
#   arbiter/lib/                 libarbiter_runtime.so, libarbiter_policy.so,
#                                libarbiter_bootstrap_ucx.so; arbiter/ the modules;
#                                cmake/arbiter/ (find_package), pkgconfig/
#   arbiter/include/             the headers
#   arbiter/share/arbiter/       default.yaml and the schema
#
# What differs from `cmake --install`: library names carry no version (a
# wheel holds no symbolic links), no RUNPATH names a folder of the build
# machine, Boost.Program_options is linked into the program statically, and
# the runtime looks for pip's nvidia-nccl-cu13 wheel beside the package
# (site-packages/nvidia/nccl/lib). yaml-cpp and UCX are shared libraries that
# `auditwheel repair` copies into the wheel (scripts/test-wheel.sh, docs/install.md).
option(ARBITER_WHEEL "Lay the install out as the Python wheel (site-packages/arbiter/)" OFF)

if(ARBITER_WHEEL)
  # Before GNUInstallDirs: these become its cache entries (-D still wins).
  set(CMAKE_INSTALL_BINDIR arbiter/bin CACHE PATH "Programs (wheel layout)")
  set(CMAKE_INSTALL_LIBDIR arbiter/lib CACHE PATH "Libraries (wheel layout)")
  set(CMAKE_INSTALL_INCLUDEDIR arbiter/include CACHE PATH "Headers (wheel layout)")
  set(CMAKE_INSTALL_DATADIR arbiter/share CACHE PATH "Data (wheel layout)")
  set(ARBITER_INSTALL_PYTHONDIR . CACHE STRING "The Python package's parent (wheel layout)")
  set(ARBITER_NCCL_WHEEL_DIR ../../nvidia/nccl/lib CACHE STRING
      "libnccl.so.2's folder in pip's NCCL wheel, relative to libarbiter_runtime's folder")
  set(Boost_USE_STATIC_LIBS ON)  # only the program links Boost (program_options)
  set(ARBITER_INSTALL_RPATH_USE_LINK_PATH OFF)
else()
  set(ARBITER_INSTALL_RPATH_USE_LINK_PATH ON)
endif()
