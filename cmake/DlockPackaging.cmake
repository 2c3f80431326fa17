# Debian packages, split as Debian does (cpack -G DEB in the build directory):
#   libdlock0     the shared library                       (component runtime)
#   libdlock-dev  headers, CMake package, dlock.pc, .so    (component development)
#   dlock         the dlock command, dlock(1), completion  (component tools)
# Dependencies on other Debian packages (libzookeeper-mt2, libhiredis0.14,
# libstdc++6, ...) come from dpkg-shlibdeps (dpkg-dev), as in a Debian build.
set(CPACK_PACKAGE_NAME dlock)
set(CPACK_PACKAGE_VENDOR "dlock developers")
set(CPACK_PACKAGE_CONTACT "dlock developers <dlock@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "distributed locks for C++20 on ZooKeeper, Redis and local files")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# Install with DESTDIR into the staging tree, CMAKE_INSTALL_PREFIX being /usr
# as on the target machine (dlock.pc is written with it).
set(CPACK_SET_DESTDIR ON)
set(CPACK_GENERATOR DEB)
set(CPACK_COMPONENTS_ALL runtime development tools)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(dlock_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libdlock${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(dlock_deb_about
  "dlock gives C++ programs mutexes, semaphores and read-write locks across\n"
  "threads, processes and machines, on ZooKeeper, Redis or local files, with\n"
  "fencing tokens and loss notification.")
string(CONCAT CPACK_DEBIAN_RUNTIME_DESCRIPTION "distributed locks for C++20 (shared library)\n" ${dlock_deb_about}
  "\nThis package contains the shared library.")
# A shlibs file for packages built against it (and ldconfig triggers).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
# Stripped, as Debian ships binaries (RelWithDebInfo keeps the debug
# information in the build tree).
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME libdlock-dev)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
string(CONCAT CPACK_DEBIAN_DEVELOPMENT_DESCRIPTION "distributed locks for C++20 (development files)\n"
  ${dlock_deb_about} "\nThis package contains the headers, the CMake package (find_package(dlock))\n"
  "and dlock.pc for pkg-config.")
set(dlock_dev_depends "libdlock${PROJECT_VERSION_MAJOR} (= ${dlock_deb_version})")
if(DLOCK_HAVE_ZOOKEEPER)
  string(APPEND dlock_dev_depends ", libzookeeper-mt-dev")
endif()
if(DLOCK_HAVE_REDIS)
  string(APPEND dlock_dev_depends ", libhiredis-dev")
endif()
if(DLOCK_HAVE_ETCD)
  string(APPEND dlock_dev_depends ", libgrpc++-dev, libprotobuf-dev")
endif()
if(BUILD_SHARED_LIBS)
  # Only a static libdlock makes its users link the stores' client libraries.
  set(dlock_dev_depends "libdlock${PROJECT_VERSION_MAJOR} (= ${dlock_deb_version})")
endif()
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS "${dlock_dev_depends}")
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SHLIBDEPS OFF)

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME dlock)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_TOOLS_DESCRIPTION
  "run commands under a distributed lock\n"
  "dlock run waits for a lock on ZooKeeper, Redis or local files and runs a\n"
  "command while holding it; dlock status and dlock break show and repair\n"
  "locks.")
if(BUILD_SHARED_LIBS)
  set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libdlock${PROJECT_VERSION_MAJOR} (= ${dlock_deb_version})")
endif()
# For the dlock package, dpkg-shlibdeps finds libdlock.so.0 in the build tree
# (CPack passes --ignore-missing-info, so it names no package for it: the
# Depends above does), and the packages of the other libraries as usual.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR})

include(CPack)
