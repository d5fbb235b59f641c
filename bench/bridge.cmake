# bus_bridge: the bridge across processes against raw ZeroMQ and NATS (bench/bridge_bench.cpp).
#
# Included from bench/CMakeLists.txt; bench/run_bridge.sh builds and runs it.
#
#   bus_bridge        the driver: starts each case's two processes pinned to cores 0 and 1,
#                     interleaves the runs, prints the table
#   bus_bridge_bus    the bus roles (bus::net::Node publisher/subscriber, server/clients)
#   bus_bridge_stall  one publisher, three subscribers, one stopped for a while: its own driver
#                     and roles (bench/run_stall.sh)
#   bus_bridge_zmq    raw ZeroMQ roles (PUSH/PULL, XPUB/SUB, DEALER/ROUTER): always built, the
#                     bridge needs libzmq anyway
#   bus_bridge_nats   NATS roles, only when the C client is found (benchmark-only peer):
#                     NATS C client   libnats-dev   <nats/nats.h>, -lnats
#                     (its broker, nats-server, is found and started by bench/run_bridge.sh)
include_guard(GLOBAL)

# The benchmark's message schema. In a function so that CAPNPC_SRC_PREFIX and
# CAPNPC_OUTPUT_DIR stay local (the top level sets its own for schemas/).
function(bus_bridge_schema)
  set(CAPNPC_SRC_PREFIX ${CMAKE_CURRENT_LIST_DIR})
  set(CAPNPC_OUTPUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/generated/bench)
  file(MAKE_DIRECTORY ${CAPNPC_OUTPUT_DIR})
  capnp_generate_cpp(_srcs _hdrs ${CMAKE_CURRENT_LIST_DIR}/bench.capnp)
  add_library(bus_bridge_schema STATIC ${_srcs})
  target_include_directories(bus_bridge_schema PUBLIC ${CMAKE_CURRENT_BINARY_DIR}/generated)
  target_link_libraries(bus_bridge_schema PUBLIC CapnProto::capnp)
endfunction()
bus_bridge_schema()

function(bus_bridge_program name source)
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${source})
  set_target_properties(${name} PROPERTIES
    CXX_STANDARD 20
    CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  target_compile_options(${name} PRIVATE -Wall -Wextra)
endfunction()

bus_bridge_program(bus_bridge bridge_bench.cpp)
target_compile_definitions(bus_bridge PRIVATE BUS_BRIDGE_BUILD_TYPE="$<CONFIG>")

# The same-host driver (bench/run_shm.sh): the bus's roles above, iceoryx's and the raw
# references' (bench/shm_peers.cmake).
bus_bridge_program(bus_shm shm_bench.cpp)

bus_bridge_program(bus_bridge_bus bridge_bus.cpp)
target_link_libraries(bus_bridge_bus PRIVATE bus::net bus_bridge_schema)

bus_bridge_program(bus_bridge_stall bridge_stall.cpp)
target_link_libraries(bus_bridge_stall PRIVATE bus::net bus_bridge_schema)

bus_bridge_program(bus_bridge_zmq bridge_zmq.cpp)
target_link_libraries(bus_bridge_zmq PRIVATE cppzmq)

# NATS: optional. find_path/find_library rather than the package's CMake config, which not
# every packaging ships.
find_path(BUS_BRIDGE_NATS_INCLUDE_DIR nats/nats.h)
find_library(BUS_BRIDGE_NATS_LIBRARY nats)
if(BUS_BRIDGE_NATS_INCLUDE_DIR AND BUS_BRIDGE_NATS_LIBRARY)
  bus_bridge_program(bus_bridge_nats bridge_nats.cpp)
  target_include_directories(bus_bridge_nats SYSTEM PRIVATE ${BUS_BRIDGE_NATS_INCLUDE_DIR})
  target_link_libraries(bus_bridge_nats PRIVATE ${BUS_BRIDGE_NATS_LIBRARY} Threads::Threads)
  message(STATUS "bus_bridge: peers found: raw ZeroMQ (cppzmq), NATS C client "
                 "(${BUS_BRIDGE_NATS_LIBRARY})")
else()
  message(STATUS "bus_bridge: peers found: raw ZeroMQ (cppzmq)")
  message(STATUS "bus_bridge: peers MISSING (their cases are skipped): NATS C client "
                 "(libnats-dev)")
endif()
