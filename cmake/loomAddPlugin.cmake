# loom_add_plugin(<kind> <name> SOURCES <file>... [LIBS <library>...])
#
# Builds a loom plugin: the MODULE library libloom-<kind>-<name>.so (the
# file name the loader requires; <kind> is comm, strategy, schedule, memtier or compute),
# whose target is loom-<kind>-<name>. It is C11 and compiled with hidden
# visibility (-fvisibility=hidden), so the struct marked LOOM_PLUGIN_EXPORT
# is the one symbol it exports; it links loom::abi (headers only: a plugin
# links no loom library) and LIBS, and installs into LOOM_PLUGIN_DIR.
# Anything else (include folders, definitions, warnings) goes on the target
# afterwards.
#
# The CMake package installs this file (find_package(loom) includes it) and
# loom's own tree builds its plugins with it too: one definition for both.
function(loom_add_plugin kind name)
  cmake_parse_arguments(PARSE_ARGV 2 P "" "" "SOURCES;LIBS")
  if(P_UNPARSED_ARGUMENTS OR NOT P_SOURCES)
    message(FATAL_ERROR "loom_add_plugin(${kind} ${name} ...): unexpected '${P_UNPARSED_ARGUMENTS}' "
      "or no SOURCES; write loom_add_plugin(<kind> <name> SOURCES <file>... [LIBS <library>...])")
  endif()
  if(NOT kind MATCHES "^(comm|strategy|schedule|memtier|compute)$")
    message(FATAL_ERROR "loom_add_plugin(${kind} ${name} ...): the kind is comm, strategy, schedule, memtier or compute")
  endif()
  set(target loom-${kind}-${name})
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" OUTPUT_NAME ${target} SUFFIX ".so"
    C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF
    C_VISIBILITY_PRESET hidden)
  target_link_libraries(${target} PRIVATE loom::abi ${P_LIBS})
  install(TARGETS ${target} LIBRARY DESTINATION ${LOOM_PLUGIN_DIR})
endfunction()
