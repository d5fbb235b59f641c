# Links Abseil, Cap'n Proto and ZeroMQ (with libsodium) from their static archives (Debian ships
# both forms): a program then loads 20 shared libraries instead of 68 (Abseil alone is 41 small
# ones), which halves its start-up (docs/benchmarks.md, "Start-up"). OpenSSL stays shared, so
# that its security updates apply without a rebuild. Only this project's own programs are
# affected: an installed bus::* target still names the dependencies for the consumer to resolve.
option(BUS_STATIC_DEPS "Link Abseil, Cap'n Proto and ZeroMQ statically into this project's programs"
       ON)

# Before find_package(CapnProto): its config looks for each library with find_library() into a
# cache variable, and takes a .a it is given there as a static library.
macro(bus_capnp_prefer_static)
  if(BUS_STATIC_DEPS)
    foreach(lib kj kj-async kj-http capnp capnp-json capnpc capnp-rpc)
      find_library(_bus_static_${lib} NAMES lib${lib}.a)
      if(_bus_static_${lib})
        set(CapnProto_${lib}_IMPORTED_LOCATION "${_bus_static_${lib}}" CACHE FILEPATH "" FORCE)
      endif()
    endforeach()
  else()
    # Turned off in a build folder where it was on: find the shared libraries again.
    foreach(lib kj kj-async kj-http capnp capnp-json capnpc capnp-rpc)
      if(CapnProto_${lib}_IMPORTED_LOCATION MATCHES "\\.a$")
        unset(CapnProto_${lib}_IMPORTED_LOCATION CACHE)
      endif()
    endforeach()
  endif()
endmacro()

# After find_package(absl): points every imported absl:: library at its archive.
function(bus_absl_prefer_static)
  if(NOT BUS_STATIC_DEPS)
    return()
  endif()
  # The targets absl's config imported into the calling directory.
  get_property(targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(target IN LISTS targets)
    if(NOT target MATCHES "^absl::")
      continue()
    endif()
    get_target_property(type ${target} TYPE)
    if(NOT type STREQUAL "SHARED_LIBRARY")
      continue()
    endif()
    foreach(config IN ITEMS "" _NONE _RELEASE _RELWITHDEBINFO _DEBUG _NOCONFIG)
      get_target_property(location ${target} IMPORTED_LOCATION${config})
      if(location)
        string(REGEX REPLACE "\\.so(\\.[0-9]+)*$" ".a" archive "${location}")
        if(EXISTS "${archive}")
          set_target_properties(${target} PROPERTIES IMPORTED_LOCATION${config} "${archive}"
                                                     IMPORTED_NO_SONAME TRUE)
        endif()
      endif()
    endforeach()
  endforeach()
endfunction()

# Before find_package(cppzmq): its libzmq comes from find_library(ZeroMQ_LIBRARY); given the
# archive, the libraries it uses go with it (pkg-config --static --libs libzmq; those it does not
# use are dropped by --as-needed).
macro(bus_zmq_prefer_static)
  if(BUS_STATIC_DEPS)
    find_library(_bus_static_zmq NAMES libzmq.a)
    find_library(_bus_static_sodium NAMES libsodium.a)
    if(_bus_static_zmq AND _bus_static_sodium)
      set(ZeroMQ_LIBRARY "${_bus_static_zmq}" CACHE FILEPATH "" FORCE)
      set(_bus_zmq_static_deps "${_bus_static_sodium}" gssapi_krb5 pgm norm bsd rt Threads::Threads)
    endif()
  elseif(ZeroMQ_LIBRARY MATCHES "\\.a$")
    unset(ZeroMQ_LIBRARY CACHE)  # turned off where it was on: find the shared library again
  endif()
endmacro()
# After it: what the archive needs.
macro(bus_zmq_static_deps)
  if(_bus_zmq_static_deps AND TARGET libzmq)
    set_property(TARGET libzmq APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${_bus_zmq_static_deps})
  endif()
endmacro()
