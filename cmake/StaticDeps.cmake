# Links Abseil and Cap'n Proto from their static archives (Debian ships both forms): a program
# then loads a handful of shared libraries instead of ~60 (Abseil alone is 41 small ones), which
# is most of its start-up (docs/benchmarks.md, "Start-up"). Only this project's own programs are
# affected; an installed bus::* target still names the dependencies for the consumer to resolve.
option(BUS_STATIC_DEPS "Link Abseil and Cap'n Proto statically into this project's programs" ON)

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
