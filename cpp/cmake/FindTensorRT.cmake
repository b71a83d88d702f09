# FindTensorRT: TensorRT or TensorRT for RTX, from an SDK or from the Python wheels on PyPI.
#
#   list(APPEND CMAKE_MODULE_PATH path/to/trt-otel/cpp/cmake)
#   find_package(TensorRT REQUIRED)
#   target_link_libraries(app PRIVATE TensorRT::nvinfer TensorRT::onnxparser)
#
# Where it looks, first found wins:
#   TensorRT_ROOT           an SDK (include/ and lib/ or lib64/): libnvinfer and libnvonnxparser
#                           (TensorRT) or libtensorrt_rtx and libtensorrt_onnxparser_rtx (RTX).
#   TensorRT_PYTHON         a Python (default: python3 on PATH, so an activated virtual
#                           environment's) whose site-packages hold the libraries' wheel:
#                           tensorrt_rtx_libs (pip install tensorrt-rtx-cu12-libs) or tensorrt_libs.
#                           The wheels have no headers: give TensorRT_INCLUDE_DIR.
# Other inputs:
#   TensorRT_BACKEND        tensorrt-rtx or tensorrt to take only that one (default: either,
#                           TensorRT for RTX first).
#   TensorRT_INCLUDE_DIR    the folder holding NvInfer.h and NvOnnxParser.h (the SDK's include/
#                           by default).
#   TensorRT_CUDA_INCLUDE_DIR  the folder holding cuda_runtime_api.h, which NvInfer.h includes
#                           (default: the nvidia-cuda-runtime wheel beside the libraries, then
#                           the CUDA toolkit).
# Results:
#   TensorRT_FOUND, TensorRT_BACKEND, TensorRT_LIBRARY_DIR (for an rpath),
#   TensorRT_INCLUDE_DIRS, targets TensorRT::nvinfer and TensorRT::onnxparser (the headers
#   come as SYSTEM includes: NVIDIA's headers raise deprecation warnings of their own).
# An application built against the wheels finds them at run time through an rpath to
# TensorRT_LIBRARY_DIR (set BUILD_RPATH/INSTALL_RPATH; the example does).

include(FindPackageHandleStandardArgs)

set(TensorRT_BACKEND "${TensorRT_BACKEND}" CACHE STRING "tensorrt-rtx, tensorrt, or empty for either")
# Typed, so that a relative path given with -D is taken from the folder cmake runs in.
set(TensorRT_ROOT "${TensorRT_ROOT}" CACHE PATH "A TensorRT or TensorRT-RTX SDK")
set(TensorRT_PYTHON "${TensorRT_PYTHON}" CACHE FILEPATH "A Python with the TensorRT-RTX or TensorRT wheels")
set(TensorRT_INCLUDE_DIR "${TensorRT_INCLUDE_DIR}" CACHE PATH "The folder holding NvInfer.h and NvOnnxParser.h")
set(TensorRT_CUDA_INCLUDE_DIR "${TensorRT_CUDA_INCLUDE_DIR}" CACHE PATH "The folder holding cuda_runtime_api.h")
if(TensorRT_BACKEND AND NOT TensorRT_BACKEND MATCHES "^(tensorrt|tensorrt-rtx)$")
    message(FATAL_ERROR "TensorRT_BACKEND is '${TensorRT_BACKEND}': use tensorrt-rtx or tensorrt")
endif()

# name of the backend -> library names: builder, then ONNX parser.
set(_trt_names_tensorrt-rtx tensorrt_rtx tensorrt_onnxparser_rtx)
set(_trt_names_tensorrt nvinfer nvonnxparser)
set(_trt_wheel_tensorrt-rtx tensorrt_rtx_libs)
set(_trt_wheel_tensorrt tensorrt_libs)
if(TensorRT_BACKEND)
    set(_trt_backends ${TensorRT_BACKEND})
else()
    set(_trt_backends tensorrt-rtx tensorrt)
endif()

set(_trt_found_backend "")
set(_trt_library_dir "")

# 1. An SDK.
if(TensorRT_ROOT)
    if(NOT IS_DIRECTORY "${TensorRT_ROOT}")
        message(FATAL_ERROR "TensorRT_ROOT ${TensorRT_ROOT} is not a folder")
    endif()
    foreach(_trt_backend IN LISTS _trt_backends)
        list(GET _trt_names_${_trt_backend} 0 _trt_builder_name)
        find_library(_trt_sdk_${_trt_backend} NAMES ${_trt_builder_name}
            PATHS "${TensorRT_ROOT}" PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
        if(_trt_sdk_${_trt_backend})
            set(_trt_found_backend ${_trt_backend})
            get_filename_component(_trt_library_dir "${_trt_sdk_${_trt_backend}}" DIRECTORY)
            if(NOT TensorRT_INCLUDE_DIR)
                set(TensorRT_INCLUDE_DIR "${TensorRT_ROOT}/include")
            endif()
            break()
        endif()
    endforeach()
endif()

# 2. The Python wheels, asked of the Python they are installed in.
if(NOT _trt_found_backend)
    set(_trt_python "${TensorRT_PYTHON}")
    if(NOT _trt_python)
        find_program(_trt_python_on_path NAMES python3 python)
        set(_trt_python "${_trt_python_on_path}")
    endif()
    if(_trt_python)
        # find_spec: where the package is, without importing it (importing loads the libraries).
        execute_process(
            COMMAND "${_trt_python}" -c [=[
import importlib.util, os, sys
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    print(name + "=" + (os.path.dirname(spec.origin) if spec and spec.origin else ""))
for entry in sys.path:
    for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include"):
        if os.path.isfile(os.path.join(entry, sub, "cuda_runtime_api.h")):
            print("cuda=" + os.path.join(entry, sub))
            raise SystemExit
]=] tensorrt_rtx_libs tensorrt_libs
            OUTPUT_VARIABLE _trt_python_out
            RESULT_VARIABLE _trt_python_rc
            ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(_trt_python_rc EQUAL 0)
            string(REPLACE "\n" ";" _trt_python_lines "${_trt_python_out}")
            foreach(_trt_line IN LISTS _trt_python_lines)
                if(_trt_line MATCHES "^([a-z_]+)=(.*)$")
                    set(_trt_python_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
                endif()
            endforeach()
        endif()
        foreach(_trt_backend IN LISTS _trt_backends)
            set(_trt_folder "${_trt_python_${_trt_wheel_${_trt_backend}}}")
            list(GET _trt_names_${_trt_backend} 0 _trt_builder_name)
            # The wheels hold only versioned files (libtensorrt_rtx.so.1, libnvinfer.so.10).
            file(GLOB _trt_candidates "${_trt_folder}/lib${_trt_builder_name}.so.*")
            if(_trt_folder AND _trt_candidates)
                set(_trt_found_backend ${_trt_backend})
                set(_trt_library_dir "${_trt_folder}")
                break()
            endif()
        endforeach()
        if(NOT TensorRT_CUDA_INCLUDE_DIR AND _trt_python_cuda)
            set(TensorRT_CUDA_INCLUDE_DIR "${_trt_python_cuda}")
        endif()
    endif()
endif()

# The two libraries of the backend found, as imported targets.
set(_trt_libraries "")
if(_trt_found_backend)
    foreach(_trt_index 0 1)
        list(GET _trt_names_${_trt_found_backend} ${_trt_index} _trt_name)
        file(GLOB _trt_files "${_trt_library_dir}/lib${_trt_name}.so" "${_trt_library_dir}/lib${_trt_name}.so.*")
        list(SORT _trt_files)
        set(_trt_file "")
        if(_trt_files)
            # lib.so when there is one (an SDK), else the shortest versioned name (the soname).
            set(_trt_shortest 100000)
            foreach(_trt_candidate IN LISTS _trt_files)
                string(LENGTH "${_trt_candidate}" _trt_length)
                if(_trt_length LESS _trt_shortest)
                    set(_trt_shortest ${_trt_length})
                    set(_trt_file "${_trt_candidate}")
                endif()
            endforeach()
        endif()
        list(APPEND _trt_libraries "${_trt_file}")
    endforeach()
    list(GET _trt_libraries 0 TensorRT_NVINFER_LIBRARY)
    list(GET _trt_libraries 1 TensorRT_ONNXPARSER_LIBRARY)
endif()

if(NOT TensorRT_CUDA_INCLUDE_DIR)
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
        list(GET CUDAToolkit_INCLUDE_DIRS 0 TensorRT_CUDA_INCLUDE_DIR)
    endif()
endif()

find_path(_trt_nvinfer_h NvInfer.h PATHS "${TensorRT_INCLUDE_DIR}" NO_DEFAULT_PATH)
find_path(_trt_parser_h NvOnnxParser.h PATHS "${TensorRT_INCLUDE_DIR}" NO_DEFAULT_PATH)
find_path(_trt_cuda_h cuda_runtime_api.h PATHS "${TensorRT_CUDA_INCLUDE_DIR}" NO_DEFAULT_PATH)

set(TensorRT_BACKEND_FOUND "${_trt_found_backend}")
set(TensorRT_LIBRARY_DIR "${_trt_library_dir}")
find_package_handle_standard_args(TensorRT
    REQUIRED_VARS TensorRT_NVINFER_LIBRARY TensorRT_ONNXPARSER_LIBRARY _trt_nvinfer_h _trt_parser_h _trt_cuda_h
    REASON_FAILURE_MESSAGE
    "give TensorRT_ROOT (an SDK) or TensorRT_PYTHON (a Python with tensorrt-rtx-cu12-libs or tensorrt installed), TensorRT_INCLUDE_DIR (NvInfer.h, NvOnnxParser.h: '${TensorRT_INCLUDE_DIR}') and TensorRT_CUDA_INCLUDE_DIR (cuda_runtime_api.h: '${TensorRT_CUDA_INCLUDE_DIR}')")

if(TensorRT_FOUND)
    set(TensorRT_BACKEND "${_trt_found_backend}")
    set(TensorRT_INCLUDE_DIRS "${TensorRT_INCLUDE_DIR}" "${TensorRT_CUDA_INCLUDE_DIR}")
    if(NOT TARGET TensorRT::nvinfer)
        add_library(TensorRT::nvinfer SHARED IMPORTED)
        set_target_properties(TensorRT::nvinfer PROPERTIES
            IMPORTED_LOCATION "${TensorRT_NVINFER_LIBRARY}"
            INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${TensorRT_INCLUDE_DIRS}"
            INTERFACE_INCLUDE_DIRECTORIES "${TensorRT_INCLUDE_DIRS}")
        add_library(TensorRT::onnxparser SHARED IMPORTED)
        set_target_properties(TensorRT::onnxparser PROPERTIES
            IMPORTED_LOCATION "${TensorRT_ONNXPARSER_LIBRARY}"
            INTERFACE_LINK_LIBRARIES TensorRT::nvinfer)
    endif()
    if(NOT TensorRT_FIND_QUIETLY)
        message(STATUS "TensorRT: ${TensorRT_BACKEND} in ${TensorRT_LIBRARY_DIR}; headers ${TensorRT_INCLUDE_DIR}; CUDA headers ${TensorRT_CUDA_INCLUDE_DIR}")
    endif()
endif()
