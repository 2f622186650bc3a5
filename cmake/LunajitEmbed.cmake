# lunajit_embed(<target> NAMESPACE <c++ namespace> BASE <dir> FILES <relative paths...>)
# Generates a C++ source holding the bytes of each file and a lookup table
# {virtual path, contents}; the files are handed to NVRTC and to the host JIT as
# in-memory headers, so nothing is read from disk at run time.
function(lunajit_embed target)
  cmake_parse_arguments(E "" "NAMESPACE;BASE" "FILES" ${ARGN})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target}_embedded.cpp)
  set(deps)
  foreach(f IN LISTS E_FILES)
    list(APPEND deps ${E_BASE}/${f})
  endforeach()
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} -DNAMESPACE=${E_NAMESPACE} -DBASE=${E_BASE}
            "-DFILES=${E_FILES}" -P ${PROJECT_SOURCE_DIR}/cmake/embed_files.cmake
    DEPENDS ${deps} ${PROJECT_SOURCE_DIR}/cmake/embed_files.cmake
    COMMENT "Embedding ${target} (${E_NAMESPACE})"
    VERBATIM)
  add_library(${target} STATIC ${out})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
