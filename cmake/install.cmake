# `cmake --install`: what a prefix holds and how its parts find each other.
#
#   bin/arbiter                              the program
#   include/arbiter/...                      policy, runtime and backends/common headers
#   include/arbiter_backend.h                the plugin ABI (included as "arbiter_backend.h")
#   <libdir>/libarbiter_policy.so            tables, decide, explain (yaml-cpp inside)
#   <libdir>/libarbiter_runtime.so           registry, bootstrap, communicator, C API
#   <libdir>/libarbiter_bootstrap_ucx.so     the bootstrap's UCX side, loaded on first join
#   <libdir>/arbiter/libarbiter-*.so         backend modules, installed by arbiter_add_backend
#   <libdir>/cmake/arbiter/                  find_package(arbiter)
#   <libdir>/pkgconfig/arbiter.pc            pkg-config --cflags --libs arbiter
#   lib/python3/dist-packages/arbiter/       the ctypes binding (ARBITER_INSTALL_PYTHONDIR),
#                                            with _install.py and _version.py written here
#   share/arbiter/default.yaml, schema/      the tables every consumer starts from
#
# Everything locates its neighbours relative to itself (RUNPATH $ORIGIN, the
# runtime's <dir of libarbiter_runtime>/arbiter plugin folder, a relocatable
# package config and .pc), so a prefix can be moved or unpacked anywhere.
# The Python wheel (ARBITER_WHEEL, cmake/wheel.cmake) is the same layout
# under site-packages/arbiter/, with unversioned library names.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ARBITER_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/arbiter CACHE STRING
    "Where arbiterConfig.cmake is installed (relative to the prefix)")
set(ARBITER_INSTALL_PYTHONDIR lib/python3/dist-packages CACHE STRING
    "Where the Python package `arbiter` is installed (relative to the prefix)")
set(ARBITER_INSTALL_DATADIR ${CMAKE_INSTALL_DATADIR}/arbiter)

# Relative path from one install folder to another, for $ORIGIN and
# ${pcfiledir}; both are relative to the prefix unless a user made them absolute.
function(arbiter_relative_path out from to)
  foreach(dir from to)
    if(IS_ABSOLUTE "${${dir}}")
      set(${dir} "${${dir}}")
    else()
      set(${dir} "/prefix/${${dir}}")
    endif()
  endforeach()
  file(RELATIVE_PATH rel "${from}" "${to}")
  string(REGEX REPLACE "/$" "" rel "${rel}")
  if(rel STREQUAL "")
    set(rel ".")
  endif()
  set(${out} "${rel}" PARENT_SCOPE)
endfunction()

# Libraries: libarbiter_runtime finds libarbiter_policy next to itself; the
# program finds both in <libdir>. INSTALL_RPATH_USE_LINK_PATH keeps
# dependencies that live outside the system folders (a UCX in /opt); a wheel
# names no folder of the machine that built it.
set(ARBITER_SO_VERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
set(arbiter_installed_libraries arbiter_policy)
if(TARGET arbiter_runtime)
  list(APPEND arbiter_installed_libraries arbiter_runtime)
endif()
set_target_properties(${arbiter_installed_libraries} PROPERTIES
  INSTALL_RPATH "$ORIGIN"
  INSTALL_RPATH_USE_LINK_PATH ${ARBITER_INSTALL_RPATH_USE_LINK_PATH})
# A wheel holds no symbolic links (pip would install three copies of each).
if(NOT ARBITER_WHEEL)
  set_target_properties(${arbiter_installed_libraries} PROPERTIES
    VERSION ${PROJECT_VERSION}
    SOVERSION ${ARBITER_SO_VERSION})
endif()
set_target_properties(arbiter_policy PROPERTIES EXPORT_NAME policy)
if(TARGET arbiter_runtime)
  set_target_properties(arbiter_runtime PROPERTIES EXPORT_NAME runtime)
endif()
set_target_properties(arbiter_backend_abi PROPERTIES EXPORT_NAME backend_abi)

# backends/common as an installed header-only target (its in-tree target
# names the source folder): for out-of-tree backend modules and for the
# example's fp64 reference check.
add_library(arbiter_backend_common_installed INTERFACE)
set_target_properties(arbiter_backend_common_installed PROPERTIES EXPORT_NAME backend_common)
target_link_libraries(arbiter_backend_common_installed INTERFACE arbiter_backend_abi)

install(TARGETS ${arbiter_installed_libraries} arbiter_backend_abi
                arbiter_backend_common_installed
  EXPORT arbiterTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Next to the runtime, which dlopens it from there (not exported: private).
if(TARGET arbiter_bootstrap_ucx)
  set_target_properties(arbiter_bootstrap_ucx PROPERTIES
    INSTALL_RPATH_USE_LINK_PATH ${ARBITER_INSTALL_RPATH_USE_LINK_PATH})
  install(TARGETS arbiter_bootstrap_ucx LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/policy/include/arbiter
                  ${PROJECT_SOURCE_DIR}/runtime/include/arbiter
                  ${PROJECT_SOURCE_DIR}/backends/common/include/arbiter
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(FILES ${PROJECT_SOURCE_DIR}/backends/abi/arbiter_backend.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

if(TARGET arbiter)
  arbiter_relative_path(bin_to_lib ${CMAKE_INSTALL_BINDIR} ${CMAKE_INSTALL_LIBDIR})
  set_target_properties(arbiter PROPERTIES
    INSTALL_RPATH "$ORIGIN/${bin_to_lib}"
    INSTALL_RPATH_USE_LINK_PATH ${ARBITER_INSTALL_RPATH_USE_LINK_PATH})
  install(TARGETS arbiter RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Tables and their format. Anything added under configs/ (example site
# tables) is installed beside default.yaml.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/
  DESTINATION ${ARBITER_INSTALL_DATADIR}
  FILES_MATCHING PATTERN "*.yaml" PATTERN "*.md")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/schema/ DESTINATION ${ARBITER_INSTALL_DATADIR}/schema)

# find_package(arbiter): arbiter::policy, arbiter::runtime (plus
# arbiter::backend_abi and arbiter::backend_common for module authors).
# A static policy would carry yaml-cpp into its consumers' link line; the
# shared libraries keep yaml-cpp and UCX private.
get_target_property(arbiter_policy_type arbiter_policy TYPE)
set(ARBITER_CONFIG_DEPENDENCIES "")
if(arbiter_policy_type STREQUAL "STATIC_LIBRARY")
  set(ARBITER_CONFIG_DEPENDENCIES "find_dependency(yaml-cpp)")
endif()
install(EXPORT arbiterTargets NAMESPACE arbiter:: DESTINATION ${ARBITER_INSTALL_CMAKEDIR})
set(ARBITER_PLUGIN_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/arbiter)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/arbiterConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/arbiterConfig.cmake
  INSTALL_DESTINATION ${ARBITER_INSTALL_CMAKEDIR}
  PATH_VARS ARBITER_PLUGIN_INSTALL_DIR ARBITER_INSTALL_DATADIR CMAKE_INSTALL_BINDIR)
# 0.x: a new minor version may change the API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/arbiterConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/arbiterConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/arbiterConfigVersion.cmake
  DESTINATION ${ARBITER_INSTALL_CMAKEDIR})

# pkg-config, relocatable through ${pcfiledir}.
set(ARBITER_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
arbiter_relative_path(ARBITER_PC_TO_PREFIX ${ARBITER_PC_DIR} "")
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(ARBITER_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(ARBITER_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/arbiter.pc.in ${PROJECT_BINARY_DIR}/arbiter.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/arbiter.pc DESTINATION ${ARBITER_PC_DIR})

# The Python binding (pure Python over the C API), where it finds the library
# and the program from there, and the project version.
arbiter_relative_path(ARBITER_PY_TO_LIBDIR ${ARBITER_INSTALL_PYTHONDIR}/arbiter
                      ${CMAKE_INSTALL_LIBDIR})
arbiter_relative_path(ARBITER_PY_TO_BINDIR ${ARBITER_INSTALL_PYTHONDIR}/arbiter
                      ${CMAKE_INSTALL_BINDIR})
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/python/_install.py
  CONTENT "# Written by cmake/install.cmake. Where the installed library and program\n\
# lie, relative to this package.\nLIBDIR = \"@ARBITER_PY_TO_LIBDIR@\"\nBINDIR = \"@ARBITER_PY_TO_BINDIR@\"\n"
  @ONLY)
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/python/_version.py
  CONTENT "# Written by cmake/install.cmake from project(arbiter VERSION ...).\n\
__version__ = \"@PROJECT_VERSION@\"\n" @ONLY)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/arbiter DESTINATION ${ARBITER_INSTALL_PYTHONDIR}
  PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/python/_install.py ${PROJECT_BINARY_DIR}/python/_version.py
  DESTINATION ${ARBITER_INSTALL_PYTHONDIR}/arbiter)
