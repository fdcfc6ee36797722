# `cmake --install` puts the headers, the static libraries and a package config under the
# prefix, so another project does find_package(HyperParallel) and links HyperParallel::hp
# (examples/consumer). LibTorch is referenced where this build found it (the venv).
include(CMakePackageConfigHelpers)

get_property(_hp_libraries GLOBAL PROPERTY HP_LIBRARIES)
add_library(hp_all INTERFACE)  # everything, as HyperParallel::hp
set_target_properties(hp_all PROPERTIES EXPORT_NAME hp)
target_link_libraries(hp_all INTERFACE ${_hp_libraries})
set(_hp_exported hp_all ${_hp_libraries})
if(TARGET hp_torch)
  list(APPEND _hp_exported hp_torch)
endif()

install(TARGETS ${_hp_exported} EXPORT HyperParallelTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/hp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "torch_pch.h" EXCLUDE)
set(_hp_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/HyperParallel)
install(EXPORT HyperParallelTargets NAMESPACE HyperParallel:: DESTINATION ${_hp_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/HyperParallelConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/HyperParallelConfig.cmake INSTALL_DESTINATION ${_hp_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/HyperParallelConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/HyperParallelConfig.cmake ${PROJECT_BINARY_DIR}/HyperParallelConfigVersion.cmake
        DESTINATION ${_hp_cmake_dir})
