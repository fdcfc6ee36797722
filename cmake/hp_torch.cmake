# LibTorch from the project's Python virtual environment (scripts/setup makes it; its path
# comes from scripts/venv_path unless HP_VENV is given), or from the torch of HP_PYTHON.
# Defines the target hp_torch.
#
# CPU builds import libtorch_cpu and libc10 straight from the wheel, with the definitions it
# was built with: no CUDA toolkit needed, and less to link and load. HP_CUDA builds go
# through the wheel's TorchConfig, which finds the CUDA toolkit and brings libtorch_cuda,
# NCCL and USE_C10D_NCCL.
set(HP_PYTHON "" CACHE FILEPATH "A Python whose torch to build against (default: the venv's)")
set(_hp_python ${HP_PYTHON})
if(NOT _hp_python)
  set(HP_VENV "" CACHE PATH "Python virtual environment holding torch (default: scripts/venv_path)")
  set(_hp_venv ${HP_VENV})
  if(NOT _hp_venv)
    execute_process(COMMAND ${PROJECT_SOURCE_DIR}/scripts/venv_path
                    OUTPUT_VARIABLE _hp_venv OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  endif()
  set(_hp_python ${_hp_venv}/bin/python)
endif()
if(NOT EXISTS ${_hp_python})
  message(FATAL_ERROR "no Python at ${_hp_python}: run scripts/setup, or set HP_VENV to a venv that has torch")
endif()
# Found without importing torch (which takes seconds).
execute_process(
  COMMAND ${_hp_python} -c "import importlib.util as u, importlib.metadata as m; print(u.find_spec('torch').submodule_search_locations[0]); print(m.version('torch'))"
  OUTPUT_VARIABLE _hp_torch_out OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _hp_torch_rc)
if(NOT _hp_torch_rc EQUAL 0)
  message(FATAL_ERROR "${_hp_python} has no torch: run scripts/setup")
endif()
string(REPLACE "\n" ";" _hp_torch_out "${_hp_torch_out}")
list(GET _hp_torch_out 0 HP_TORCH_DIR)
list(GET _hp_torch_out 1 HP_TORCH_VERSION)
if(HP_TORCH_VERSION VERSION_LESS 2.11)
  message(FATAL_ERROR "torch ${HP_TORCH_VERSION} at ${HP_TORCH_DIR}: HyperParallel builds against LibTorch 2.11 or newer")
endif()
set(HP_PYTHON_EXECUTABLE ${_hp_python})  # for tests that compare with Python peers
message(STATUS "LibTorch ${HP_TORCH_VERSION} from ${HP_TORCH_DIR}")

add_library(hp_torch INTERFACE)
if(HP_CUDA)
  # TorchConfig finds these with find_library, which searches the system before the wheel:
  # pinned to the wheel, a system LibTorch (such as Debian's) is never linked instead.
  set(c10_LIBRARY ${HP_TORCH_DIR}/lib/libc10.so CACHE FILEPATH "" FORCE)
  set(C10_CUDA_LIBRARY ${HP_TORCH_DIR}/lib/libc10_cuda.so CACHE FILEPATH "" FORCE)
  set(TORCH_LIBRARY ${HP_TORCH_DIR}/lib/libtorch.so CACHE FILEPATH "" FORCE)
  list(APPEND CMAKE_PREFIX_PATH ${HP_TORCH_DIR}/share/cmake)
  find_package(Torch REQUIRED)
  if(NOT TARGET torch_cuda)
    message(FATAL_ERROR "HP_CUDA: the torch at ${HP_TORCH_DIR} is not a CUDA build")
  endif()
  target_link_libraries(hp_torch INTERFACE ${TORCH_LIBRARIES})
  target_compile_definitions(hp_torch INTERFACE HP_CUDA)
else()
  target_include_directories(hp_torch SYSTEM INTERFACE ${HP_TORCH_DIR}/include
                                                      ${HP_TORCH_DIR}/include/torch/csrc/api/include)
  target_link_libraries(hp_torch INTERFACE ${HP_TORCH_DIR}/lib/libtorch_cpu.so ${HP_TORCH_DIR}/lib/libc10.so)
  target_compile_definitions(hp_torch INTERFACE USE_DISTRIBUTED USE_C10D_GLOO _GLIBCXX_USE_CXX11_ABI=1)
endif()

# The heavy LibTorch headers (src/hp/torch_pch.h), precompiled once for every target that
# uses them (hp_share_torch_pch): about half a GB, and 20 s of one core, each time.
file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/hp_torch_pch.cpp CONTENT "// hp_torch_pch's own translation unit.\n")
add_library(hp_torch_pch OBJECT ${CMAKE_BINARY_DIR}/hp_torch_pch.cpp)
target_link_libraries(hp_torch_pch PUBLIC hp_torch)
target_compile_options(hp_torch_pch PRIVATE -fPIC)
target_precompile_headers(hp_torch_pch PRIVATE ${PROJECT_SOURCE_DIR}/src/hp/torch_pch.h)

# The OpenMP runtime LibTorch's intra-op threads run on (the wheel's own libgomp), for hp
# code whose at::parallel_for must share them (compiled with -fopenmp; see
# src/hp/tensor/CMakeLists.txt): one runtime, so at::set_num_threads governs both.
if(EXISTS ${HP_TORCH_DIR}/lib/libgomp.so.1)
  set(HP_TORCH_OPENMP ${HP_TORCH_DIR}/lib/libgomp.so.1)
else()
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  set(HP_TORCH_OPENMP OpenMP::OpenMP_CXX)
endif()
