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
    set_property(GLOBAL APPEND PROPERTY HP_TORCH_LIBRARIES ${name})
    hp_share_torch_pch(${name})
  endif()
endfunction()

# hp_share_torch_pch(TARGET...): those of the targets that link a LibTorch library (hp_torch,
# or an hp_library(TORCH)) directly compile with the one precompiled LibTorch header of
# hp_torch_pch (cmake/hp_torch.cmake): parsed once for the build, not once per target or per
# test source. A header is used only where the flags that shape it match, so every
# LibTorch translation unit is position-independent (-fPIC), executables' included.
function(hp_share_torch_pch)
  if(NOT TARGET hp_torch_pch)
    return()
  endif()
  get_property(torch_libraries GLOBAL PROPERTY HP_TORCH_LIBRARIES)
  foreach(target IN LISTS ARGN)
    get_target_property(libs ${target} LINK_LIBRARIES)
    foreach(lib IN LISTS libs)
      if(lib STREQUAL "hp_torch" OR lib IN_LIST torch_libraries)
        target_compile_options(${target} PRIVATE -fPIC)
        target_precompile_headers(${target} REUSE_FROM hp_torch_pch)
        break()
      endif()
    endforeach()
  endforeach()
endfunction()

# The same for every target the calling directory defines.
function(hp_share_torch_pch_in_directory)
  get_property(targets DIRECTORY PROPERTY BUILDSYSTEM_TARGETS)
  hp_share_torch_pch(${targets})
endfunction()
