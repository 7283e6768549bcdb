# Writes OUTPUT with the commit of SOURCE_DIR and whether the tree was dirty; rewrites the file
# only when it changes so that an unchanged commit triggers no rebuild.
execute_process(COMMAND git -C ${SOURCE_DIR} rev-parse HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(rc EQUAL 0)
  execute_process(COMMAND git -C ${SOURCE_DIR} status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(dirty)
    set(commit "${commit}-dirty")
  endif()
elseif(EXISTS ${SOURCE_DIR}/.deps/git_commit)
  # A copy of the tree without .git (the H200 device call): scripts/prepare_h200.sh wrote it.
  file(STRINGS ${SOURCE_DIR}/.deps/git_commit commit LIMIT_COUNT 1)
else()
  set(commit "unknown")
endif()
set(content "#pragma once\n#define HARNESS_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT "${old}" STREQUAL "${content}")
  file(WRITE ${OUTPUT} "${content}")
endif()
