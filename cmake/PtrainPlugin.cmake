# ptrain_add_plugin(<kind> <name> SOURCES <files...> [LIBRARIES <libs...>] [OUTPUT_DIR <dir>])
#
# Builds one plugin: a module library named libptrain_<kind>_<name>.so, linked
# to ptrain::core, into OUTPUT_DIR (default: ${PTRAIN_PLUGIN_OUTPUT_DIR}/<kind>,
# which the ptrain tree sets to <build>/lib/ptrain/plugins; elsewhere
# <your build>/plugins/<kind>). What a plugin needs is set on its target only:
# position independent code and hidden visibility (the library exports its
# descriptor, nothing else). The C++ standard, flags and definitions are the
# project's own plus ptrain::core's usage requirements (cxx_std_17 as a minimum,
# USE_C10D_GLOO, OpenMP, libtorch). Inside the ptrain tree the plugin also gets
# the shared precompiled header.
#
# `cmake --install` puts it in <prefix>/${PTRAIN_PLUGIN_INSTALL_DIR}/<kind>
# (default lib/ptrain/plugins: beside an installed libptrain_core.so, that is
# the core's own plugin folder), with the RUNPATH $ORIGIN/../../.. (the folder
# of libptrain_core.so) and nothing else: the process that loads a plugin has
# loaded the core, and libtorch with it, already. Set PTRAIN_PLUGIN_INSTALL to
# OFF before the call for a plugin that is not to be installed.
function(ptrain_add_plugin kind name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  set(target ptrain_${kind}_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE ptrain::core ${ARG_LIBRARIES})
  if(COMMAND ptrain_reuse_pch)
    ptrain_reuse_pch(${target})
  endif()
  if(NOT ARG_OUTPUT_DIR)
    if(PTRAIN_PLUGIN_OUTPUT_DIR)
      set(ARG_OUTPUT_DIR ${PTRAIN_PLUGIN_OUTPUT_DIR}/${kind})
    else()
      set(ARG_OUTPUT_DIR ${CMAKE_BINARY_DIR}/plugins/${kind})
    endif()
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR}
    POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    # <prefix>/lib/ptrain/plugins/<kind> -> <prefix>/lib, where libptrain_core.so is.
    INSTALL_RPATH "$ORIGIN/../../.."
    INSTALL_RPATH_USE_LINK_PATH OFF)
  if(NOT DEFINED PTRAIN_PLUGIN_INSTALL OR PTRAIN_PLUGIN_INSTALL)
    if(NOT PTRAIN_PLUGIN_INSTALL_DIR)
      set(PTRAIN_PLUGIN_INSTALL_DIR lib/ptrain/plugins)
    endif()
    install(TARGETS ${target} LIBRARY DESTINATION ${PTRAIN_PLUGIN_INSTALL_DIR}/${kind})
  endif()
  if(TARGET ptrain_plugins_all)
    add_dependencies(ptrain_plugins_all ${target})
  endif()
endfunction()
