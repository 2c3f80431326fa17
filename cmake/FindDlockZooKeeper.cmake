# FindDlockZooKeeper: ZooKeeper's C client, multi-threaded flavour
# (libzookeeper_mt; Debian: libzookeeper-mt-dev), which ships no CMake
# package or pkg-config file.
#
# Defines the imported target DlockZooKeeper::zookeeper_mt and
# DlockZooKeeper_FOUND. Installed beside dlockConfig.cmake, which uses it for
# a static libdlock. Hints: DlockZooKeeper_ROOT, CMAKE_PREFIX_PATH.
find_path(DlockZooKeeper_INCLUDE_DIR zookeeper/zookeeper.h)
find_library(DlockZooKeeper_LIBRARY zookeeper_mt)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DlockZooKeeper REQUIRED_VARS DlockZooKeeper_LIBRARY DlockZooKeeper_INCLUDE_DIR)
mark_as_advanced(DlockZooKeeper_INCLUDE_DIR DlockZooKeeper_LIBRARY)
if(DlockZooKeeper_FOUND AND NOT TARGET DlockZooKeeper::zookeeper_mt)
  find_package(Threads REQUIRED)
  add_library(DlockZooKeeper::zookeeper_mt UNKNOWN IMPORTED)
  set_target_properties(DlockZooKeeper::zookeeper_mt PROPERTIES
    IMPORTED_LOCATION "${DlockZooKeeper_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${DlockZooKeeper_INCLUDE_DIR}"
    # The synchronous API of zookeeper.h is declared only with THREADED,
    # which is what libzookeeper_mt is built for.
    INTERFACE_COMPILE_DEFINITIONS THREADED
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
