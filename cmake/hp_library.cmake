# hp_library(NAME SOURCES ... DEPS ... [TORCH])
# One static library per layer; include paths are rooted at src/ ("hp/layer/x.h").
include(GNUInstallDirs)
function(hp_library name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
                                            $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  set_property(GLOBAL APPEND PROPERTY HP_LIBRARIES ${name})
  if(ARG_TORCH)
    target_link_libraries(${name} PUBLIC hp_torch)
    target_compile_options(${name} PRIVATE -Wno-unused-parameter -Wno-sign-compare)
    # The heavy LibTorch headers, compiled once per library.
    target_precompile_headers(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src/hp/torch_pch.h)
  endif()
endfunction()
