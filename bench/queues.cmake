# bus_queues: the bus against other in-process queues (bench/queues.cpp, issue 3).
#
# Included from bench/CMakeLists.txt; bench/run_queues.sh builds and runs it.
#
# The peers are benchmark-only dependencies, all optional: each one found adds its cases, each
# one missing is reported here and its cases print a "skipped" line. The library never needs them.
#   atomic_queue          libatomic-queue-dev        <atomic_queue/atomic_queue.h>
#   boost.lockfree        libboost-dev               <boost/lockfree/spsc_queue.hpp>
#   ReaderWriterQueue     libreaderwriterqueue-dev   <readerwriterqueue/readerwriterqueue.h>
#   ConcurrentQueue       libconcurrentqueue-dev     <concurrentqueue/concurrentqueue.h>
#   ZeroMQ (cppzmq)       cppzmq-dev libzmq3-dev     find_package(cppzmq)
include_guard(GLOBAL)

add_executable(bus_queues ${CMAKE_CURRENT_LIST_DIR}/queues.cpp)
# Instructions per message on one thread, counted under callgrind (bench/run_instructions.sh).
add_executable(bus_instructions ${CMAKE_CURRENT_LIST_DIR}/instructions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/instructions_alternate.cpp)
foreach(_target bus_queues bus_instructions)
  target_link_libraries(${_target} PRIVATE bus::bus)
  set_target_properties(${_target} PROPERTIES
    CXX_STANDARD 20
    CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF
    EXPORT_COMPILE_COMMANDS ON
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  target_compile_options(${_target} PRIVATE -Wall -Wextra)
endforeach()
target_compile_definitions(bus_queues PRIVATE
  BUS_QUEUES_BUILD_TYPE="$<CONFIG>")

set(_bus_queues_found "")
set(_bus_queues_missing "")

# Header-only peers: name, header, Debian package, macro.
foreach(_peer
    "atomic_queue|atomic_queue/atomic_queue.h|libatomic-queue-dev|BUS_QUEUES_HAVE_ATOMIC_QUEUE"
    "boost.lockfree|boost/lockfree/spsc_queue.hpp|libboost-dev|BUS_QUEUES_HAVE_BOOST_LOCKFREE"
    "ReaderWriterQueue|readerwriterqueue/readerwriterqueue.h|libreaderwriterqueue-dev|BUS_QUEUES_HAVE_READERWRITERQUEUE"
    "ConcurrentQueue|concurrentqueue/concurrentqueue.h|libconcurrentqueue-dev|BUS_QUEUES_HAVE_CONCURRENTQUEUE")
  string(REPLACE "|" ";" _fields "${_peer}")
  list(GET _fields 0 _name)
  list(GET _fields 1 _header)
  list(GET _fields 2 _package)
  list(GET _fields 3 _macro)
  find_path(${_macro}_INCLUDE_DIR ${_header})
  if(${_macro}_INCLUDE_DIR)
    target_include_directories(bus_queues SYSTEM PRIVATE ${${_macro}_INCLUDE_DIR})
    target_compile_definitions(bus_queues PRIVATE ${_macro}=1)
    list(APPEND _bus_queues_found "${_name}")
  else()
    target_compile_definitions(bus_queues PRIVATE ${_macro}=0)
    list(APPEND _bus_queues_missing "${_name} (${_package})")
  endif()
endforeach()

# ZeroMQ: the project finds cppzmq for its bridge; look for it here too, quietly, so that this
# file does not depend on where it is included from.
# (cppzmq's config finds libzmq with REQUIRED, so look for both headers first.)
if(NOT TARGET cppzmq)
  find_path(BUS_QUEUES_ZMQ_HPP_DIR zmq.hpp)
  find_path(BUS_QUEUES_ZMQ_H_DIR zmq.h)
  if(BUS_QUEUES_ZMQ_HPP_DIR AND BUS_QUEUES_ZMQ_H_DIR)
    find_package(cppzmq QUIET)
  endif()
endif()
if(TARGET cppzmq)
  target_link_libraries(bus_queues PRIVATE cppzmq)
  target_compile_definitions(bus_queues PRIVATE BUS_QUEUES_HAVE_ZMQ=1)
  list(APPEND _bus_queues_found "ZeroMQ inproc (cppzmq)")
else()
  target_compile_definitions(bus_queues PRIVATE BUS_QUEUES_HAVE_ZMQ=0)
  list(APPEND _bus_queues_missing "ZeroMQ (cppzmq-dev libzmq3-dev)")
endif()

list(JOIN _bus_queues_found ", " _found_text)
if(NOT _found_text)
  set(_found_text "none")
endif()
message(STATUS "bus_queues: peers found: ${_found_text}")
if(_bus_queues_missing)
  list(JOIN _bus_queues_missing ", " _missing_text)
  message(STATUS "bus_queues: peers MISSING (their cases are skipped): ${_missing_text}")
else()
  message(STATUS "bus_queues: every peer found")
endif()

