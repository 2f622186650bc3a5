# The installable package: `cmake --install <build> --prefix P` installs
#   P/bin/lunajit                          the CLI
#   P/lib/liblunajit.so                    lunajit::lunajit: every component library
#                                          (codegen, runtime, autotune, report, io, ...) in one
#   P/lib/liblunajit_torch.so              lunajit::torch: the same plus the LibTorch binding and
#                                          the torch.ops.lunajit custom ops (self-contained:
#                                          link one of the two, not both)
#   P/include/lunajit/<component>/*.h      headers (#include "torch_binding/modules.h"), and
#   P/include/lunajit/lunajit/*.cuh        the kernel templates (embedded in the libraries too)
#   P/lib/cmake/lunajit/                   lunajitConfig.cmake, exported targets
#   P/<LUNAJIT_PYTHON_INSTALL_DIR>/lunajit the Python package (finds P/lib/liblunajit_torch.so)
# Consumers: find_package(lunajit CONFIG REQUIRED) with CMAKE_PREFIX_PATH=P.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(LUNAJIT_CMAKE_DIR lib/cmake/lunajit)

set(_lunajit_components lunajit_common lunajit_io lunajit_codegen lunajit_templates lunajit_cuda_headers
    lunajit_cache lunajit_reference lunajit_runtime lunajit_autotune lunajit_report)
# The component libraries' object files, whole (a consumer may call anything the
# headers declare); linking the archives too brings their private dependencies
# (LLVM, clang-cpp, NVRTC, Boost.Context, ...) and adds no member twice.
set(_lunajit_objects)
foreach(c IN LISTS _lunajit_components)
  list(APPEND _lunajit_objects $<TARGET_OBJECTS:${c}>)
endforeach()
add_library(lunajit_shared SHARED ${PROJECT_SOURCE_DIR}/common/version.cpp ${_lunajit_objects})
target_link_libraries(lunajit_shared
  PUBLIC nlohmann_json::nlohmann_json
  PRIVATE ${_lunajit_components})
target_include_directories(lunajit_shared PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/templates>
  $<INSTALL_INTERFACE:include/lunajit>)
target_compile_features(lunajit_shared INTERFACE cxx_std_20)
set_target_properties(lunajit_shared PROPERTIES OUTPUT_NAME lunajit EXPORT_NAME lunajit)

set(_lunajit_export_targets lunajit_shared)
if(LUNAJIT_WITH_TORCH)
  list(APPEND _lunajit_export_targets lunajit_torch_shared)
endif()
install(TARGETS lunajit RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${_lunajit_export_targets} EXPORT lunajitTargets LIBRARY DESTINATION lib)
foreach(dir common io codegen cache reference runtime autotune report torch_binding)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} DESTINATION include/lunajit FILES_MATCHING PATTERN "*.h")
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/templates/lunajit DESTINATION include/lunajit
        FILES_MATCHING PATTERN "*.cuh" PATTERN "*.h")
install(EXPORT lunajitTargets NAMESPACE lunajit:: DESTINATION ${LUNAJIT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/lunajitConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/lunajitConfig.cmake INSTALL_DESTINATION ${LUNAJIT_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/lunajitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/lunajitConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/lunajitConfigVersion.cmake
        DESTINATION ${LUNAJIT_CMAKE_DIR})
if(LUNAJIT_WITH_TORCH)
  install(DIRECTORY ${CMAKE_BINARY_DIR}/python/lunajit DESTINATION ${LUNAJIT_PYTHON_INSTALL_DIR}
          FILES_MATCHING PATTERN "*.py")
endif()
