# The peers of the same-host shared-memory benchmark (bench/run_shm.sh): role programs that the
# driver starts pinned to cores 0 and 1, next to the bus's own.
#
# Included from bench/CMakeLists.txt.
#
#   bus_shm_raw       the raw references: a Unix-domain stream socket ping-pong and the spinning
#                     floor (two processes handing a counter over a shared cache line): always built
#   bus_shm_iceoryx   Eclipse iceoryx 2.0 roles (zero-copy publish/subscribe through RouDi), only
#                     when iceoryx is found (benchmark-only peer):
#                     iceoryx   libiceoryx-posh-dev   <iceoryx/vX/iceoryx_posh/...>, -liceoryx_posh
#                     (its daemon, iox-roudi from the iceoryx package, runs with
#                     bench/shm_roudi.toml: `iox-roudi -c bench/shm_roudi.toml`)
include_guard(GLOBAL)

find_package(Threads REQUIRED)

function(bus_shm_program name source)
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${source})
  set_target_properties(${name} PROPERTIES
    CXX_STANDARD 20
    CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  target_compile_options(${name} PRIVATE -Wall -Wextra)
  target_link_libraries(${name} PRIVATE Threads::Threads)
endfunction()

bus_shm_program(bus_shm_raw shm_raw.cpp)

# iceoryx: optional. Its CMake package when installed; else the headers and libraries by hand
# (the headers live in a versioned folder, include/iceoryx/v<version>).
find_package(iceoryx_posh CONFIG QUIET)
if(TARGET iceoryx_posh::iceoryx_posh)
  set(_bus_shm_iceoryx iceoryx_posh::iceoryx_posh)
  set(_bus_shm_iceoryx_found "iceoryx ${iceoryx_posh_VERSION} (CMake package)")
else()
  file(GLOB _bus_shm_iceoryx_hints /usr/include/iceoryx/v* /usr/local/include/iceoryx/v*)
  find_path(BUS_SHM_ICEORYX_INCLUDE_DIR iceoryx_posh/popo/untyped_publisher.hpp
            HINTS ${_bus_shm_iceoryx_hints})
  find_library(BUS_SHM_ICEORYX_POSH_LIBRARY iceoryx_posh)
  find_library(BUS_SHM_ICEORYX_HOOFS_LIBRARY iceoryx_hoofs)
  find_library(BUS_SHM_ICEORYX_PLATFORM_LIBRARY iceoryx_platform)
  if(BUS_SHM_ICEORYX_INCLUDE_DIR AND BUS_SHM_ICEORYX_POSH_LIBRARY AND BUS_SHM_ICEORYX_HOOFS_LIBRARY
     AND BUS_SHM_ICEORYX_PLATFORM_LIBRARY)
    set(_bus_shm_iceoryx ${BUS_SHM_ICEORYX_POSH_LIBRARY} ${BUS_SHM_ICEORYX_HOOFS_LIBRARY}
                         ${BUS_SHM_ICEORYX_PLATFORM_LIBRARY})
    set(_bus_shm_iceoryx_found "iceoryx (${BUS_SHM_ICEORYX_POSH_LIBRARY})")
  endif()
endif()

if(_bus_shm_iceoryx)
  bus_shm_program(bus_shm_iceoryx shm_iceoryx.cpp)
  target_link_libraries(bus_shm_iceoryx PRIVATE ${_bus_shm_iceoryx})
  if(BUS_SHM_ICEORYX_INCLUDE_DIR)
    target_include_directories(bus_shm_iceoryx SYSTEM PRIVATE ${BUS_SHM_ICEORYX_INCLUDE_DIR})
  endif()
  message(STATUS "bus_shm: peers found: raw Unix socket and spinning floor, ${_bus_shm_iceoryx_found}")
else()
  message(STATUS "bus_shm: peers found: raw Unix socket and spinning floor")
  message(STATUS "bus_shm: peers MISSING (their cases are skipped): iceoryx "
                 "(libiceoryx-posh-dev, and iceoryx for iox-roudi)")
endif()
