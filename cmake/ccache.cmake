# Compiling through ccache, when it is installed (tools/install-deps.sh
# installs it): a build after `make clean`, a second clone, or CI after a local
# build of the same tree compiles only the sources that changed. The cache is
# ccache's own (~/.cache/ccache unless CCACHE_DIR says otherwise), outside the
# clone, so it outlives build folders; from an empty cache a build is as long
# as without it.
#
# -DPTRAIN_CCACHE=OFF compiles without it; a CMAKE_<LANG>_COMPILER_LAUNCHER of
# one's own is left alone.
#
# The settings travel with each command (not in the environment of `make`),
# so `cmake --build` hits the cache the same way:
#  - base_dir = the source tree: paths under it are hashed relative to the
#    compiler's folder, so two build folders (build/, build-pypi/) and two
#    clones share objects where their commands are otherwise the same;
#  - sloppiness pch_defines,time_macros: what ccache needs to cache sources
#    compiled with the precompiled header (cmake/ptrain_pch.h);
#    include_file_mtime,include_file_ctime: the header's .gch is written
#    moments before the sources that use it, which ccache would otherwise take
#    for a file still being changed and not cache.
find_program(PTRAIN_CCACHE_PROGRAM ccache)
option(PTRAIN_CCACHE "Compile through ccache when it is installed" ON)
if(PTRAIN_CCACHE AND PTRAIN_CCACHE_PROGRAM)
  set(_ptrain_ccache_launcher
    ${CMAKE_COMMAND} -E env
      "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}"
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
    ${PTRAIN_CCACHE_PROGRAM})
  foreach(_lang CXX CUDA)
    if(NOT CMAKE_${_lang}_COMPILER_LAUNCHER)
      set(CMAKE_${_lang}_COMPILER_LAUNCHER ${_ptrain_ccache_launcher})
    endif()
  endforeach()
  message(STATUS "ccache: ${PTRAIN_CCACHE_PROGRAM} (-DPTRAIN_CCACHE=OFF builds without it)")
endif()
