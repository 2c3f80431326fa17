# FindDlockEtcdApi: what the etcd store needs to generate and build etcd's v3
# gRPC API (src/stores/etcd/proto):
#
#  - gRPC++ (Debian: libgrpc++-dev): its CMake package (gRPC::grpc++), or
#    else pkg-config's grpc++;
#  - protobuf and protoc (libprotobuf-dev, protobuf-compiler) and gRPC's C++
#    plugin for protoc (protobuf-compiler-grpc);
#  - etcd's own .proto files and what they import, as Debian ships them
#    (nothing is downloaded):
#      DlockEtcdApi_ETCD_ROOT        etcd/etcdserver/etcdserverpb/rpc.proto
#                                    (golang-etcd-server-dev: the directory
#                                    /usr/share/gocode/src/go.etcd.io, so that
#                                    rpc.proto's own `import "etcd/mvcc/..."`
#                                    resolves)
#      DlockEtcdApi_GOGO_ROOT        gogoproto/gogo.proto
#                                    (golang-github-gogo-protobuf-dev)
#      DlockEtcdApi_GOOGLEAPIS_ROOT  google/api/annotations.proto, http.proto
#                                    (golang-github-grpc-ecosystem-grpc-gateway-dev)
#    Each may be given on the command line instead (another etcd checkout).
#
# Defines DlockEtcdApi_FOUND, DlockEtcdApi_PROTOC, DlockEtcdApi_GRPC_PLUGIN,
# DlockEtcdApi_PROTOBUF_INCLUDE_DIR (descriptor.proto), the imported targets
# DlockEtcdApi::grpc++ and DlockEtcdApi::protobuf (DlockEtcdApi_LIBRARIES),
# and DlockEtcdApi_MISSING
# (what was not found, for the configure message).
#
# With DlockEtcdApi_LINK_ONLY set (dlockConfig.cmake sets it for the users of
# a static libdlock), only the two libraries are looked for: protoc, its
# plugin and the .proto files are needed to build dlock, not to link it.
include(FindPackageHandleStandardArgs)
set(DlockEtcdApi_MISSING "")

# protobuf: CMake's own FindProtobuf (Debian ships no protobuf-config.cmake).
find_package(Protobuf QUIET)
if(Protobuf_FOUND AND TARGET protobuf::libprotobuf)
  set(DlockEtcdApi_PROTOC ${Protobuf_PROTOC_EXECUTABLE})
  list(GET Protobuf_INCLUDE_DIRS 0 DlockEtcdApi_PROTOBUF_INCLUDE_DIR)
  if(NOT TARGET DlockEtcdApi::protobuf)
    add_library(DlockEtcdApi::protobuf INTERFACE IMPORTED)
    set_target_properties(DlockEtcdApi::protobuf PROPERTIES INTERFACE_LINK_LIBRARIES protobuf::libprotobuf)
  endif()
else()
  list(APPEND DlockEtcdApi_MISSING "protobuf (libprotobuf-dev)")
endif()
if(NOT DlockEtcdApi_PROTOC)
  find_program(DlockEtcdApi_PROTOC protoc)
endif()
if(NOT DlockEtcdApi_PROTOC)
  list(APPEND DlockEtcdApi_MISSING "protoc (protobuf-compiler)")
endif()

# gRPC++: the CMake package Debian 12 ships (gRPCConfig.cmake), else pkg-config.
find_package(gRPC CONFIG QUIET)
if(gRPC_FOUND AND TARGET gRPC::grpc++)
  if(NOT TARGET DlockEtcdApi::grpc++)
    add_library(DlockEtcdApi::grpc++ INTERFACE IMPORTED)
    set_target_properties(DlockEtcdApi::grpc++ PROPERTIES INTERFACE_LINK_LIBRARIES gRPC::grpc++)
  endif()
  if(TARGET gRPC::grpc_cpp_plugin AND NOT DlockEtcdApi_GRPC_PLUGIN)
    get_target_property(_dlock_plugin gRPC::grpc_cpp_plugin LOCATION)
    if(_dlock_plugin AND EXISTS "${_dlock_plugin}")
      set(DlockEtcdApi_GRPC_PLUGIN ${_dlock_plugin} CACHE FILEPATH "protoc's gRPC C++ plugin")
    endif()
  endif()
else()
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(DlockEtcdApi_PC_GRPCXX QUIET IMPORTED_TARGET grpc++)
  endif()
  if(DlockEtcdApi_PC_GRPCXX_FOUND)
    if(NOT TARGET DlockEtcdApi::grpc++)
      add_library(DlockEtcdApi::grpc++ INTERFACE IMPORTED)
      set_target_properties(DlockEtcdApi::grpc++ PROPERTIES INTERFACE_LINK_LIBRARIES PkgConfig::DlockEtcdApi_PC_GRPCXX)
    endif()
  else()
    list(APPEND DlockEtcdApi_MISSING "gRPC++ (libgrpc++-dev)")
  endif()
endif()
find_program(DlockEtcdApi_GRPC_PLUGIN grpc_cpp_plugin)
if(NOT DlockEtcdApi_GRPC_PLUGIN)
  list(APPEND DlockEtcdApi_MISSING "grpc_cpp_plugin (protobuf-compiler-grpc)")
endif()

if(NOT DlockEtcdApi_LINK_ONLY)
# etcd's .proto files and their imports.
find_path(DlockEtcdApi_ETCD_ROOT etcd/etcdserver/etcdserverpb/rpc.proto
  PATHS /usr/share/gocode/src/go.etcd.io NO_DEFAULT_PATH)
find_path(DlockEtcdApi_GOGO_ROOT gogoproto/gogo.proto
  PATHS /usr/share/gocode/src/github.com/gogo/protobuf NO_DEFAULT_PATH)
find_path(DlockEtcdApi_GOOGLEAPIS_ROOT google/api/annotations.proto
  PATHS /usr/share/gocode/src/github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis NO_DEFAULT_PATH)
if(NOT DlockEtcdApi_ETCD_ROOT)
  list(APPEND DlockEtcdApi_MISSING "etcd's rpc.proto (golang-etcd-server-dev)")
endif()
if(NOT DlockEtcdApi_GOGO_ROOT)
  list(APPEND DlockEtcdApi_MISSING "gogoproto/gogo.proto (golang-github-gogo-protobuf-dev)")
endif()
if(NOT DlockEtcdApi_GOOGLEAPIS_ROOT)
  list(APPEND DlockEtcdApi_MISSING "google/api/annotations.proto (golang-github-grpc-ecosystem-grpc-gateway-dev)")
endif()
if(NOT DlockEtcdApi_PROTOBUF_INCLUDE_DIR)
  find_path(DlockEtcdApi_PROTOBUF_INCLUDE_DIR google/protobuf/descriptor.proto)
endif()
mark_as_advanced(DlockEtcdApi_PROTOC DlockEtcdApi_GRPC_PLUGIN DlockEtcdApi_ETCD_ROOT DlockEtcdApi_GOGO_ROOT
                 DlockEtcdApi_GOOGLEAPIS_ROOT DlockEtcdApi_PROTOBUF_INCLUDE_DIR)

endif()

set(DlockEtcdApi_LIBRARIES "")
if(TARGET DlockEtcdApi::grpc++ AND TARGET DlockEtcdApi::protobuf)
  set(DlockEtcdApi_LIBRARIES DlockEtcdApi::grpc++ DlockEtcdApi::protobuf)
endif()
if(DlockEtcdApi_LINK_ONLY)
  find_package_handle_standard_args(DlockEtcdApi REQUIRED_VARS DlockEtcdApi_LIBRARIES)
else()
  find_package_handle_standard_args(DlockEtcdApi
    REQUIRED_VARS DlockEtcdApi_LIBRARIES DlockEtcdApi_PROTOC DlockEtcdApi_GRPC_PLUGIN DlockEtcdApi_ETCD_ROOT
                  DlockEtcdApi_GOGO_ROOT DlockEtcdApi_GOOGLEAPIS_ROOT DlockEtcdApi_PROTOBUF_INCLUDE_DIR)
endif()
unset(_dlock_plugin)
