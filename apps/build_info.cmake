# Writes build_info.h with the version and the commit the sources were built from (with "-dirty" when
# tracked files differ from it). Run at every build by apps/CMakeLists.txt; the file is rewritten only when
# its text changes, so an unchanged commit recompiles nothing.
# Variables: SOURCE_DIR, OUT (the header), VERSION.
find_package(Git QUIET)
set(commit "")
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(commit)
    execute_process(COMMAND ${GIT_EXECUTABLE} diff --quiet HEAD -- WORKING_DIRECTORY ${SOURCE_DIR}
                    RESULT_VARIABLE changed ERROR_QUIET)
    if(changed EQUAL 1)
      set(commit "${commit}-dirty")
    endif()
  endif()
endif()
set(text "#define TT_VERSION \"${VERSION}\"\n#define TT_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
