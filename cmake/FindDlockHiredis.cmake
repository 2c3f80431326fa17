# FindDlockHiredis: the hiredis C client (Debian: libhiredis-dev). Debian's
# hiredis 0.14 ships hiredis.pc and a HiredisConfig.cmake that sets variables
# but no imported target, so this module makes one.
#
# Defines the imported target DlockHiredis::hiredis and DlockHiredis_FOUND.
# Installed beside dlockConfig.cmake, which uses it for a static libdlock.
# Hints: DlockHiredis_ROOT, CMAKE_PREFIX_PATH.
find_path(DlockHiredis_INCLUDE_DIR hiredis/hiredis.h)
find_library(DlockHiredis_LIBRARY hiredis)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DlockHiredis REQUIRED_VARS DlockHiredis_LIBRARY DlockHiredis_INCLUDE_DIR)
mark_as_advanced(DlockHiredis_INCLUDE_DIR DlockHiredis_LIBRARY)
if(DlockHiredis_FOUND AND NOT TARGET DlockHiredis::hiredis)
  add_library(DlockHiredis::hiredis UNKNOWN IMPORTED)
  set_target_properties(DlockHiredis::hiredis PROPERTIES
    IMPORTED_LOCATION "${DlockHiredis_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${DlockHiredis_INCLUDE_DIR}")
endif()
